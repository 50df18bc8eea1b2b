"""Process-backend machines as a test sees them: the store's own, and cleaned up after.

The scaler marks each machine it creates with its store's id (migration 0013)
and lists only those; a test reads the same id to list what the scaler made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from support.db import sql
from support.runtime import SCHEMA
from worker.scaler.backend import STORE_METADATA
from worker.scaler.process import ProcessBackend


async def store_backend(
    database_url: str, state_dir: Path, env: Mapping[str, str] | None = None
) -> ProcessBackend:
    """A process backend on ``state_dir`` for the (migrated) store of ``database_url``."""
    backend = ProcessBackend(state_dir, os.environ if env is None else env)
    backend.store_id = await sql(database_url, f"select {SCHEMA}.store_id()")
    return backend


def _stores(state_dir: Path) -> set[str]:
    stores = set()
    for path in state_dir.glob("*.json"):
        try:
            stores.add(str(json.loads(path.read_text()).get(STORE_METADATA)))
        except (OSError, ValueError, AttributeError):
            continue
    return stores


async def destroy_all(state_dir: Path) -> None:
    """Kill and remove every machine recorded in ``state_dir``, whatever store made it."""
    for store_id in _stores(state_dir):
        backend = ProcessBackend(state_dir, os.environ)
        backend.store_id = store_id
        for m in await backend.list():
            await backend.destroy(m)
