"""``LaneClient``'s schema calls: install or upgrade both schemas, or check they are current.

The app's first submit migrates (as lane-worker always did) when its role may; a
role that may not (the app's own, ``lane-worker roles``: issue 33) runs on the
schemas the owner migrated, only on current ones, which it reads through
``schema_versions()`` (store 0043). Every other call checks, installs nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from worker.db import engine_schema, versions
from worker.db.pool import Connection, Database
from worker.db.store import MigrationReport, Store


class SchemaCalls:
    """The schemas' half of ``LaneClient`` (a mixin: the client holds its state)."""

    db: Database
    store: Store
    _schemas_installed: bool
    _ready: dict[str, asyncio.Task[None]]
    _schemas_ready: asyncio.Task[None] | None
    _schemas_checked: asyncio.Task[None] | None

    async def _memoized(self, key: str | None, make: Any) -> None:
        # One in-flight preparation per key and process; a failure is evicted so
        # the next caller tries again (and sees the error itself).
        task = self._schemas_ready if key is None else self._ready.get(key)
        if task is None:
            task = asyncio.ensure_future(make())
            if key is None:
                self._schemas_ready = task
            else:
                self._ready[key] = task
        try:
            await asyncio.shield(task)
        except BaseException:
            if key is None:
                self._schemas_ready = None
            else:
                self._ready.pop(key, None)
            raise

    async def ensure_schemas(self) -> None:
        """Install or upgrade the engine schema and the store (once per process).

        A role that may not (the app's) only checks that the owner has.
        """
        if not self._schemas_installed:
            await self._memoized(None, self._install)

    async def check_schemas(self) -> None:
        """Make sure both schemas are installed and current (once per process); install nothing.

        Raises ``SchemasMissingError`` naming ``lane-worker migrate`` when they are not:
        reading or operating on a database must never change its schemas.
        """
        if self._schemas_installed or self._schemas_ready is not None:
            return
        if self._schemas_checked is None:
            self._schemas_checked = asyncio.ensure_future(self.db.run(self._check_schemas))
        try:
            await asyncio.shield(self._schemas_checked)
        except BaseException:
            self._schemas_checked = None
            raise

    async def _check_schemas(self, conn: Connection) -> None:
        await versions.refuse_unless_current(conn, self.store)

    async def _install(self) -> None:
        try:
            await self.migrate()
        except asyncpg.InsufficientPrivilegeError:
            # A role that may not migrate (the app's: `lane-worker roles`) runs on
            # schemas the owner migrated, current ones only (read as it may).
            await self.db.run(
                lambda c: versions.refuse_unless_current(c, self.store, may_not_migrate=True)
            )

    async def migrate(
        self, *, replace_engine_functions: bool = False
    ) -> tuple[str, MigrationReport]:
        """Install or upgrade the engine schema and the store; say what was done.

        An engine upgrade that would replace a function another system patched is
        refused (``EngineSchemaError``) unless ``replace_engine_functions``.
        """
        # First: a store schema of another system's refuses before anything is made.
        await self.db.run(self.store.refuse_conflicts)
        engine_outcome = await self.db.run(
            lambda c: engine_schema.ensure_engine_schema(
                c, replace_foreign=replace_engine_functions
            )
        )
        return engine_outcome, await self.db.run(self.store.migrate)
