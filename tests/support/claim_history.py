"""One history of engine tasks for the claim equivalence tests, on the engine's fake clock.

``stage`` writes the same fourteen tasks to a queue (fresh runs, retries, due and
future sleeps, an event wake-up, a timed-out event wait, expired and live
leases, due cancellation policies, finished tasks; with ``foreign``, another
system's tasks first in line), so two claims can drain twin queues and be
compared (tests/integration/test_claim_all.py, test_claim_continuations.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from support.runtime import connect
from worker.db import engine, engine_schema
from worker.db.store import Store

SCHEMA = "runtime_scheduler"
BY_ENGINE = "claim_all_engine"
BY_LANE = "claim_all_lane"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
CLAIM_AT = T0 + timedelta(seconds=100)
RETRY = {"kind": "fixed", "base_seconds": 5}


@asynccontextmanager
async def twin_queues(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    """A connection to a database with the engine, the store and both queues."""
    c = await connect(database_url)
    await engine_schema.ensure_engine_schema(c)
    await Store(SCHEMA).migrate(c)
    for queue in (BY_ENGINE, BY_LANE):
        await engine.ensure_queue(c, queue, record=None)
    try:
        yield c
    finally:
        await c.close()


async def at(c: asyncpg.Connection[asyncpg.Record], when: datetime) -> None:
    """Set the engine's clock for this session."""
    await c.execute("select set_config('absurd.fake_now', $1, false)", when.isoformat())


async def spawn(
    c: asyncpg.Connection[asyncpg.Record], queue: str, name: str, **options: Any
) -> tuple[uuid.UUID, uuid.UUID]:
    row = await c.fetchrow(
        "select task_id, run_id from absurd.spawn_task($1, $2, '{}'::jsonb, $3::jsonb)",
        queue, name, {"max_attempts": 3, "retry_strategy": RETRY, **options},
    )  # fmt: skip
    assert row is not None
    return row["task_id"], row["run_id"]


