"""Whose cleanup policy an engine queue has (issue 29): lane-worker's only on a queue it created.

The TypeScript app on the same engine creates its queues with the engine's default
policy (30 days) and cleans its own finished tasks by it. lane-worker used to set
its 6 hours on every queue it ensured, the app's too when release ids coincide, so
the app's cleanup deleted the app's tasks after 6 hours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from support import typescript as ts
from support.db import fetch, sql
from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    work_once,
)
from worker import App, TaskContext
from worker.client import LaneClient
from worker.config.settings import Settings
from worker.daemon.boot import install_and_register
from worker.db import engine
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.states import LaneState

RELEASE = "rel-shared"
QUEUE = queue_of(RELEASE)
ENGINE_DEFAULT = (timedelta(days=30), 1000)  # the policy a queue the TS app creates has
OWN_POLICY = (timedelta(hours=6), 1000)  # lane-worker's (engine.QUEUE_CLEANUP_TTL / _LIMIT)


async def policy_of(database_url: str, queue: str) -> tuple[timedelta, int]:
    """Return a queue's cleanup policy: (ttl, limit)."""
    conn = await connect(database_url)
    try:
        row = await conn.fetchrow(
            "select cleanup_ttl, cleanup_limit from absurd.get_queue_policy($1)", queue
        )
    finally:
        await conn.close()
    assert row is not None, queue
    return row["cleanup_ttl"], row["cleanup_limit"]


async def test_a_queue_lane_worker_creates_gets_its_policy(database_url: str) -> None:
    """Every way lane-worker creates a queue sets its policy, says and records it created it."""
    async with open_client(database_url, env_of("rel-new")) as client:
        record = client.store.lanes.record_created_queue
        conn = await connect(database_url)
        try:
            assert await engine.ensure_queue(conn, "lw_alone", record=record) is True
            assert await engine.ensure_queue(conn, "lw_alone", record=record) is False
            # Within the caller's transaction (the loop registry's, `lanes retire`'s).
            async with conn.transaction():
                assert await engine.ensure_queue(conn, "lw_in_transaction", record=record) is True
        finally:
            await conn.close()
        submitted = await client.submit("wait")  # the SQL API's first submit to a lane
        forced = await client.retire_release("rel-forced", force=True)
    created = ["lw_alone", "lw_in_transaction", submitted.queue, forced]
    for queue in created:
        assert await policy_of(database_url, queue) == OWN_POLICY, queue
    assert await recorded(database_url) == sorted(created)


async def test_a_queue_the_typescript_app_created_keeps_its_policy(database_url: str) -> None:
    """Ensured, watched, submitted to, retired and activated: the app's policy stays."""
    async with open_client(database_url, env_of(RELEASE)) as client:
        await ts.spawn(database_url, QUEUE)
        conn = await connect(database_url)
        try:
            # No NOTIFY trigger yet: unprepared, whatever the policy.
            assert await engine.queues_unprepared(conn, [QUEUE, "not_there"]) == [
                QUEUE,
                "not_there",
            ]
            # A worker's boot and its loop registry.
            record = client.store.lanes.record_created_queue
            assert not await engine.ensure_queue(conn, QUEUE, record=record)
            async with conn.transaction():
                assert not await engine.ensure_queue(conn, QUEUE, record=record)
                await engine.watch_queue(conn, QUEUE)
            # Prepared now: the app's policy is not a reason to prepare it again.
            assert await engine.queues_unprepared(conn, [QUEUE]) == []
        finally:
            await conn.close()
        await client.ensure_queue(QUEUE)
        await client.submit("wait")
        await client.retire_release(RELEASE)
        await client.activate_release(RELEASE)
    assert await policy_of(database_url, QUEUE) == ENGINE_DEFAULT
    assert await recorded(database_url) == []


async def test_a_foreign_policy_alone_does_not_make_a_queue_unprepared(database_url: str) -> None:
    """A queue with lane-worker's trigger and the app's policy is prepared; the policy stays."""
    async with open_client(database_url, env_of(RELEASE)):
        await ts.spawn(database_url, QUEUE)
        conn = await connect(database_url)
        try:
            await engine.watch_queue(conn, QUEUE)
            assert await engine.queues_unprepared(conn, [QUEUE]) == []
        finally:
            await conn.close()
    assert await policy_of(database_url, QUEUE) == ENGINE_DEFAULT


async def recorded(database_url: str) -> list[str]:
    """The queues the store recorded creating (migration 0024: what `lanes prune` may drop)."""
    rows = await fetch(database_url, f"select queue from {SCHEMA}.created_queues order by queue")
    return [r["queue"] for r in rows]


