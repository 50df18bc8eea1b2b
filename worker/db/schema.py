"""The run-state store's schema: its numbered migrations, applied once, in order.

Migrations are additive: an older build keeps running against a newer store,
unless a migration says otherwise on a line of its own (``-- lane-worker:
incompatible``), in which case older builds refuse to start against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import structlog

from worker.db.pool import Connection
from worker.db.sql import fill, query, quote_ident, sql_files
from worker.errors import StoreSchemaError

log = structlog.get_logger("lane_worker.store")

_MIGRATION_FILE = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")
_INCOMPATIBLE_MARK = "-- lane-worker: incompatible"
_LEDGER_FILE = "migrations.sql"  # the queries that keep the ledger of applied migrations


def _sql(name: str, schema: str) -> str:
    return query("store", _LEDGER_FILE, name, schema=schema)


@dataclass(frozen=True)
class Migration:
    """One numbered store migration shipped with this build."""

    version: int
    name: str
    sql: str
    compatible: bool


@dataclass(frozen=True)
class MigrationReport:
    """What ``migrate`` did."""

    applied: tuple[int, ...]
    current: int
    unknown_compatible: tuple[int, ...]


def known_migrations() -> list[Migration]:
    """Return this build's store migrations in order."""
    return list(_read_migrations())


@cache
def _read_migrations() -> tuple[Migration, ...]:
    found = []
    for entry in sql_files("store").iterdir():
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
    return tuple(sorted(found, key=lambda m: m.version))


async def migrate(conn: Connection, schema: str) -> MigrationReport:
    """Apply this build's missing migrations in one transaction under an advisory lock.

    Refuses (``StoreSchemaError``) when the store holds a migration this build
    does not know and that migration is not marked compatible with older builds.
    """
    known = known_migrations()
    newest_known = known[-1].version if known else 0
    async with conn.transaction():
        await conn.execute(_sql("lock", schema), schema)
        await conn.execute(_sql("create_schema", schema))
        await conn.execute(_sql("create_ledger", schema))
        applied = await _applied(conn, schema)
        unknown = _check_unknown(schema, applied, newest_known)
        done = []
        for migration in known:
            if migration.version in applied:
                continue
            await conn.execute(fill(migration.sql, schema=schema))
            await conn.execute(
                _sql("record", schema), migration.version, migration.name, migration.compatible
            )
            done.append(migration.version)
    if unknown:
        log.warning(
            "store.newer_compatible_migrations", schema=schema, unknown=unknown, known=newest_known
        )
    return MigrationReport(
        applied=tuple(done),
        current=max([newest_known, *unknown]),
        unknown_compatible=tuple(unknown),
    )


async def is_current(conn: Connection, schema: str) -> bool:
    """Tell whether every migration of this build is applied; change nothing.

    Raises ``StoreSchemaError`` when the store holds a migration this build
    cannot run against, as ``migrate`` would.
    """
    ledger = f"{quote_ident(schema)}.schema_migrations"
    if not await conn.fetchval(_sql("ledger_exists", schema), ledger):
        return False
    applied = await _applied(conn, schema)
    known = known_migrations()
    _check_unknown(schema, applied, known[-1].version if known else 0)
    return all(m.version in applied for m in known)


async def _applied(conn: Connection, schema: str) -> dict[int, tuple[str, bool]]:
    rows = await conn.fetch(_sql("applied", schema))
    return {r["version"]: (r["name"], r["compatible"]) for r in rows}


def _check_unknown(
    schema: str, applied: dict[int, tuple[str, bool]], newest_known: int
) -> list[int]:
    """Return the applied migrations newer than this build; refuse an incompatible one."""
    unknown = sorted(v for v in applied if v > newest_known)
    for version in unknown:
        name, compatible = applied[version]
        if not compatible:
            raise StoreSchemaError(
                f"the run-state store {schema} has migration {version:04d} ({name}), which "
                f"this build (store version {newest_known:04d}) does not know and which older "
                "builds cannot run against; deploy a newer lane-worker.",
                found=version,
                known=newest_known,
            )
    return unknown
