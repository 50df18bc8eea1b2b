"""The run-state store: launch rows, attempts, signals, the ledger and the lane registry.

Lives in the schema ``DEEPLINE_RUNTIME_SCHEDULER_SCHEMA`` of the engine's
database, so a store write and the engine transition it goes with commit in
one transaction: every query takes the connection to run on. One typed
method per query, grouped by what it reads: ``store.runs``, ``store.attempts``,
``store.lanes``, ``store.report``, ``store.api`` (the app's SQL API),
``store.ledger`` (the delivery outbox), ``store.sandboxes`` (sandbox cleanup) and
``store.registry`` (releases and the scaler) and ``store.page`` (the operator page's
audit trail), each with its file of SQL in
``worker/sql/store/`` (``runs.sql``, ...); the schema's migrations are
``worker/db/schema.py``.
"""

from __future__ import annotations

from worker.db import schema as _schema
from worker.db.pool import Connection
from worker.db.schema import MigrationReport
from worker.db.sql import quote_ident
from worker.db.store.api import ApiQueries
from worker.db.store.attempts import AttemptQueries
from worker.db.store.lanes import LaneQueries
from worker.db.store.ledger import LedgerQueries
from worker.db.store.page import PageQueries
from worker.db.store.registry import RegistryQueries
from worker.db.store.report import ReportQueries
from worker.db.store.runs import RunQueries
from worker.db.store.sandboxes import SandboxQueries

__all__ = ["MigrationReport", "Store", "quote_ident"]


class Store:
    """The store's queries, bound to one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.schema_sql = quote_ident(schema)
        self.runs = RunQueries(schema)
        self.attempts = AttemptQueries(schema)
        self.lanes = LaneQueries(schema)
        self.report = ReportQueries(schema)
        self.api = ApiQueries(schema)
        self.ledger = LedgerQueries(schema)
        self.sandboxes = SandboxQueries(schema)
        self.registry = RegistryQueries(schema)
        self.page = PageQueries(schema)
        # Every store query by name (an EXPLAIN in the tests; the calls kept below).
        self.q = {
            **self.runs.sql,
            **self.attempts.sql,
            **self.lanes.sql,
            **self.report.sql,
            **self.api.sql,
            **self.ledger.sql,
            **self.sandboxes.sql,
            **self.registry.sql,
            **self.page.sql,
        }

    async def migrate(self, conn: Connection) -> MigrationReport:
        """Apply this build's missing store migrations (see ``worker/db/schema.py``)."""
        return await _schema.migrate(conn, self.schema)

    async def refuse_conflicts(self, conn: Connection) -> None:
        """Refuse a store schema holding another system's objects named like the store's."""
        await _schema.refuse_conflicts(conn, self.schema)

    async def is_current(self, conn: Connection) -> bool:
        """Tell whether every store migration of this build is applied; change nothing."""
        return await _schema.is_current(conn, self.schema)
