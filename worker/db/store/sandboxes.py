"""Store queries of sandbox cleanup: the sandboxes a run registered, and their cleanup."""

from __future__ import annotations

import uuid
from typing import Any

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import CleanupCount


class SandboxQueries(Queries):
    """``run_sandboxes`` (migration 0011)."""

    FILE = "sandboxes.sql"

    async def register(self, conn: Connection, *, run_id: uuid.UUID, sandbox_id: str) -> bool:
        """Record a sandbox of the run; False when it was recorded already."""
        return bool(await self._value(conn, "register_sandbox", run_id, sandbox_id))

    async def done(self, conn: Connection, *, run_id: uuid.UUID, sandbox_id: str) -> None:
        await self._run(conn, "cleanup_done", run_id, sandbox_id)

    async def failed_try(
        self,
        conn: Connection,
        *,
        run_id: uuid.UUID,
        sandbox_id: str,
        error: dict[str, Any],
        last: bool,
    ) -> None:
        await self._run(conn, "cleanup_failed_try", run_id, sandbox_id, error, last)

    async def counts(self, conn: Connection) -> list[CleanupCount]:
        """Pending and given-up cleanups per lane queue."""
        return await self._rows(conn, CleanupCount, "cleanup_counts")
