"""A continuation loop's static claim (``adopt_claim.sql``) against ``claim_next_v2``.

The history of ``support.claim_history`` (test_claim_all's) is written to twin
queues, both a retired lane's, with another system's tasks first in line; a
newer lane's continuation loop drains one with ``claim_next_v2`` and the other
with the static statement, batch by batch at the same instants, in mode 'adopt'
(parked and woken runs it may take), 'drain' (its adoptees that need it), and
'adopt' asked by a lane already retired (served as 'drain'). Every batch (runs,
sweeps, due times) and the final state of every task, run and wait must match.
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
    stage,
    twin_queues,
)
from worker.db import engine


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    async with twin_queues(database_url) as c:
        yield c


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
