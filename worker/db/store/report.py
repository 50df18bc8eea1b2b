"""Store queries of the drain report: wide rows, read by name in ``worker/ops/report.py``."""

from __future__ import annotations

import asyncpg

from worker.db.pool import Connection
from worker.db.store.base import Queries

Row = asyncpg.Record


class ReportQueries(Queries):
    """The three reads of one drain report (one repeatable-read snapshot)."""

    async def lanes(self, conn: Connection) -> list[Row]:
        return await self._records(conn, "report_lanes")

    async def runs(self, conn: Connection) -> list[Row]:
        return await self._records(conn, "report_runs")

    async def adopted(self, conn: Connection) -> list[Row]:
        return await self._records(conn, "report_adopted")
