"""Engine-side contracts: each build installs and calls its own versioned objects.

An older build's install re-creates the unversioned ``lane_worker`` functions and
the ``lane_worker_runnable`` trigger with its own bodies on every boot; these
tests stand in for it with functions of the same names that refuse every call
(as an older build's ``lane_filter`` refused mode 'all'), and check that this
build neither calls nor replaces them, and that a contract a newer lane-worker
version installed is left as it is. tests/e2e/test_older_builds.py runs the
real older builds.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from support.runtime import connect
from worker.db import engine, engine_schema
from worker.db.store import Store
from worker.version import VERSION

SCHEMA = "runtime_scheduler"
QUEUE = "runs_contracts"
# What an older build owns: its names, and a body that makes every call fail
# the way a third build's install once made the second's claims fail.
OLDER_BUILD_SQL = """
create schema if not exists lane_worker;
create or replace function lane_worker.lane_filter(
  p_mode text, p_store_schema text, p_queue_name text, p_own_param text, p_plays_param text)
  returns text language plpgsql as $$
begin
  raise exception 'lane_worker: unknown claim mode "%"', p_mode using errcode = '22023';
end $$;
create or replace function lane_worker.notify_runnable() returns trigger language plpgsql as $$
begin
  perform pg_notify('older_build_notified', tg_argv[0]);
  return null;
end $$;
"""


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    c = await connect(database_url)
    await engine_schema.ensure_engine_schema(c)
    await Store(SCHEMA).migrate(c)
    await engine.ensure_queue(c, QUEUE, record=None)
    yield c
    await c.close()


async def definition(c: asyncpg.Connection[asyncpg.Record], signature: str) -> str:
    """Return a function's full definition, as the catalog holds it."""
    text: str = await c.fetchval("select pg_get_functiondef($1::regprocedure)", signature)
    return text


async def submit_one(c: asyncpg.Connection[asyncpg.Record]) -> uuid.UUID:
    """Spawn one run with its store row on QUEUE; return its engine task id."""
    task_id: uuid.UUID = await c.fetchval(
        "select task_id from absurd.spawn_task($1, 'play-run', '{}'::jsonb, '{}'::jsonb)", QUEUE
    )
    await c.execute(
        f"insert into {SCHEMA}.runs (run_id, play, input, launch, release_id, queue, task_id,"
        " max_attempts) values ($1, 'p', '{}', '{}', 'rel', $2, $3, 5)",
        uuid.uuid4(),
        QUEUE,
        task_id,
    )
    return task_id


async def test_an_older_builds_install_leaves_this_builds_claims_working(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """An older build booting after this one replaces only its own objects; claims still work."""
    await conn.execute(OLDER_BUILD_SQL)  # it boots after this build installed
    task_id = await submit_one(conn)
    batch = await engine.claim(
        conn, QUEUE, "w1", lease_s=30, qty=4, store_schema=SCHEMA, own_queue=QUEUE,
        plays=["p"], with_lanes=True,
    )  # fmt: skip
    assert [r.task_id for r in batch.runs] == [task_id]
    assert await engine.next_due_in_s(
        conn, QUEUE, mode=engine.CLAIM_OWN, store_schema=SCHEMA, own_queue=QUEUE, plays=["p"]
    ) == pytest.approx(30, abs=5)  # the lease end of the run just claimed


async def test_this_builds_install_never_replaces_an_older_builds_objects(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The older build's functions keep their own bodies after this build installs."""
    await conn.execute(OLDER_BUILD_SQL)
    signature = "lane_worker.lane_filter(text, text, text, text, text)"
    before = await definition(conn, signature)
    await engine_schema.ensure_engine_schema(conn)
    assert await definition(conn, signature) == before


async def test_each_builds_trigger_stays_beside_the_other(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """An older build's trigger and this build's coexist on one queue table; neither is dropped."""
    await conn.execute(OLDER_BUILD_SQL)
    await conn.execute(
        f"create trigger lane_worker_runnable after insert or update on absurd.r_{QUEUE}"
        " for each row when (new.state in ('pending', 'sleeping'))"
        " execute function lane_worker.notify_runnable('older')"
    )
    assert await engine.watch_queue(conn, QUEUE) is True
    assert await engine.watch_queue(conn, QUEUE) is False  # installed once
    await engine_schema.ensure_engine_schema(conn)
    triggers = await conn.fetch(
        "select tgname from pg_trigger where tgrelid = $1::regclass and not tgisinternal"
        " order by tgname",
        f"absurd.r_{QUEUE}",
    )
    assert [t["tgname"] for t in triggers] == ["lane_worker_runnable", "lane_worker_runnable_v1"]


@pytest.mark.parametrize(
    ("installed_by", "replaced"),
    [("99.0.0", False), ("0.1.0", True), (VERSION, True)],
    ids=["newer version: left", "older version: replaced", "same version, other text: replaced"],
)
async def test_a_contract_is_replaced_only_by_a_version_not_older_than_its_installer(
    conn: asyncpg.Connection[asyncpg.Record], installed_by: str, replaced: bool
) -> None:
    """A newer lane-worker's body of a contract survives this build's install; older ones not."""
    signature = "lane_worker.claim_mode_v1(text, text, text)"
    ours = await definition(conn, signature)
    theirs = ours.replace("then 'drain'", "then 'drain' /* their fix */")
    assert theirs != ours
    await conn.execute(theirs)
    await conn.execute(
        "update lane_worker.contracts set installed_by = $1, checksum = 'theirs'"
        " where contract = 'claim_v1'",
        installed_by,
    )
    await engine_schema.ensure_engine_schema(conn)
    assert await definition(conn, signature) == (ours if replaced else theirs)
    row = await conn.fetchrow(
        "select installed_by, checksum from lane_worker.contracts where contract = 'claim_v1'"
    )
    assert row is not None
    assert row["installed_by"] == (VERSION if replaced else installed_by)


async def test_an_unchanged_contract_is_not_installed_again(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Same version, same text: a boot runs no DDL (a body changed by hand stays)."""
    signature = "lane_worker.claim_mode_v1(text, text, text)"
    ours = await definition(conn, signature)
    by_hand = ours.replace("then 'drain'", "then 'drain' /* by hand */")
    await conn.execute(by_hand)
    await engine_schema.ensure_engine_schema(conn)
    assert await definition(conn, signature) == by_hand


async def test_the_schemas_are_not_current_without_this_builds_contracts(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A database that only older builds installed asks for `migrate`; every contract counts."""
    assert await engine_schema.engine_schema_current(conn)
    await conn.execute("delete from lane_worker.contracts where contract = $1", "notify_v1")
    assert not await engine_schema.engine_schema_current(conn)
    await engine_schema.ensure_engine_schema(conn)
    assert await engine_schema.engine_schema_current(conn)
    assert await conn.fetchval("select count(*) from lane_worker.contracts") == len(
        engine_schema.CONTRACTS
    )


def test_lane_worker_versions_order_by_their_numbers() -> None:
    """0.10.0 is newer than 0.9.1; a local or pre-release tail does not count."""
    key = engine_schema.lane_worker_version_key
    assert key("0.10.0") > key("0.9.1") > key("0.9.0")
    assert key("0.2.0+dirty") == key("0.2.0-rc1") == key("0.2.0")
