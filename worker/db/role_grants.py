"""``migrate`` keeps the roles' grants (issue 33): a later migration's functions and tables.

``lane-worker roles --apply`` records its prefix in the store (``role_templates``,
store 0043). A migration that adds a function or a table leaves those roles
without it (an app role could not call a new API function; the worker's
``on all tables`` grants were taken once). So after ``migrate`` applied any
migration, the grants of every recorded prefix whose roles still exist are made
again, in the migration's transaction (each prefix in a savepoint: one that
fails is logged, ``roles.regrant_failed``, and leaves the migration as it is).
The migrator's (a membership of the owner) is left: nothing a migration adds
changes it, and re-granting a membership needs rights a migrating owner may lack.
"""

from __future__ import annotations

import asyncpg
import structlog

from worker.db import roles
from worker.db.pool import Connection
from worker.db.sql import quote_ident

log = structlog.get_logger("lane_worker.store")

_REGRANTED = ("app", "viewer", "scaler", "worker")


async def record(conn: Connection, schema: str, prefix: str) -> bool:
    """Record ``prefix``'s roles as the store's (``roles --apply``); False before 0043."""
    table = f"{quote_ident(schema)}.role_templates"
    if not await conn.fetchval("select to_regclass($1) is not null", table):
        return False
    await conn.execute(
        f"insert into {table} (prefix) values ($1) on conflict (prefix) do nothing", prefix
    )
    return True


async def regrant(conn: Connection, schema: str) -> tuple[str, ...]:
    """Grant the recorded roles what ``roles`` grants them now; return the prefixes done."""
    table = f"{quote_ident(schema)}.role_templates"
    if not await conn.fetchval("select to_regclass($1) is not null", table):
        return ()
    done = []
    for row in await conn.fetch(f"select prefix from {table} order by prefix"):
        prefix = row["prefix"]
        try:
            names = [roles.role_name(prefix, job) for job in _REGRANTED]
        except ValueError:
            continue  # not a prefix `roles` would make: written by hand
        present = await conn.fetchval(
            "select count(*) from pg_catalog.pg_roles where rolname = any($1::text[])", names
        )
        if present != len(names):
            continue  # dropped (or never made here): nothing to keep
        try:
            async with conn.transaction():
                for plan in roles.plans(schema, prefix):
                    if plan.job in _REGRANTED:
                        for statement in plan.statements[1:]:  # [0] makes the role: it exists
                            await conn.execute(statement)
        except asyncpg.PostgresError as exc:
            log.warning(
                "roles.regrant_failed",
                schema=schema,
                prefix=prefix,
                error=f"{type(exc).__name__}: {exc}",
                hint=f"run `lane-worker roles --prefix {prefix} --apply` as the store's owner",
            )
            continue
        done.append(prefix)
    if done:
        log.info("roles.regranted", schema=schema, prefixes=done)
    return tuple(done)