async def take(
    c: asyncpg.Connection[asyncpg.Record], queue: str, run_id: uuid.UUID, lease: int
) -> None:
    """Claim exactly ``run_id`` (the staging worker), however the queue is ordered."""
    await c.execute(
        f"update absurd.r_{queue} set available_at = $2 where run_id = $1",
        run_id, datetime(1999, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    got = await c.fetch("select run_id from absurd.claim_task($1, 'stager', $2, 1)", queue, lease)
    assert [r["run_id"] for r in got] == [run_id]


async def stage(
    c: asyncpg.Connection[asyncpg.Record], queue: str, *, foreign: bool = False
) -> None:
    """Write the same history of fifteen tasks to ``queue``.

    With ``foreign``, another system's tasks too (no store row), first in line:
    fresh, with a due cancellation policy, and with a lease that expired.
    """

    def t(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    # Two tasks whose cancellation policy is due by the claim, first in line: a
    # batch of one cancels only one of them in its upkeep, and must not hand out
    # the other.
    if foreign:
        await at(c, t(0.1))
        await spawn(c, queue, "foreign-fresh")
        await spawn(c, queue, "foreign-delay-due", cancellation={"max_delay": 30})
        _, foreign_leased = await spawn(c, queue, "foreign-lease-expired")
    # Its lease expired and its cancellation is due, first in the upkeep's order:
    # cancelled, not swept (the sweep comes after the upkeep, as in the engine's).
    await at(c, t(0.4))
    _, dur_expired = await spawn(
        c, queue, "duration-due-lease-expired", cancellation={"max_duration": 20}
    )
    await at(c, t(0.5))
    await spawn(c, queue, "delay-cancelled", cancellation={"max_delay": 30})
    await at(c, t(0.6))
    await spawn(c, queue, "delay-cancelled-2", cancellation={"max_delay": 30})
    await at(c, t(1))
    await spawn(c, queue, "fresh-early")
    await at(c, t(3))
    _, sleeper = await spawn(c, queue, "sleep-due")
    _, later = await spawn(c, queue, "sleep-later")
    _, waiter = await spawn(c, queue, "wait-timed-out")
    waiter_task = await c.fetchval(
        f"select task_id from absurd.r_{queue} where run_id = $1", waiter
    )
    _, woken = await spawn(c, queue, "event-woken")
    woken_task = await c.fetchval(f"select task_id from absurd.r_{queue} where run_id = $1", woken)
    _, expired = await spawn(c, queue, "lease-expired")
    _, live = await spawn(c, queue, "lease-live")
    _, failing = await spawn(c, queue, "retry-due")
    _, done = await spawn(c, queue, "completed")
    _, dur = await spawn(c, queue, "duration-cancelled", cancellation={"max_duration": 20})
    await at(c, t(4))
    await spawn(c, queue, "fresh-mid")
    await at(c, t(5))
    await spawn(c, queue, "delay-not-yet", cancellation={"max_delay": 3600})

    await at(c, t(10))
    await take(c, queue, sleeper, 60)
    await c.execute("select absurd.schedule_run($1, $2, $3)", queue, sleeper, t(50))
    await take(c, queue, later, 60)
    await c.execute("select absurd.schedule_run($1, $2, $3)", queue, later, t(500))
    await take(c, queue, waiter, 60)
    suspended = await c.fetchval(
        "select should_suspend from absurd.await_event($1, $2, $3, 'wait', 'never-sent', 41)",
        queue, waiter_task, waiter,
    )  # fmt: skip
    assert suspended
    await take(c, queue, woken, 60)
    await c.fetchval(
        "select should_suspend from absurd.await_event($1, $2, $3, 'wait', $4, 3600)",
        queue, woken_task, woken, "hello",
    )  # fmt: skip
    await take(c, queue, done, 60)
    await c.execute("select absurd.complete_run($1, $2, '{\"ok\": true}'::jsonb)", queue, done)
    await take(c, queue, dur, 60)
    await c.execute("select absurd.schedule_run($1, $2, $3)", queue, dur, t(40))
    await at(c, t(20))
    await take(c, queue, failing, 60)
    await c.execute(
        'select absurd.fail_run($1, $2, \'{"name": "Boom"}\'::jsonb, null)', queue, failing
    )
    await take(c, queue, expired, 30)  # lease ends at t(50)
    await take(c, queue, dur_expired, 30)  # lease ends at t(50), cancellation due at t(40)
    if foreign:
        await take(c, queue, foreign_leased, 30)
    await take(c, queue, live, 300)  # lease ends at t(320)
    await at(c, t(60))
    await c.execute("select absurd.emit_event($1, 'hello', '{\"v\": 1}'::jsonb)", queue)


async def give_store_rows(c: asyncpg.Connection[asyncpg.Record], queue: str) -> None:
    """Make every task of ``queue`` lane-worker's: a store run row each (the claim skips others)."""
    await c.execute(
        f"insert into {SCHEMA}.runs (run_id, play, input, launch, release_id, queue, task_id,"
        f"                           max_attempts)"
        f" select gen_random_uuid(), task_name, '{{}}', '{{}}', 'rel', $1, task_id, 3"
        f"   from absurd.t_{queue} where task_name not like 'foreign-%'",
        queue,
    )


async def snapshot(c: asyncpg.Connection[asyncpg.Record], queue: str) -> dict[str, Any]:
    """Every task, run and wait of ``queue``, keyed by task name (ids differ between queues)."""
    tasks = {
        r["task_name"]: dict(r)
        for r in await c.fetch(
            f"select task_name, state, attempts, first_started_at, cancelled_at, enqueue_at"
            f"  from absurd.t_{queue}"
        )
    }
    runs = sorted(
        tuple(r.values())
        for r in await c.fetch(
            f"select t.task_name, r.attempt, r.state, r.claimed_by, r.claim_expires_at,"
            f"       r.available_at, r.started_at, r.failed_at, r.failure_reason->>'name',"
            f"       r.wake_event, r.event_payload"
            f"  from absurd.r_{queue} r join absurd.t_{queue} t using (task_id)"
        )
    )
    waits = sorted(
        tuple(r.values())
        for r in await c.fetch(
            f"select t.task_name, w.step_name, w.timeout_at"
            f"  from absurd.w_{queue} w join absurd.t_{queue} t using (task_id)"
        )
    )
    return {"tasks": tasks, "runs": runs, "waits": waits}


async def foreign_rows(c: asyncpg.Connection[asyncpg.Record]) -> list[tuple[Any, ...]]:
    """Every engine row of the foreign tasks on the lane queue, as stored."""
    return [
        tuple(r.values())
        for r in await c.fetch(
            f"select t.*, r.* from absurd.t_{BY_LANE} t join absurd.r_{BY_LANE} r using (task_id)"
            "  where t.task_name like 'foreign-%' order by t.task_name, r.attempt"
        )
    ]
