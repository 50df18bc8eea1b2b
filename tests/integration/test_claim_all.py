"""claim_lane's 'all' mode (the own loop's claim) against the engine's absurd.claim_task.

The same history is written to two queues on the engine's fake clock
(``absurd.fake_now``): fresh runs, retries, due and future sleeps, an event
wake-up, a timed-out event wait, expired and live leases, due cancellation
policies and finished tasks. One queue is then drained by claim_task, the other
by claim_lane in mode 'all', batch by batch at the same instants, and every
batch and the final state of every task, run and wait must match.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from support.runtime import connect
from worker.db import engine, engine_schema
from worker.db.sql import query
from worker.db.store import Store

SCHEMA = "runtime_scheduler"
BY_ENGINE = "claim_all_engine"
BY_LANE = "claim_all_lane"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
CLAIM_AT = T0 + timedelta(seconds=100)
RETRY = {"kind": "fixed", "base_seconds": 5}


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    c = await connect(database_url)
    await engine_schema.ensure_engine_schema(c)
    await Store(SCHEMA).migrate(c)
    for queue in (BY_ENGINE, BY_LANE):
        await engine.ensure_queue(c, queue, record=None)
    yield c
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
    """Write the same history of fourteen tasks to ``queue``.

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


async def claim_batch(
    c: asyncpg.Connection[asyncpg.Record], queue: str, qty: int, static: bool = False
) -> list[tuple[Any, ...]]:
    """One claim of ``qty`` on ``queue``: claim_task on BY_ENGINE; on BY_LANE mode 'all', or
    with ``static`` the own loop's static statement (sql/engine/own_claim.sql)."""
    if queue == BY_ENGINE:
        rows = await c.fetch("select * from absurd.claim_task($1, 'claimer', 60, $2)", queue, qty)
    elif static:
        text = query("engine", "own_claim.sql", "own_claim", schema=SCHEMA, queue=queue)
        rows = await c.fetch(text, queue, "claimer", 60, qty, [], "rel-x", "claimer", 2)
    else:
        rows = await c.fetch(
            "select * from lane_worker.claim_lane_v1($1, 'claimer', 60, $2, $3, $1, 'all', '{}')",
            queue, qty, SCHEMA,
        )  # fmt: skip
    names = {
        r["task_id"]: r["task_name"]
        for r in await c.fetch(f"select task_id, task_name from absurd.t_{queue}")
    }
    return sorted(
        (names[r["task_id"]], r["attempt"], r["wake_event"], r["event_payload"] is not None)
        for r in rows
        if r["run_id"] is not None
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


@pytest.mark.parametrize("static", [False, True], ids=["claim_lane", "static"])
@pytest.mark.parametrize("qty", [1, 2, 16])
async def test_claim_all_hands_out_what_claim_task_does(
    conn: asyncpg.Connection[asyncpg.Record], qty: int, static: bool
) -> None:
    """Batch by batch the same runs, and in the end the same states, as the engine's claim."""
    for queue in (BY_ENGINE, BY_LANE):
        await stage(conn, queue)
    await give_store_rows(conn, BY_LANE)
    assert await snapshot(conn, BY_ENGINE) == await snapshot(conn, BY_LANE)

    await at(conn, CLAIM_AT)
    batches: dict[str, list[list[tuple[Any, ...]]]] = {BY_ENGINE: [], BY_LANE: []}
    for queue in (BY_ENGINE, BY_LANE):
        while batch := await claim_batch(conn, queue, qty, static):
            batches[queue].append(batch)
        # One more claim with nothing due: bounded upkeep catches up.
        assert await claim_batch(conn, queue, qty, static) == []
    assert batches[BY_LANE] == batches[BY_ENGINE]
    # The staged history is what this test means it to be.
    assert sorted(x for b in batches[BY_ENGINE] for x in b) == [
        ("delay-not-yet", 1, None, False),
        ("event-woken", 1, None, True),  # the emit clears wake_event
        ("fresh-early", 1, None, False),
        ("fresh-mid", 1, None, False),
        ("retry-due", 2, None, False),
        ("sleep-due", 1, None, False),
        ("wait-timed-out", 1, "never-sent", False),
    ]
    engine_state = await snapshot(conn, BY_ENGINE)
    lane_state = await snapshot(conn, BY_LANE)
    assert lane_state["tasks"] == engine_state["tasks"]
    assert lane_state["waits"] == engine_state["waits"]
    assert lane_state["runs"] == engine_state["runs"]
    states = {k: v["state"] for k, v in engine_state["tasks"].items()}
    assert states["delay-cancelled"] == states["delay-cancelled-2"] == "cancelled"
    assert states["duration-cancelled"] == "cancelled"
    assert states["lease-expired"] == "sleeping"  # swept; its retry waits out its delay
    assert states["lease-live"] == "running"
    assert states["sleep-later"] == "sleeping"
    assert states["delay-not-yet"] == "running"


async def test_claim_all_serves_only_the_claimers_own_queue(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """Mode 'all' filters nothing, so it is refused on another lane's queue."""
    with pytest.raises(asyncpg.InvalidParameterValueError, match="mode all does not serve"):
        await conn.fetch(
            "select * from lane_worker.claim_lane_v1($1, 'w:x:continuations', 60, 1, $2, $3,"
            " 'all', '{}')",
            BY_ENGINE, SCHEMA, BY_LANE,
        )  # fmt: skip


@pytest.mark.parametrize("static", [False, True], ids=["claim_lane", "static"])
async def test_claim_all_leaves_another_systems_tasks_untouched(
    conn: asyncpg.Connection[asyncpg.Record], static: bool
) -> None:
    """Foreign tasks first in line change nothing: lane-worker's are claimed as claim_task would.

    They are not claimed, not cancelled by their due policy, their expired lease
    is not swept (their owner's claim does that), and they give no due time.
    """
    await stage(conn, BY_ENGINE)
    await stage(conn, BY_LANE, foreign=True)
    await give_store_rows(conn, BY_LANE)
    foreign_before = await foreign_rows(conn)
    await at(conn, CLAIM_AT)
    batches: dict[str, list[list[tuple[Any, ...]]]] = {BY_ENGINE: [], BY_LANE: []}
    for queue in (BY_ENGINE, BY_LANE):
        while batch := await claim_batch(conn, queue, 2, static):
            batches[queue].append(batch)
    assert batches[BY_LANE] == batches[BY_ENGINE]
    engine_state = await snapshot(conn, BY_ENGINE)
    lane_state = await snapshot(conn, BY_LANE)
    assert {k: v for k, v in lane_state["tasks"].items() if not k.startswith("foreign-")} == (
        engine_state["tasks"]
    )
    assert [r for r in lane_state["runs"] if not r[0].startswith("foreign-")] == engine_state[
        "runs"
    ]
    assert await foreign_rows(conn) == foreign_before
    assert {k: v["state"] for k, v in lane_state["tasks"].items() if k.startswith("foreign-")} == {
        "foreign-fresh": "pending",
        "foreign-delay-due": "pending",
        "foreign-lease-expired": "running",
    }
    due = "select lane_worker.next_due_in_v1($1, $2, $1, 'all', '{}')"
    engine_due = await conn.fetchval("select lane_worker.next_due_any_v1($1)", BY_ENGINE)
    assert await conn.fetchval(due, BY_LANE, SCHEMA) == engine_due
    if static:
        # The static statement's own due row, read with its claim, says the same.
        text = query("engine", "own_claim.sql", "own_claim", schema=SCHEMA, queue=BY_LANE)
        rows = await conn.fetch(text, BY_LANE, "claimer", 60, 2, [], "rel-x", "claimer", 2)
        assert [r["due_in_s"] for r in rows if r["due_known"]] == [engine_due]


async def foreign_rows(c: asyncpg.Connection[asyncpg.Record]) -> list[tuple[Any, ...]]:
    """Every engine row of the foreign tasks on the lane queue, as stored."""
    return [
        tuple(r.values())
        for r in await c.fetch(
            f"select t.*, r.* from absurd.t_{BY_LANE} t join absurd.r_{BY_LANE} r using (task_id)"
            "  where t.task_name like 'foreign-%' order by t.task_name, r.attempt"
        )
    ]


OTHER = "claim_all_other"  # a lane whose queue BY_LANE's continuation loops visit


@pytest.mark.parametrize(
    ("mode", "queue", "own_queue", "own_status"),
    [
        ("own", BY_LANE, BY_LANE, "claiming"),
        ("drain", BY_LANE, BY_LANE, "retired"),
        ("adopt", OTHER, BY_LANE, "claiming"),
        ("mine", OTHER, BY_LANE, "claiming"),
        ("drain", OTHER, BY_LANE, "retired"),
    ],
)
async def test_no_claim_mode_hands_out_another_systems_task(
    conn: asyncpg.Connection[asyncpg.Record],
    mode: str,
    queue: str,
    own_queue: str,
    own_status: str,
) -> None:
    """Due, woken and sleeping foreign tasks stay where their owner left them, in every mode."""
    await engine.ensure_queue(conn, OTHER, record=None)
    await conn.execute(
        f"insert into {SCHEMA}.releases (queue, status, created_at)"
        " values ($1, $2, now()), ($3, 'retired', now() - interval '1 hour')"
        " on conflict (queue) do update set status = excluded.status",
        own_queue, own_status, OTHER,
    )  # fmt: skip
    await spawn(conn, queue, "foreign-fresh")
    _, sleeper = await spawn(conn, queue, "foreign-sleeper")
    await take(conn, queue, sleeper, 60)
    await conn.execute("select absurd.schedule_run($1, $2, now())", queue, sleeper)
    _, woken = await spawn(conn, queue, "foreign-woken")
    woken_task = await conn.fetchval(
        f"select task_id from absurd.r_{queue} where run_id = $1", woken
    )
    await take(conn, queue, woken, 60)
    await conn.fetchval(
        "select should_suspend from absurd.await_event($1, $2, $3, 'wait', 'ping', 3600)",
        queue, woken_task, woken,
    )  # fmt: skip
    await conn.execute("select absurd.emit_event($1, 'ping', '{}'::jsonb)", queue)
    worker = "w" if queue == own_queue else f"w:{queue}:continuations"
    rows = await conn.fetch(
        "select * from lane_worker.claim_lane_v1($1, $2, 60, 16, $3, $4, $5, '{p}')",
        queue, worker, SCHEMA, own_queue, mode,
    )  # fmt: skip
    assert rows == []
    due = await conn.fetchval(
        "select lane_worker.next_due_in_v1($1, $2, $3, $4, '{p}')", queue, SCHEMA, own_queue, mode
    )
    assert due is None


CLAIMER = "claim_all_claimer"  # the lane whose continuation loops claim BY_ENGINE and BY_LANE
WAITING = ("sleep-due", "event-woken", "wait-timed-out", "sleep-later", "fresh-mid")
NOT_ADOPTED = ("fresh-early", "retry-due")  # drain: their effective lane is their queue's
PLAYS_LACKED = ("delay-not-yet",)


async def continuation_lanes(c: asyncpg.Connection[asyncpg.Record], mode: str) -> None:
    """Both queues a retired lane's, CLAIMER newer; their runs' facts for ``mode`` to sort."""
    await c.execute(
        f"insert into {SCHEMA}.releases (queue, status, created_at)"
        " values ($1, 'retired', now() - interval '1 hour'),"
        "        ($2, 'retired', now() - interval '1 hour'), ($3, $4, now())",
        BY_ENGINE, BY_LANE, CLAIMER, "retired" if mode == "drain" else "claiming",
    )  # fmt: skip
    await c.execute(
        f"update {SCHEMA}.runs set"
        "  status = case when play = any($1) then 'waiting' else 'queued' end,"
        "  adopted_queue = case when $2 and play <> all($3) then $4 end,"
        "  adopted_release_id = case when $2 and play <> all($3) then 'rel-claimer' end",
        list(WAITING), mode == "drain", list(NOT_ADOPTED), CLAIMER,
    )  # fmt: skip


async def continuation_batch(
    c: asyncpg.Connection[asyncpg.Record], queue: str, qty: int, mode: str, plays: list[str]
) -> tuple[list[tuple[Any, ...]], int, float | None]:
    """One continuation-loop claim: claim_next_v2 on BY_ENGINE, adopt_claim.sql on BY_LANE.

    Returns the runs, the sweep count and the due time (None: not read, or none).
    """
    batch = await engine.claim(
        c, queue, "w:claimer:continuations", lease_s=60, qty=qty, mode=mode,
        store_schema=SCHEMA, own_queue=CLAIMER, plays=plays, static=queue == BY_LANE,
    )  # fmt: skip
    names = {
        r["task_id"]: r["task_name"]
        for r in await c.fetch(f"select task_id, task_name from absurd.t_{queue}")
    }
    runs = sorted(
        (names[r.task_id], r.attempt, r.wake_event, r.event_payload is not None) for r in batch.runs
    )
    if batch.swept and queue == BY_LANE:
        # After a sweep the static statement gives no due time (its retries are
        # not in its snapshot): the loop asks for it.
        assert not batch.due_known
    due = batch.due_in_s if batch.due_known and not batch.swept else None
    return runs, batch.swept, due


@pytest.mark.parametrize("mode", [engine.CLAIM_ADOPT, engine.CLAIM_DRAIN, "adopt-retired"])
@pytest.mark.parametrize("qty", [1, 2, 16])
async def test_the_static_continuation_claim_does_what_claim_next_v2_does(
    conn: asyncpg.Connection[asyncpg.Record], qty: int, mode: str
) -> None:
    """adopt_claim.sql against claim_next_v2 in modes 'adopt' and 'drain', over one history.

    Batch by batch the same runs, sweeps and due times, the same final states,
    and another system's tasks untouched. 'adopt-retired': the loop asks 'adopt'
    but its lane is retired, so both serve it as 'drain'.
    """
    asked = engine.CLAIM_ADOPT if mode == "adopt-retired" else mode
    for queue in (BY_ENGINE, BY_LANE):
        await stage(conn, queue, foreign=True)
        await give_store_rows(conn, queue)
    await continuation_lanes(conn, engine.CLAIM_ADOPT if mode == engine.CLAIM_ADOPT else "drain")
    names = [r["task_name"] for r in await conn.fetch(f"select task_name from absurd.t_{BY_LANE}")]
    plays = [n for n in names if n not in PLAYS_LACKED and not n.startswith("foreign-")]
    foreign_before = await foreign_rows(conn)
    await at(conn, CLAIM_AT)
    batches: dict[str, list[tuple[Any, ...]]] = {BY_ENGINE: [], BY_LANE: []}
    for queue in (BY_ENGINE, BY_LANE):
        while True:
            batch = await continuation_batch(conn, queue, qty, asked, plays)
            batches[queue].append(batch)
            if not batch[0] and not batch[1]:
                break
    assert batches[BY_LANE] == batches[BY_ENGINE]
    handed = sorted(x[0] for b in batches[BY_ENGINE] for x in b[0])
    if mode == engine.CLAIM_ADOPT:
        # parked (store 'waiting') and due: slept, woken by its event, timed out
        assert handed == ["event-woken", "sleep-due", "wait-timed-out"]
    else:
        # every due run adopted by CLAIMER whose play it has
        assert handed == ["event-woken", "fresh-mid", "sleep-due", "wait-timed-out"]
    assert sum(b[1] for b in batches[BY_ENGINE]) == 1  # lease-expired, swept once
    assert batches[BY_ENGINE][-1][2] is not None  # a due time: sleep-later, live leases
    engine_state = await snapshot(conn, BY_ENGINE)
    lane_state = await snapshot(conn, BY_LANE)
    assert lane_state["tasks"] == engine_state["tasks"]
    assert lane_state["waits"] == engine_state["waits"]
    assert lane_state["runs"] == engine_state["runs"]
    assert await foreign_rows(conn) == foreign_before
    states = {k: v["state"] for k, v in engine_state["tasks"].items()}
    assert states["delay-cancelled"] == states["delay-cancelled-2"] == "cancelled"
    assert states["duration-cancelled"] == "cancelled"
