"""The store schema holds another system's objects named like the store's own (issue 29 §2).

`migrate` refuses before it creates anything: tables it would fail on, functions
it would silently replace, a ``schema_migrations`` table that is not its ledger.
Its own store, at any migration, is never a conflict.
"""

from __future__ import annotations

import asyncpg
import pytest

from support.runtime import SCHEMA, connect
from worker.db import schema as store_schema
from worker.errors import StoreSchemaConflictError

OTHER = "someone_elses"


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        (
            f"create function {OTHER}.signal_run(p text) returns text language sql"
            " as $$ select p $$",
            "signal_run",
        ),
        (
            f"create table {OTHER}.schema_migrations (version text, dirty boolean)",
            "schema_migrations",
        ),
        (f"create table {OTHER}.workers (id serial)", "workers"),
    ],
    ids=["a-function", "another-ledger", "a-table"],
)
async def test_migrate_refuses_another_systems_object_and_leaves_it(
    empty_database_url: str, ddl: str, named: str
) -> None:
    """Named in the refusal; nothing created, the object as it was."""
    conn = await connect(empty_database_url)
    try:
        await conn.execute(f"create schema {OTHER}; {ddl}")
        with pytest.raises(StoreSchemaConflictError) as refused:
            await store_schema.migrate(conn, OTHER)
        assert refused.value.objects == (named,)
        assert f"the store schema {OTHER} already holds {named}, " in str(refused.value)
        tables = await conn.fetch(
            "select tablename from pg_tables where schemaname = $1 order by 1", OTHER
        )
        functions = await conn.fetch(
            "select proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            " where nspname = $1",
            OTHER,
        )
        created = {r[0] for r in [*tables, *functions]}
        assert created == {named}
    finally:
        await conn.close()


async def test_a_store_of_lane_workers_own_is_no_conflict(database_url: str) -> None:
    """The migrated store (every migration applied) and a re-run of migrate: nothing refused."""
    conn: asyncpg.Connection[asyncpg.Record] = await connect(database_url)
    try:
        assert await store_schema.conflicts(conn, SCHEMA) == []
        report = await store_schema.migrate(conn, SCHEMA)
        assert report.applied == ()
    finally:
        await conn.close()
