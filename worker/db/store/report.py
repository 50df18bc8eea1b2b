"""Store queries of the drain report, read by ``worker/ops/report.py`` in one snapshot."""

from __future__ import annotations

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import AdoptedCount, DeliveryCount, OpenRun, ReportLane, ReportRuns


class ReportQueries(Queries):
    """The reads of one drain report (one repeatable-read snapshot)."""

    FILE = "report.sql"

    async def lanes(self, conn: Connection) -> list[ReportLane]:
        """Every registered lane with its live workers, in registration order."""
        return await self._rows(conn, ReportLane, "report_lanes")

    async def runs(self, conn: Connection) -> list[ReportRuns]:
        """The open runs, grouped by effective lane, bucket and whether only it may run them."""
        return await self._rows(conn, ReportRuns, "report_runs")

    async def open_runs(self, conn: Connection, *, lanes: list[str], limit: int) -> list[OpenRun]:
        """The newest ``limit`` open runs of each effective lane in ``lanes``, newest first."""
        return await self._rows(conn, OpenRun, "report_open_runs", lanes, limit)

    async def adopted(self, conn: Connection) -> list[AdoptedCount]:
        """Open runs adopted away from their stamped lane, per (stamped lane, adopter)."""
        return await self._rows(conn, AdoptedCount, "report_adopted")

    async def foreign_tasks(self, conn: Connection, *, queues: list[str]) -> dict[str, int]:
        """Unfinished engine tasks this store did not create, per queue of ``queues`` with any."""
        rows = await self._records(conn, "report_foreign_tasks", queues)
        return {r["queue"]: r["foreign_tasks"] for r in rows}

    async def deliveries(self, conn: Connection) -> list[DeliveryCount]:
        """Ledger facts not delivered to a runtime API, per stamped lane (pending, failed)."""
        return await self._rows(conn, DeliveryCount, "report_deliveries")