async def _by_engine(database_url: str, client: LaneClient) -> None:
    conn = await connect(database_url)
    try:
        record = client.store.lanes.record_created_queue
        assert not await engine.ensure_queue(conn, QUEUE, record=record)
    finally:
        await conn.close()


async def _by_submit(_database_url: str, client: LaneClient) -> None:
    await client.submit("wait")  # the store's ensure_lane_queue


@pytest.mark.parametrize("ensure", [_by_engine, _by_submit], ids=["engine", "sql_api"])
async def test_a_queue_the_typescript_app_creates_meanwhile_keeps_its_policy(
    database_url: str, ensure: Callable[[str, LaneClient], Awaitable[None]]
) -> None:
    """lane-worker finds no queue, the app creates it first: the app's policy stays.

    The app's create_queue is held open; lane-worker's create waits for it on the
    queue row, then finds the row the app's. Setting its policy then (both paths
    did, the SQL API after finding no queue twice) took the app's queue over.
    """
    async with open_client(database_url, env_of(RELEASE)) as client:
        app = await connect(database_url)
        try:
            app_pid = app.get_server_pid()
            creating = app.transaction()
            await creating.start()
            await app.execute("select absurd.create_queue($1)", QUEUE)
            ensuring = asyncio.create_task(ensure(database_url, client))

            async def waits_for_the_app() -> bool:
                blocked = await sql(
                    database_url,
                    "select count(*) from pg_stat_activity where $1 = any(pg_blocking_pids(pid))",
                    app_pid,
                )
                return bool(blocked) or ensuring.done()

            await eventually(waits_for_the_app, what="lane-worker's create to wait for the app's")
            assert not ensuring.done()  # it waits on the app's queue row
            await creating.commit()
            await ensuring
        finally:
            await app.close()
    assert await policy_of(database_url, QUEUE) == ENGINE_DEFAULT
    assert await recorded(database_url) == []  # not lane-worker's: `lanes prune` keeps it


PART_BOOT, PART_FORCED = "part", "part-forced"


async def _boot(database_url: str, release: str) -> LaneState:
    """A worker of ``release`` boots (the daemon's install_and_register)."""
    settings = Settings.from_env({
        "WORKFLOW_RUNTIME_POSTGRES": database_url,
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": release,
    })  # fmt: skip
    db = await Database.open(PoolOptions(url=database_url, max_size=1, retry_for_s=5))
    try:
        return await install_and_register(db, Store(SCHEMA), settings)
    finally:
        await db.close()


def _echo_app() -> App:
    plays = App()

    @plays.play("echo")
    async def echo(ctx: TaskContext, params: Any) -> Any:
        return params

    return plays


async def test_a_partitioned_queue_the_typescript_app_created_is_used_as_it_is(
    database_url: str,
) -> None:
    """Issue 29, F7: the app creates a lane's queue partitioned. A worker boots on it,
    `lanes retire --force` names one, a run submitted there completes and lane-worker's
    cleanup takes it (its delete covers a partitioned queue's i_ table too); the
    queues stay partitioned with the app's policy and its task, and are not recorded.
    Before, absurd.create_queue($1) raised: Queue "..." already exists with storage
    mode "partitioned"."""
    queues = [queue_of(PART_BOOT), queue_of(PART_FORCED)]
    for queue in queues:
        await sql(database_url, "select absurd.create_queue($1, 'partitioned')", queue)
    theirs = await ts.spawn(database_url, queue_of(PART_BOOT))
    assert await _boot(database_url, PART_BOOT) == LaneState.CLAIMING
    async with open_client(database_url, env_of(PART_BOOT)) as client:
        assert await client.retire_release(PART_FORCED, force=True) == queue_of(PART_FORCED)
        submitted = await client.submit("echo", {"n": 1}, idempotency_key="part-1")
        async with open_runtime(database_url, _echo_app(), PART_BOOT) as runtime:
            assert await work_once(runtime) == ["completed"]
            status = await client.status(submitted.run_id)
            assert status.as_json()["status"] == "completed", status.as_json()
            # Older than lane-worker's retention: its cleanup deletes the run's task.
            await sql(
                database_url,
                f'update absurd."r_{queues[0]}" set completed_at = completed_at - interval'
                " '7 hours' where state = 'completed'",
            )
            cleaned = await runtime.db.run(
                lambda c: runtime.store.lanes.clean_own(c, queue=queues[0])
            )
    assert cleaned == (1, 0)
    tasks = await fetch(database_url, f'select task_id from absurd."t_{queues[0]}"')
    assert [r["task_id"] for r in tasks] == [theirs]
    for queue in queues:
        mode = await sql(
            database_url, "select storage_mode from absurd.queues where queue_name = $1", queue
        )
        assert mode == "partitioned", queue
        assert await policy_of(database_url, queue) == ENGINE_DEFAULT, queue
    assert await recorded(database_url) == []
