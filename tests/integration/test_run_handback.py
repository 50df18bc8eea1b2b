"""Giving a claim back without spending an attempt (worker/run/handback.py), on real Postgres.

A run handed back mid-step after a sleep is queued again, not adoptable; a cancel
anywhere in a claim (lane_state, the attempt start, a defer, the completion) hands it
back, the engine run due again at attempt 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import pytest

from support.runtime import (
    SCHEMA,
    claim_one_undecided,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    sleepers_due,
    work_once,
)
from worker import App, TaskContext
from worker.db import engine
from worker.run.execute import Runtime

A, B, C = "rel-a", "rel-b", "rel-c"
QA = queue_of(A)


def gated_app(gate: asyncio.Event, entered: asyncio.Event) -> App:
    """A nap, then a step that waits for ``gate`` (``entered`` set when it starts)."""
    app = App()

    @app.play("gated")
    async def gated(ctx: TaskContext, params: Any) -> str:
        await ctx.sleep("nap", 0.2)

        async def held() -> str:
            entered.set()
            await gate.wait()
            return ctx.release_id

        return str(await ctx.step("held", held))

    return app


async def test_a_run_handed_back_mid_step_after_a_sleep_is_queued_not_adoptable(
    database_url: str,
) -> None:
    """Resumed from a sleep and handed back mid-step: queued, no wait recorded, B never takes it."""
    gate, entered = asyncio.Event(), asyncio.Event()
    app = gated_app(gate, entered)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        run = await client.submit("gated")
        assert await work_once(rt_a) == ["parked"]
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
            batch = await rt_a.claim(QA, 1)
            async with anyio.create_task_group() as tg:
                tg.start_soon(rt_a.handle, batch.runs[0])
                await entered.wait()  # mid-step, after the sleep resolved
                tg.cancel_scope.cancel()  # SIGTERM's drain
            row = await conn.fetchrow(
                f"select status, current_wait from {SCHEMA}.runs where run_id = $1::uuid",
                run.run_id,
            )
            await client.retire_release(A, force=True)
            outcomes = await work_once(rt_b, QA)
            engine_attempts = await conn.fetchval(f"select max(attempt) from absurd.r_{QA}")
        finally:
            await conn.close()
        status = await client.status(run.run_id)
        lanes = {lane.queue: lane for lane in await client.lanes()}
    assert dict(row) == {"status": "queued", "current_wait": None}
    assert outcomes == []  # not handed to B's continuation claim at all
    assert status.status == "queued"
    assert status.adopted_release_id is None
    assert [(a.disposition, a.outcome) for a in status.attempts] == [
        ("own", "parked"),
        ("own", "handed_back"),
    ]
    assert engine_attempts == 1
    assert (lanes[QA].queued, lanes[QA].waiting, lanes[QA].adoptable) == (1, 0, 0)


# -- a cancel at any point of a claim ------------------------------------------------------

Blocker = Callable[[Any, engine.ClaimedRun], Awaitable[None]]


async def lock_runs_table(conn: asyncpg.Connection[asyncpg.Record], claimed: Any) -> None:
    """Block every statement on the store's runs table (lane_state waits)."""
    await conn.execute(f"lock table {SCHEMA}.runs in access exclusive mode")


async def lock_run_row(conn: asyncpg.Connection[asyncpg.Record], claimed: Any) -> None:
    """Block writes of the run's store row (begin_attempt waits)."""
    await conn.execute(
        f"select 1 from {SCHEMA}.runs where task_id = $1 for update", claimed.task_id
    )


async def lock_engine_run(conn: asyncpg.Connection[asyncpg.Record], claimed: Any) -> None:
    """Block the engine run's row (the completion and the put-back wait)."""
    await conn.execute(
        f"select 1 from absurd.r_{claimed.queue} where run_id = $1 for update", claimed.run_id
    )


async def waiting_queries(url: str) -> list[str]:
    """Return the statements of this database's backends that wait for a lock."""
    conn = await connect(url)
    try:
        rows = await conn.fetch(
            "select query from pg_stat_activity"
            " where datname = current_database() and wait_event_type = 'Lock'"
        )
        return [r["query"] for r in rows]
    finally:
        await conn.close()


