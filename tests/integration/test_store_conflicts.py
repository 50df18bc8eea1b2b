"""The store schema holds another system's objects named like the store's own (issue 29 §2).

`migrate` refuses before it creates anything: tables it would fail on, functions
it would silently replace, types a table's row type would clash with, objects it
creates `if not exists` (it would use another system's), a ``schema_migrations``
table that is not its ledger. Its own store, at any migration, is never a conflict.
"""

from __future__ import annotations

import asyncpg
import pytest

from support.runtime import SCHEMA, connect
from worker.db import schema as store_schema
from worker.errors import StoreSchemaConflictError

OTHER = "someone_elses"


async def objects_in(conn: asyncpg.Connection[asyncpg.Record], schema: str) -> list[str]:
    """Every relation, function and type in ``schema``, by kind and name."""
    rows = await conn.fetch(
        "select 'relation ' || relname from pg_class c join pg_namespace n"
        " on n.oid = c.relnamespace where nspname = $1"
        " union select 'function ' || proname from pg_proc p join pg_namespace n"
        " on n.oid = p.pronamespace where nspname = $1"
        " union select 'type ' || typname from pg_type t join pg_namespace n"
        " on n.oid = t.typnamespace where nspname = $1 order by 1",
        schema,
    )
    return [r[0] for r in rows]


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
        # The review's case (issue 29): `type "ledger" already exists` was the raw answer.
        # The enum is named like no object of the store: not a conflict.
        (
            f"create type {OTHER}.lanes as enum ('a'); create domain {OTHER}.ledger as text",
            "domain ledger",
        ),
        (f"create type {OTHER}.workers as enum ('a')", "enum type workers"),
        (f"create type {OTHER}.runs as (id text)", "composite type runs"),
        (f"create type {OTHER}.signals as range (subtype = int)", "range type signals"),
        # Created `if not exists` by the store: another system's would be used as its own.
        (f"create table {OTHER}.run_runtime_api (run_id text)", "run_runtime_api"),
        (
            f"create table {OTHER}.jobs (queue text); create index runs_queue_idx"
            f" on {OTHER}.jobs (queue)",
            "runs_queue_idx",
        ),
    ],
    ids=[
        "a-function", "another-ledger", "a-table", "a-domain", "an-enum", "a-composite-type",
        "a-range-type", "an-if-not-exists-table", "an-if-not-exists-index",
    ],
)  # fmt: skip
async def test_migrate_refuses_another_systems_object_and_leaves_it(
    empty_database_url: str, ddl: str, named: str
) -> None:
    """Named in the refusal; nothing created, the object as it was."""
    conn = await connect(empty_database_url)
    try:
        await conn.execute(f"create schema {OTHER}; {ddl}")
        before = await objects_in(conn, OTHER)
        with pytest.raises(StoreSchemaConflictError) as refused:
            await store_schema.migrate(conn, OTHER)
        assert refused.value.objects == (named,)
        assert f"the store schema {OTHER} already holds {named}, " in str(refused.value)
        assert "already exists" not in str(refused.value)
        assert await objects_in(conn, OTHER) == before
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


async def test_types_named_like_no_table_of_the_store_are_left_alone(
    empty_database_url: str,
) -> None:
    """An index has no row type: an enum named like one is no conflict, nor one named otherwise."""
    conn = await connect(empty_database_url)
    try:
        await conn.execute(
            f"create schema {OTHER}; create type {OTHER}.runs_queue_idx as enum ('a');"
            f" create type {OTHER}.lanes as enum ('b')"
        )
        assert await store_schema.conflicts(conn, OTHER) == []
        report = await store_schema.migrate(conn, OTHER)
        assert report.applied
        kept = await conn.fetch(
            "select enum_range(null::someone_elses.runs_queue_idx)::text,"
            " enum_range(null::someone_elses.lanes)::text"
        )
        assert tuple(kept[0]) == ("{a}", "{b}")
    finally:
        await conn.close()
