"""The claim reads the claimer's lane itself: a retired lane's worker is served as draining.

Whatever mode the worker asks for (it may not have seen its retirement yet: no
LISTEN, between two lane refreshes), ``claim_lane_v1``, ``claim_next_v1`` and
``next_due_in_v1`` serve a worker whose lane the store records as retired as mode
'drain': what only its release may run, never a parked run that woke and that a
newer claiming release may adopt (issue 34 item 5).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from support.runtime import connect
from worker.db import engine, engine_schema
from worker.db.store import Store

SCHEMA = "runtime_scheduler"
QA, QB = "runs_state_a", "runs_state_b"  # A older than B


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    c = await connect(database_url)
    await engine_schema.ensure_engine_schema(c)
    await Store(SCHEMA).migrate(c)
    await engine.ensure_queue(c, QA, record=None)
    await c.execute(
        f"insert into {SCHEMA}.releases (queue, status, created_at)"
        " values ($1, 'claiming', now() - interval '1 hour'), ($2, 'claiming', now())",
        QA,
        QB,
    )
    # A live worker of B whose app registers play p: A's parked runs are adoptable.
    await c.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid,"
        " concurrency, plays) values ('b1', 'b', $1, 'test', 1, 8, '{p}')",
        QB,
    )
    yield c
    await c.close()


async def run_on_a(c: asyncpg.Connection[asyncpg.Record], status: str) -> uuid.UUID:
    """Spawn a run of play p on A with its store row in ``status``; return its task id."""
    task_id: uuid.UUID = await c.fetchval(
        "select task_id from absurd.spawn_task($1, 'play-run', '{}'::jsonb, '{}'::jsonb)", QA
    )
    await c.execute(
        f"insert into {SCHEMA}.runs (run_id, play, input, launch, release_id, queue, task_id,"
        " status, max_attempts) values ($1, 'p', '{}', '{}', 'a', $2, $3, $4, 5)",
        uuid.uuid4(),
        QA,
        task_id,
        status,
    )
    return task_id


async def woken_parked_run(c: asyncpg.Connection[asyncpg.Record]) -> uuid.UUID:
    """A run of A parked in a sleep that is due now (its engine run `sleeping`, due)."""
    task_id = await run_on_a(c, "waiting")
    await c.execute(
        f"update absurd.r_{QA} set state = 'sleeping', available_at = now() - interval '1 s'"
        " where task_id = $1",
        task_id,
    )
    return task_id


@pytest.mark.parametrize("mode", [None, "all", "own"])
async def test_a_retired_lanes_own_loop_gets_only_what_needs_it_whatever_its_mode(
    conn: asyncpg.Connection[asyncpg.Record], mode: str | None
) -> None:
    """Retired: the fresh run, not the woken parked one (B's); claiming again: both."""
    parked = await woken_parked_run(conn)
    fresh = await run_on_a(conn, "queued")
    await conn.execute(f"update {SCHEMA}.releases set status = 'retired' where queue = $1", QA)

    async def claim() -> set[uuid.UUID]:
        claiming = conn.transaction()  # rolled back: each claim sees the same queue
        await claiming.start()
        batch = await engine.claim(
            conn, QA, "a1", lease_s=30, qty=8, mode=mode, store_schema=SCHEMA,
            own_queue=QA, plays=["p"], with_lanes=True,
        )  # fmt: skip
        await claiming.rollback()
        return {r.task_id for r in batch.runs}

    assert await claim() == {fresh}
    due = await engine.next_due_in_s(
        conn, QA, mode=mode, store_schema=SCHEMA, own_queue=QA, plays=["p"]
    )
    assert due is not None  # the fresh run, due since its spawn
    await conn.execute(f"update {SCHEMA}.runs set status = 'completed' where task_id = $1", fresh)
    await conn.execute(f"update absurd.r_{QA} set state = 'completed' where task_id = $1", fresh)
    assert (
        await engine.next_due_in_s(
            conn, QA, mode=mode, store_schema=SCHEMA, own_queue=QA, plays=["p"]
        )
        is None
    )  # the parked run is not A's to wake for

    await conn.execute(f"update {SCHEMA}.releases set status = 'claiming' where queue = $1", QA)
    assert await claim() == {parked}


async def test_a_retired_lanes_continuation_loop_is_served_as_draining(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A's loop on an older retired lane, asking 'adopt', is not handed that lane's parked run."""
    await engine.ensure_queue(conn, "runs_state_old", record=None)
    await conn.execute(
        f"insert into {SCHEMA}.releases (queue, status, created_at)"
        " values ('runs_state_old', 'retired', now() - interval '2 hours')"
    )
    task_id = await conn.fetchval(
        "select task_id from absurd.spawn_task('runs_state_old', 'play-run', '{}', '{}')"
    )
    await conn.execute(
        f"insert into {SCHEMA}.runs (run_id, play, input, launch, release_id, queue, task_id,"
        " status, max_attempts) values ($1, 'p', '{}', '{}', 'old', 'runs_state_old', $2,"
        " 'waiting', 5)",
        uuid.uuid4(),
        task_id,
    )
    await conn.execute(
        "update absurd.r_runs_state_old set state = 'sleeping', available_at = now()"
        " where task_id = $1",
        task_id,
    )

    async def adopt() -> int:
        claiming = conn.transaction()  # rolled back: each claim sees the same queue
        await claiming.start()
        batch = await engine.claim(
            conn, "runs_state_old", "a1:runs_state_old:continuations", lease_s=30, qty=8,
            mode=engine.CLAIM_ADOPT, store_schema=SCHEMA, own_queue=QA, plays=["p"],
        )  # fmt: skip
        await claiming.rollback()
        return len(batch.runs)

    assert await adopt() == 1  # A claims: the older lane's parked run is A's to adopt
    await conn.execute(f"update {SCHEMA}.releases set status = 'retired' where queue = $1", QA)
    assert await adopt() == 0  # A retired: nothing there is A's own