async def cancel_when_blocked(
    rt: Runtime,
    claimed: engine.ClaimedRun,
    url: str,
    blocker: Blocker,
    stepped: tuple[asyncio.Event, asyncio.Event] | None = None,
) -> None:
    """Handle ``claimed`` until it waits on ``blocker``'s lock, cancel it there, then unblock.

    With ``stepped`` (stepped, locked), the lock is taken once the play set ``stepped``
    (its step committed), and ``locked`` lets the play go on to its completion.
    """
    holder = await connect(url)
    tx = holder.transaction()
    await tx.start()
    scope = anyio.CancelScope()

    async def handle() -> None:
        with scope:
            await rt.handle(claimed)

    try:
        async with anyio.create_task_group() as tg:
            if stepped is None:
                await blocker(holder, claimed)
                tg.start_soon(handle)
            else:
                tg.start_soon(handle)
                await stepped[0].wait()
                await blocker(holder, claimed)
                stepped[1].set()
            blocked = await eventually(
                lambda: waiting_queries(url), what="the claim waiting on the lock"
            )
            scope.cancel()
            # Unblock only once the cancel has reached the blocked statement; the
            # shielded give-back may then wait for the same lock.
            await eventually(lambda: _gone(url, blocked[0]), what="the blocked statement cancelled")
            await tx.rollback()
    finally:
        await holder.close()


async def _gone(url: str, query: str) -> bool:
    """Tell whether no backend waits with ``query`` any more."""
    return query not in await waiting_queries(url)


def stepped_app(stepped: asyncio.Event, locked: asyncio.Event) -> App:
    """One step, then set ``stepped`` and complete once ``locked`` is set."""
    app = App()

    @app.play("one-step")
    async def one_step(ctx: TaskContext, params: Any) -> int:
        value = int(await ctx.step("s", lambda: 1))
        stepped.set()
        await locked.wait()
        return value

    return app


@pytest.mark.parametrize(
    ("point", "blocker", "loop"),
    [
        ("lane_state", lock_runs_table, "own"),
        ("begin_attempt", lock_run_row, "own"),
        ("completion", lock_engine_run, "own"),
        ("defer", lock_engine_run, "continuation"),
    ],
)
async def test_a_cancel_anywhere_in_a_claim_hands_it_back_without_spending_an_attempt(
    database_url: str, point: str, blocker: Blocker, loop: str
) -> None:
    """Cancelled in lane_state, the attempt start, a defer or the completion: handed back."""
    stepped, locked = asyncio.Event(), asyncio.Event()
    app = stepped_app(stepped, locked)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        run = await client.submit("one-step")
        conn = await connect(database_url)
        try:
            rt = rt_a
            if loop == "continuation":
                rt = rt_b
                await client.activate_release(A, force=True)  # lanes register in release order
                await client.activate_release(B, force=True)
                await client.retire_release(A, force=True)
                # A defer is a race now: the claim saw the run parked, and by the
                # decision its wait was gone. Stage that: due, "waiting" with no wait.
                await conn.execute(
                    f"update absurd.r_{QA} set state = 'sleeping', available_at = now()"
                )
                await conn.execute(f"update {SCHEMA}.runs set status = 'waiting'")
            if point in ("lane_state", "begin_attempt"):
                # Those two happen in `handle` for a claim that did not begin the
                # attempt itself (the own loop's claim begins what it surely owns).
                claimed = await claim_one_undecided(rt, QA)
            else:
                claimed = (await rt.claim(QA, 1)).runs[0]
            await cancel_when_blocked(
                rt,
                claimed,
                database_url,
                blocker,
                (stepped, locked) if point == "completion" else None,
            )
            engine_run = await conn.fetchrow(
                f"select state, attempt, available_at <= absurd.current_time() as due"
                f" from absurd.r_{QA} where run_id = $1",
                claimed.run_id,
            )
            engine_runs = await conn.fetchval(f"select count(*) from absurd.r_{QA}")
        finally:
            await conn.close()
        status = await client.status(run.run_id)
    assert dict(engine_run) == {"state": "sleeping", "attempt": 1, "due": True}
    assert engine_runs == 1  # no failed engine run: no attempt spent
    assert status.status == ("waiting" if point == "defer" else "queued")
    assert all(a.outcome is not None for a in status.attempts)
    if point in ("begin_attempt", "lane_state"):
        assert status.attempts == ()  # the attempt row never committed
    else:
        assert status.attempts[-1].outcome == "handed_back"
