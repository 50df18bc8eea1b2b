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

from worker.db import role_grants
from worker.db.pool import Connection
from worker.db.sql import fill, query, quote_ident, sql_files
from worker.errors import StoreSchemaConflictError, StoreSchemaError

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
    # The role prefixes whose grants were made again (worker/db/role_grants.py).
    regranted: tuple[str, ...] = ()


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
        # Before anything is created: another system's objects there refuse it all.
        await refuse_conflicts(conn, schema)
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
        # What these migrations added, granted to the roles `roles --apply` made.
        regranted = await role_grants.regrant(conn, schema) if done else ()
    if unknown:
        log.warning(
            "store.newer_compatible_migrations", schema=schema, unknown=unknown, known=newest_known
        )
    return MigrationReport(
        applied=tuple(done),
        current=max([newest_known, *unknown]),
        unknown_compatible=tuple(unknown),
        regranted=regranted,
    )


async def is_current(conn: Connection, schema: str) -> bool:
    """Tell whether every migration of this build is applied; change nothing.

    Raises ``StoreSchemaError`` when the store holds a migration this build
    cannot run against, as ``migrate`` would.
    """
    ledger = f"{quote_ident(schema)}.schema_migrations"
    if not await conn.fetchval(_sql("ledger_exists", schema), ledger):
        return False
    return current_among(schema, await _applied(conn, schema))


def current_among(schema: str, applied: dict[int, tuple[str, bool]]) -> bool:
    """Tell whether ``applied`` (version: name, compatible) holds every migration of this
    build; raise ``StoreSchemaError`` for one it cannot run against (``is_current``)."""
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


# -- another system's objects in the store schema ---------------------------------------

_LEDGER_TABLE = "schema_migrations"
_LEDGER_COLUMNS = frozenset({"version", "name", "compatible", "applied_at"})
# What a migration creates by name, `if not exists` ones too: conflicts are only looked
# for in a schema where no migration of the store was applied, and there an object
# of that name is not the store's (its tables come in the same transaction), so
# skipping it would leave lane-worker using another system's table or index.
_CREATED = re.compile(
    r"create\s+(?:or\s+replace\s+)?(?:unique\s+)?"
    r"(?P<kind>table|index|view|sequence|function|type|domain)\s+"
    r"(?:if\s+not\s+exists\s+)?(?:\{schema\}\.)?(?P<name>\w+)",
    re.IGNORECASE,
)
# What each kind is to the conflict check: relations with a row type (whose name no
# type of the schema may have), indexes (a relation name, no type), functions, types.
_KINDS = {
    "table": "relation",
    "view": "relation",
    "sequence": "relation",
    "index": "index",
    "function": "function",
    "type": "type",
    "domain": "type",
}
_CONFLICTS_SHOWN = 6
STORE_SCHEMA_VARIABLE = "LANE_WORKER_STORE_SCHEMA"


def created_by(migration: Migration) -> frozenset[tuple[str, str]]:
    """Return the (kind, name) of every object ``migration`` creates in the store schema."""
    return frozenset(
        (_KINDS[match["kind"].lower()], match["name"].lower())
        for match in _CREATED.finditer(migration.sql)
    )


async def conflicts(conn: Connection, schema: str) -> list[str]:
    """Name the objects in ``schema`` that this build's migrations would collide with.

    In a schema lane-worker's store does not hold yet, an object a migration creates
    (a table, index, view, sequence, function or type) that exists already belongs
    to someone else: creating it would fail (a table), silently replace it (a
    function) or be skipped (``if not exists``). So does a type (an enum, a domain,
    a composite or range type) named like a table, view, sequence or type the
    migrations create: the type a table brings has its name. So does a
    ``schema_migrations`` table that is not the store's. Types are named with their
    kind ("domain ledger"), the rest by name alone.
    """
    ledger = await conn.fetch(_sql("ledger_columns", schema), schema, _LEDGER_TABLE)
    columns = {r["column_name"] for r in ledger}
    if columns and not columns >= _LEDGER_COLUMNS:
        return [_LEDGER_TABLE]
    applied = await _applied(conn, schema) if columns else {}
    if applied:
        # A store lane-worker already migrated: what its objects are is the history's
        # word, not this build's files (an early build's 0008 created run_status, which
        # 0009 creates now), and another system's same-named object would have met
        # that first migrate. Older builds beside this one migrate here (issue 29).
        return []
    wanted: set[tuple[str, str]] = set()
    for migration in known_migrations():
        wanted.update(created_by(migration))
    rows = await conn.fetch(
        _sql("existing_objects", schema),
        schema,
        sorted(n for k, n in wanted if k in ("relation", "index")),
        sorted(n for k, n in wanted if k == "function"),
        sorted(n for k, n in wanted if k in ("relation", "type")),
    )
    named = {(r["name"], f"{r['kind']} {r['name']}" if r["kind"] else r["name"]) for r in rows}
    return [shown for _, shown in sorted(named)]


async def refuse_conflicts(conn: Connection, schema: str) -> None:
    """Raise ``StoreSchemaConflictError`` when ``schema`` holds another system's objects."""
    found = await conflicts(conn, schema)
    if not found:
        return
    shown = ", ".join(found[:_CONFLICTS_SHOWN])
    more = f" and {len(found) - _CONFLICTS_SHOWN} more" if len(found) > _CONFLICTS_SHOWN else ""
    raise StoreSchemaConflictError(
        f"the store schema {schema} already holds {shown}{more}, which lane-worker's store did "
        "not create (another system's, such as the TypeScript app's run-state store), so "
        f"nothing was created there: set {STORE_SCHEMA_VARIABLE} to a schema of lane-worker's "
        "own (for example lane_worker_store; the lanes still follow "
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA) and run `lane-worker migrate` again.",
        schema=schema,
        objects=tuple(found),
    )
