"""The run-state store: launch rows, attempts, signals, the ledger and the lane registry.

Lives in the schema ``DEEPLINE_RUNTIME_SCHEDULER_SCHEMA`` of the engine's
database, so a store write and the engine transition it goes with commit in
one transaction: every method takes the connection to run on.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import Any

import asyncpg
import structlog

from worker.db.pool import Connection
from worker.errors import StoreSchemaError

log = structlog.get_logger("lane_worker.store")

_MIGRATION_FILE = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")
_QUERY_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# A migration that older builds cannot run against says so on a line of its own.
_INCOMPATIBLE_MARK = "-- lane-worker: incompatible"


def quote_ident(name: str) -> str:
    """Quote a Postgres identifier (the one place lane-worker builds identifiers by hand)."""
    if not name or "\x00" in name:
        raise ValueError(f"not a usable identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def _store_files() -> Any:
    return resources.files("worker.sql").joinpath("store")


@dataclass(frozen=True)
class Migration:
    """One numbered store migration shipped with this build."""

    version: int
    name: str
    sql: str
    compatible: bool


def known_migrations() -> list[Migration]:
    """Return this build's store migrations in order."""
    found = []
    for entry in _store_files().iterdir():
        match = _MIGRATION_FILE.fullmatch(entry.name)
        if match:
            sql = entry.read_text(encoding="utf-8")
            found.append(
                Migration(
                    version=int(match["version"]),
                    name=match["name"],
                    sql=sql,
                    compatible=_INCOMPATIBLE_MARK not in sql,
                )
            )
    return sorted(found, key=lambda m: m.version)


def _load_queries(schema_sql: str) -> dict[str, str]:
    text = _store_files().joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _QUERY_HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {
        name: body.strip().replace("{schema}", schema_sql)
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


@dataclass(frozen=True)
class MigrationReport:
    """What ``Store.migrate`` did."""

    applied: tuple[int, ...]
    current: int
    unknown_compatible: tuple[int, ...]


class Store:
    """Store queries bound to one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.schema_sql = quote_ident(schema)
        self.q = _load_queries(self.schema_sql)

    async def migrate(self, conn: Connection) -> MigrationReport:
        """Apply this build's missing migrations in one transaction under an advisory lock.

        Refuses (``StoreSchemaError``) when the store holds a migration this build
        does not know and that migration is not marked compatible with older builds.
        """
        known = known_migrations()
        async with conn.transaction():
            await conn.execute(
                "select pg_advisory_xact_lock(hashtext('lane_worker.store:' || $1))", self.schema
            )
            await conn.execute(f"create schema if not exists {self.schema_sql}")
            await conn.execute(
                f"create table if not exists {self.schema_sql}.schema_migrations ("
                " version integer primary key, name text not null,"
                " compatible boolean not null default true,"
                " applied_at timestamptz not null default now())"
            )
            rows = await conn.fetch(
                f"select version, name, compatible from {self.schema_sql}.schema_migrations"
            )
            applied = {r["version"]: r for r in rows}
            newest_known = known[-1].version if known else 0
            unknown = sorted(v for v in applied if v > newest_known)
            blocking = [v for v in unknown if not applied[v]["compatible"]]
            if blocking:
                raise self._incompatible(blocking[0], applied[blocking[0]]["name"], newest_known)
            done = []
            for migration in known:
                if migration.version in applied:
                    continue
                await conn.execute(migration.sql.replace("{schema}", self.schema_sql))
                await conn.execute(
                    f"insert into {self.schema_sql}.schema_migrations (version, name, compatible)"
                    " values ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.compatible,
                )
                done.append(migration.version)
        if unknown:
            log.warning(
                "store.newer_compatible_migrations",
                schema=self.schema,
                unknown=unknown,
                known=newest_known,
            )
        return MigrationReport(
            applied=tuple(done),
            current=max([newest_known, *unknown]),
            unknown_compatible=tuple(unknown),
        )

    async def is_current(self, conn: Connection) -> bool:
        """Tell whether every migration of this build is applied; change nothing.

        Raises ``StoreSchemaError`` when the store holds a migration this build
        cannot run against, as ``migrate`` would.
        """
        table = f"{self.schema_sql}.schema_migrations"
        if not await conn.fetchval("select to_regclass($1) is not null", table):
            return False
        rows = await conn.fetch(f"select version, name, compatible from {table}")
        applied = {r["version"]: r for r in rows}
        known = known_migrations()
        newest_known = known[-1].version if known else 0
        for version in sorted(v for v in applied if v > newest_known):
            if not applied[version]["compatible"]:
                raise self._incompatible(version, applied[version]["name"], newest_known)
        return all(m.version in applied for m in known)

    def _incompatible(self, version: int, name: str, newest_known: int) -> StoreSchemaError:
        return StoreSchemaError(
            f"the run-state store {self.schema} has migration {version:04d} ({name}), which "
            f"this build (store version {newest_known:04d}) does not know and which older "
            "builds cannot run against; deploy a newer lane-worker.",
            found=version,
            known=newest_known,
        )

    async def fetchrow(self, conn: Connection, name: str, *args: Any) -> asyncpg.Record | None:
        """Run named query ``name`` and return its first row."""
        return await conn.fetchrow(self.q[name], *args)

    async def fetch(self, conn: Connection, name: str, *args: Any) -> list[asyncpg.Record]:
        """Run named query ``name`` and return its rows."""
        return await conn.fetch(self.q[name], *args)

    async def fetchval(self, conn: Connection, name: str, *args: Any) -> Any:
        """Run named query ``name`` and return its first value."""
        return await conn.fetchval(self.q[name], *args)

    async def execute(self, conn: Connection, name: str, *args: Any) -> str:
        """Run named query ``name`` for its effect."""
        return await conn.execute(self.q[name], *args)

    async def settle(
        self,
        conn: Connection,
        run_id: uuid.UUID,
        *,
        status: str,
        fact: dict[str, Any],
        attempt_id: int | None,
        output: Any = None,
        error: Any = None,
        own_attempt_id: int | None = None,
    ) -> bool:
        """Move a run to a terminal status and append its one terminal fact.

        Returns False (and writes nothing) when the fence does not match or the
        run is already terminal: whoever settled it first wrote the fact. The
        run's other attempts that recorded no end are closed as lost leases
        (see settle_run), except ``own_attempt_id``, which the caller ends.
        """
        settled = await self.fetchval(
            conn, "settle_run", run_id, attempt_id, status, output, error, fact["type"], fact,
            own_attempt_id,
        )  # fmt: skip
        return settled is not None
