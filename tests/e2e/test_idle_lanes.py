"""Idle continuation loops cost nothing each (issue 35): one statement checks them all.

A worker of the newest release keeps a ``:continuations`` loop on every retired
lane with open runs. Each loop used to poll its queue on its own every
``LANE_WORKER_LISTEN_POLL_INTERVAL`` (0.05 transactions/s per lane per worker, 50/s
at 1,000 lanes). Now a loop whose queue has nothing due waits for a NOTIFY, its
known due time, or the registry's safety net: one statement per batch of queues.
Claims are counted with PostgreSQL's function statistics (``track_functions``).
"""

from __future__ import annotations

from typing import Any

import pytest

from support import many_lanes
from support.daemon import Daemon, Daemons
from support.db import execute, sql
from support.runtime import SCHEMA, eventually

LANES = 40
RELEASE = "rel-idle"
# Every idle loop polled once a second before: 40 lanes, 40 claims a second.
ENV = {"LANE_WORKER_LISTEN_POLL_INTERVAL": "1"}


async def claims(database_url: str) -> int:
    """Return how many loop claims (``lane_worker.claim_next_v1``) the database has served."""
    value = await sql(
        database_url,
        "select coalesce(sum(calls), 0) from pg_stat_user_functions "
        "where schemaname = 'lane_worker' and funcname = 'claim_next_v1'",
    )
    return int(value)


async def heartbeats(database_url: str, worker_id: str, count: int) -> None:
    """Wait until the worker has beaten ``count`` more times (10 s apart)."""
    seen: list[Any] = []

    async def beat() -> bool:
        at = await sql(
            database_url,
            f"select heartbeat_at from {SCHEMA}.workers where worker_id = $1",
            worker_id,
        )
        if not seen or at != seen[-1]:
            seen.append(at)
        return len(seen) > count

    await eventually(beat, timeout_s=15 * count, what=f"{count} heartbeats")


async def attached(d: Daemon, lanes: int) -> None:
    """Wait until the daemon runs a continuation loop on each of ``lanes`` retired lanes."""

    async def all_there() -> bool:
        return len(d.events("loop.attached")) == lanes

    await eventually(all_there, timeout_s=60, what="a loop on every retired lane")


async def prepare(database_url: str) -> many_lanes.Built:
    """Count function calls in this database, and build the retired lanes."""
    name = await sql(database_url, "select current_database()")
    await execute(database_url, f"alter database \"{name}\" set track_functions = 'pl'")
    return await many_lanes.build(database_url, lanes_count=LANES, parked=2, plain=0)


@pytest.mark.timeout(180)
async def test_idle_continuation_loops_do_not_poll_one_by_one(database_url: str) -> None:
    """Forty idle loops, LISTEN up, 1 s polls: over two heartbeats, fewer claims than loops."""
    built = await prepare(database_url)
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, **ENV)
        await d.ready()
        await attached(d, LANES)
        await heartbeats(database_url, d.worker_id, 1)  # past the attach and its first check
        before = await claims(database_url)
        await heartbeats(database_url, d.worker_id, 2)  # 10-20 s: 400-800 claims before
        during = await claims(database_url) - before
        # The own loop polls every second; the forty continuation loops do not.
        assert during < LANES, during

        # Still awake: a run made due on one of them (the trigger's NOTIFY) is adopted.
        queue = built.lanes[7]
        await execute(
            database_url,
            f"update absurd.r_{queue} set available_at = now() where state = 'sleeping'",
        )
        await d.wait_for("run.adopted", queue=queue, timeout_s=30)

        # At stop, only the queues a loop claimed from are searched for leftover claims:
        # one query per idle lane made the stop outlast its 5 s at 1,000 lanes.
        d.terminate()
        assert await d.wait_exit() == 0
        (checked,) = d.events("worker.leftovers_checked")
        assert checked["queues"] < LANES, checked


@pytest.mark.timeout(180)
async def test_the_safety_net_finds_a_run_no_notify_announced(database_url: str) -> None:
    """With the engine table's trigger off, the one statement for all loops still finds it."""
    built = await prepare(database_url)
    queue = built.lanes[3]
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, **ENV)
        await d.ready()
        await attached(d, LANES)
        await execute(
            database_url,
            f"alter table absurd.r_{queue} disable trigger lane_worker_runnable_v1;"
            f" update absurd.r_{queue} set available_at = now() where state = 'sleeping'",
        )
        await d.wait_for("run.adopted", queue=queue, timeout_s=30)
