"""lane-worker's store beside the TypeScript app's run-state store in one database (issue 29 §2).

The TS app keeps its own tables named ``runs`` and ``attempts`` in the scheduler
schema (``runtime_scheduler``). `migrate` there refuses with one sentence and
creates nothing; with ``LANE_WORKER_STORE_SCHEMA`` the store lives in a schema of
its own while the lane rules still follow ``DEEPLINE_RUNTIME_SCHEDULER_SCHEMA``:
a release worker without a queue suffix boots and drains its release lane.
"""

from __future__ import annotations

import json

import asyncpg

from support.cli import operator_env, run_cli
from support.daemon import Daemons, queue_of
from support.db import fetch, sql
from support.runtime import open_client

RELEASE = "rel-beside"
TS_SCHEMA = "runtime_scheduler"
OWN_SCHEMA = "lane_worker_store"


async def make_ts_store(database_url: str) -> None:
    """The TS app's run-state store: its own runs and attempts, one run in it."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            f"create schema {TS_SCHEMA};"
            f" create table {TS_SCHEMA}.runs (id text primary key, status text not null);"
            f" create table {TS_SCHEMA}.attempts (run_id text, attempt integer);"
            f" insert into {TS_SCHEMA}.runs values ('ts-run-1', 'running');"
        )
    finally:
        await conn.close()


async def schema_objects(database_url: str) -> list[tuple[str, str]]:
    """Every schema and relation outside Postgres's own, as (schema, name)."""
    rows = await fetch(
        database_url,
        "select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname not like 'pg_%' and n.nspname <> 'information_schema'"
        " union select nspname, '' from pg_namespace"
        " where nspname not like 'pg_%' and nspname <> 'information_schema'"
        " order by 1, 2",
    )
    return [(r[0], r[1]) for r in rows]


async def test_migrate_beside_another_store_refuses_in_one_sentence_creating_nothing(
    empty_database_url: str,
) -> None:
    """`relation runs already exists` was the raw answer; now the objects and the remedy."""
    await make_ts_store(empty_database_url)
    before = await schema_objects(empty_database_url)
    result = run_cli(operator_env(empty_database_url), "migrate")
    assert result.returncode == 78, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"lane-worker: the store schema {TS_SCHEMA} already holds attempts, runs, which "
    )
    assert "LANE_WORKER_STORE_SCHEMA" in line
    assert "already exists" not in line
    assert await schema_objects(empty_database_url) == before  # no engine schema either


async def test_migrate_into_a_schema_with_a_type_named_like_a_store_table_refuses_the_same_way(
    empty_database_url: str,
) -> None:
    """`type "ledger" already exists` (exit 1) was the answer (issue 29); now exit 78, named."""
    conn = await asyncpg.connect(empty_database_url)
    try:
        await conn.execute(
            "create schema lw2; create type lw2.lanes as enum ('a');"
            " create domain lw2.ledger as text"
        )
    finally:
        await conn.close()
    before = await schema_objects(empty_database_url)
    result = run_cli(operator_env(empty_database_url, LANE_WORKER_STORE_SCHEMA="lw2"), "migrate")
    assert result.returncode == 78, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("lane-worker: the store schema lw2 already holds domain ledger, which ")
    assert "set LANE_WORKER_STORE_SCHEMA to a schema of lane-worker's own" in line
    assert "already exists" not in line
    assert await schema_objects(empty_database_url) == before


async def test_a_store_of_its_own_beside_the_ts_store_keeps_the_lane_rules(
    empty_database_url: str,
) -> None:
    """A release worker, no suffix, store elsewhere: boots on runs_<release> and runs a run."""
    url = empty_database_url
    await make_ts_store(url)
    env = {"LANE_WORKER_STORE_SCHEMA": OWN_SCHEMA}
    doctor = run_cli(
        operator_env(url, **env, DEEPLINE_RUNTIME_DEPLOY_VERSION=RELEASE), "doctor", "--json"
    )
    assert doctor.returncode == 0, doctor.stderr  # not isolated: no suffix needed
    said = json.loads(doctor.stdout)
    assert (said["storeSchema"], said["schedulerSchema"], said["isolated"]) == (
        OWN_SCHEMA,
        TS_SCHEMA,
        False,
    )
    migrated = run_cli(operator_env(url, **env), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    async with Daemons(url) as pool:
        daemon = pool.start(RELEASE, **env)
        ready = await daemon.ready()
        assert (ready["queue"], ready["store_schema"]) == (queue_of(RELEASE), OWN_SCHEMA)
        client_env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE, **env}
        async with open_client(url, client_env) as client:
            run = await client.submit("plain")
            assert run.queue == queue_of(RELEASE)
            assert (await client.wait(run.run_id, 30)).status == "completed"
        daemon.terminate()
        assert await daemon.wait_exit() == 0, daemon.tail()
    stored = await sql(
        url, f"select status from {OWN_SCHEMA}.runs where run_id = $1::uuid", run.run_id
    )
    assert stored == "completed"
    ts_rows = await fetch(url, f"select id, status from {TS_SCHEMA}.runs")
    assert [tuple(r) for r in ts_rows] == [("ts-run-1", "running")]
    columns = await fetch(
        url,
        "select table_name, column_name from information_schema.columns"
        " where table_schema = $1 order by 1, 2",
        TS_SCHEMA,
    )
    assert [tuple(c) for c in columns] == [
        ("attempts", "attempt"), ("attempts", "run_id"), ("runs", "id"), ("runs", "status"),
    ]  # fmt: skip


async def test_a_worker_boot_beside_another_store_refuses_creating_nothing(
    empty_database_url: str,
) -> None:
    """The boot's install says the same sentence (exit 78) and leaves the database as it was."""
    await make_ts_store(empty_database_url)
    before = await schema_objects(empty_database_url)
    async with Daemons(empty_database_url) as pool:
        daemon = pool.start(RELEASE)
        assert await daemon.wait_exit() == 78, daemon.tail()
    (line,) = [ln for ln in daemon.stderr.splitlines() if ln.strip()]
    assert f"the store schema {TS_SCHEMA} already holds attempts, runs, " in line
    assert await schema_objects(empty_database_url) == before
