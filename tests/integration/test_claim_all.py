"""claim_lane's 'all' mode (the own loop's claim) against the engine's absurd.claim_task.

The same history is written to two queues on the engine's fake clock
(``absurd.fake_now``): fresh runs, retries, due and future sleeps, an event
wake-up, a timed-out event wait, expired and live leases, due cancellation
policies and finished tasks (``support.claim_history``). One queue is then
drained by claim_task, the other by claim_lane in mode 'all', batch by batch at
the same instants, and every batch and the final state of every task, run and wait must match.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.claim_history import (
    BY_ENGINE,
    BY_LANE,
    CLAIM_AT,
    SCHEMA,
    at,
    foreign_rows,
    give_store_rows,
    snapshot,
    spawn,
    stage,
    take,
    twin_queues,
)
from worker.db import engine
from worker.db.sql import query


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    async with twin_queues(database_url) as c:
        yield c


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
