"""Store queries of the ledger relay: claim due facts, record what each delivery came to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import DeliveryBacklog, PendingFact


class LedgerQueries(Queries):
    """The ledger as an outbox (``ledger.delivery``, migration 0009)."""

    FILE = "ledger.sql"

    async def claim(
        self,
        conn: Connection,
        *,
        worker_id: str,
        limit: int,
        lease_s: float,
        skip_endpoints: Sequence[str],
    ) -> list[PendingFact]:
        """Lease up to ``limit`` due facts, each the earliest pending one of its run."""
        return await self._rows(
            conn, PendingFact, "claim_deliveries", worker_id, limit, lease_s, list(skip_endpoints)
        )

    async def done(self, conn: Connection, *, fact_id: int) -> None:
        await self._run(conn, "delivery_done", fact_id)

    async def retry(
        self,
        conn: Connection,
        *,
        fact_id: int,
        worker_id: str,
        in_s: float,
        error: dict[str, Any] | None,
        counts: bool = True,
    ) -> None:
        await self._run(conn, "delivery_retry", fact_id, worker_id, in_s, error, counts)

    async def failed(
        self, conn: Connection, *, fact_id: int, worker_id: str, error: dict[str, Any]
    ) -> None:
        await self._run(conn, "delivery_failed", fact_id, worker_id, error)

    async def release(self, conn: Connection, *, worker_id: str, fact_ids: Sequence[int]) -> None:
        await self._run(conn, "release_deliveries", worker_id, list(fact_ids))

    async def backlog(self, conn: Connection) -> DeliveryBacklog:
        row = await self._row(conn, DeliveryBacklog, "delivery_backlog")
        assert row is not None  # an aggregate always returns one row
        return row
