"""Run safety through the runtime on real Postgres: adopters keep their runs, resumed runs are not
parked, sync steps leave the loop free, and a cancel at any point gives the claim back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import pytest
import structlog

from support.runtime import (
    SCHEMA,
    connect,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    sleepers_due,
    work_once,
    work_until,
)
from worker import App, TaskContext
from worker.db import engine
from worker.run.execute import Runtime

A, B, C = "rel-a", "rel-b", "rel-c"
QA = queue_of(A)


def env_of(release: str) -> dict[str, str]:
    """The client environment that stamps ``release``."""
    return {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release}


def naps_app(executed: list[tuple[str, str]]) -> App:
    """A step, a nap, a step, a nap, a step; each step records (step, release)."""
    app = App()

    @app.play("naps")
    async def naps(ctx: TaskContext, params: Any) -> list[str]:
        def mark(step: str) -> str:
            executed.append((step, ctx.release_id))
            return ctx.release_id

        one = await ctx.step("one", lambda: mark("one"))
        await ctx.sleep("nap-1", 0.3)
        two = await ctx.step("two", lambda: mark("two"))
        await ctx.sleep("nap-2", 0.3)
        three = await ctx.step("three", lambda: mark("three"))
        return [one, two, three]

    return app


async def test_a_third_release_never_takes_a_run_its_adopter_still_claims(
    database_url: str,
) -> None:
    """A retired; B adopts; when the run wakes again C's loop is not handed it, B finishes it."""
    executed: list[tuple[str, str]] = []
    app = naps_app(executed)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
        open_runtime(database_url, app, C) as rt_c,
    ):
        for release in (A, B, C):  # registered in release order, as their workers boot
            await client.activate_release(release, force=True)
        run = await client.submit("naps")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="nap-1 due")
            with structlog.testing.capture_logs() as logs:
                # B adopts at nap-1 and parks at nap-2.
                assert await work_until(rt_b, "parked", queue=QA) == ["parked"]
                await eventually(lambda: sleepers_due(conn, QA), what="nap-2 due")
                assert await work_once(rt_c, QA) == []  # skipped by C's claim
                assert await work_once(rt_b, QA) == ["completed"]
        finally:
            await conn.close()
        status = await client.status(run.run_id)
    assert status.status == "completed"
    assert status.adopted_release_id == B
    assert executed == [("one", A), ("two", B), ("three", B)]
    assert [(a.release_id, a.disposition, a.outcome) for a in status.attempts] == [
        (A, "own", "parked"),
        (B, "adopt", "parked"),
        (B, "own", "completed"),
    ]
    assert not [e for e in logs if e["event"] in ("lane.refused", "run.deferred")]


async def test_a_race_for_an_adopted_run_gives_it_back_quietly_at_once(database_url: str) -> None:
    """C claimed B's adopted run while B was retired; B claims again: C gives it back quietly."""
    executed: list[tuple[str, str]] = []
    app = naps_app(executed)
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
        open_runtime(database_url, app, C) as rt_c,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await client.activate_release(C, force=True)
        run = await client.submit("naps")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await work_until(rt_b, "parked", queue=QA)  # adopted by B, parked at nap-2
        await client.retire_release(B, force=True)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="nap-2 due")
            batch = await rt_c.claim(QA, 1)  # allowed: B's lane is retired now
            assert len(batch.runs) == 1
            await client.activate_release(B, force=True)
            with structlog.testing.capture_logs() as logs:
                handled = await rt_c.handle(batch.runs[0])
            state = await conn.fetchrow(
                f"select state, attempt, available_at <= absurd.current_time() as due"
                f" from absurd.r_{QA} where run_id = $1",
                batch.runs[0].run_id,
            )
        finally:
            await conn.close()
        assert await work_once(rt_b, QA) == ["completed"]
        status = await client.status(run.run_id)
    assert (handled.disposition, handled.outcome) == ("defer", "deferred")
    assert dict(state) == {"state": "sleeping", "attempt": 1, "due": True}
    assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == []
    assert "run.left_to_adopter" in [e["event"] for e in logs]
    assert status.status == "completed"
    assert executed == [("one", A), ("two", B), ("three", B)]


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


class LeaseWatch:
    """Watches one engine run's lease from its own thread and event loop (not the worker's)."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue
        self.expired_while_running = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._watch()), daemon=True)

    async def _watch(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            while not self.stop.is_set():
                if await conn.fetchval(
                    f"select exists (select 1 from absurd.r_{self.queue} where state = 'running'"
                    " and claim_expires_at < clock_timestamp())"
                ):
                    self.expired_while_running = True
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    def __enter__(self) -> LeaseWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


async def test_a_sync_step_longer_than_the_lease_runs_once_and_others_progress(
    database_url: str,
) -> None:
    """A blocking sync step twice the lease: lease kept, one execution, one attempt; others run."""
    calls: Counter[str] = Counter()
    finished: dict[str, float] = {}
    app = App()

    @app.play("blocking")
    async def blocking(ctx: TaskContext, params: Any) -> str:
        def slow() -> str:
            calls["slow"] += 1
            time.sleep(4.5)  # a sync client call that does not yield
            return "done"

        result = str(await ctx.step("slow", slow))
        finished["blocking"] = time.monotonic()
        return result

    @app.play("quick")
    async def quick(ctx: TaskContext, params: Any) -> int:
        value = int(await ctx.step("q", lambda: 1))
        finished["quick"] = time.monotonic()
        return value

    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, app, A, lease_s=2) as rt,
    ):
        slow_run = await client.submit("blocking")
        batch = await rt.claim(QA, 1)
        with LeaseWatch(database_url, QA) as watch:
            async with anyio.create_task_group() as tg:
                tg.start_soon(rt.handle, batch.runs[0])
                quick_run = await client.submit("quick")
                assert await work_until(rt, "completed") == ["completed"]
        slow_status = await client.status(slow_run.run_id)
        quick_status = await client.status(quick_run.run_id)
    assert not watch.expired_while_running
    assert calls == Counter({"slow": 1})
    assert slow_status.status == quick_status.status == "completed"
    assert [(a.attempt, a.outcome) for a in slow_status.attempts] == [(1, "completed")]
    assert finished["quick"] < finished["blocking"]


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
