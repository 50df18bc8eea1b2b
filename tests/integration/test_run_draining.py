"""A retired lane drains: its own workers claim exactly the runs only its release may run."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from support.runtime import (
    SCHEMA,
    connect,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    set_policy,
    work_once,
)
from worker import App, TaskContext
from worker.client import LaneClient
from worker.db import engine
from worker.db.store import Store
from worker.run.execute import Runtime
from worker.run.handle import STEP_KEYS_CURRENT

A, B = "rel-a", "rel-b"
QA = queue_of(A)
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "5"}


def drain_app(failures: dict[str, int]) -> App:
    """Plays: `plain` (one step), `napper` (a step, a 0.3 s sleep, a step), `flaky` (fails once)."""
    app = App()

    @app.play("plain")
    async def plain(ctx: TaskContext, params: Any) -> str:
        return str(await ctx.step("s", lambda: ctx.release_id))

    @app.play("napper")
    async def napper(ctx: TaskContext, params: Any) -> list[str]:
        first = await ctx.step("first", lambda: ctx.release_id)
        await ctx.sleep("nap", 0.3)
        return [first, await ctx.step("second", lambda: ctx.release_id)]

    @app.play("flaky")
    async def flaky(ctx: TaskContext, params: Any) -> str:
        def once() -> str:
            failures["flaky"] = failures.get("flaky", 0) + 1
            if failures["flaky"] == 1:
                raise RuntimeError("first try fails")
            return ctx.release_id

        return str(await ctx.step("once", once))

    return app


async def test_a_draining_lane_finishes_its_own_work_and_leaves_parked_runs_to_b(
    database_url: str,
) -> None:
    """Retired A claims fresh runs and its retry, not its parked run; B adopts that; A drains."""
    app = drain_app({})
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b)  # B is live and registers the plays: it adopts them
        napper = await client.submit("napper")
        flaky = await client.submit("flaky")
        assert sorted(await work_once(rt_a)) == ["parked", "retrying"]
        fresh = await client.submit("plain")
        await client.retire_release(A, force=True)
        set_policy(rt_a, draining=True)
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        assert lanes[QA] == "draining"

        async def a_finished_its_own() -> bool:
            await work_once(rt_a)
            statuses = {(await client.status(r.run_id)).status for r in (flaky, fresh)}
            return statuses == {"completed"}

        await eventually(a_finished_its_own, what="A to finish its fresh run and its retry")
        napper_status = await client.status(napper.run_id)
        assert napper_status.status == "waiting"  # A left it alone, though it came due
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        assert lanes[QA] == "drained"

        async def b_adopted() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_adopted, what="B to adopt the parked run")
        statuses = {r.run_id: await client.status(r.run_id) for r in (napper, flaky, fresh)}
    assert statuses[napper.run_id].output == [A, B]
    assert statuses[flaky.run_id].output == A
    assert statuses[fresh.run_id].output == A
    assert [a.release_id for a in statuses[napper.run_id].attempts] == [A, B]


async def test_a_draining_lane_never_takes_a_run_adopted_by_another(
    database_url: str,
) -> None:
    """B adopts A's run, which then fails once: retired A never claims its retry, B does."""
    failures: dict[str, int] = {}
    app = drain_app(failures)

    @app.play("nap-then-flaky")
    async def nap_then_flaky(ctx: TaskContext, params: Any) -> str:
        await ctx.sleep("nap", 0.3)

        def once() -> str:
            failures["after-nap"] = failures.get("after-nap", 0) + 1
            if failures["after-nap"] == 1:
                raise RuntimeError("first try after the nap fails")
            return ctx.release_id

        return str(await ctx.step("once", once))

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        run = await client.submit("nap-then-flaky")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        set_policy(rt_a, draining=True)

        async def adopted_and_failed() -> bool:
            return "retrying" in await work_once(rt_b, QA)

        await eventually(adopted_and_failed, what="B to adopt the run and fail its step")
        conn = await connect(database_url)
        try:  # the retry is due now: whoever claims first would take it
            await conn.execute(
                f"update absurd.r_{QA} set available_at = now() where state = 'sleeping'"
            )
        finally:
            await conn.close()
        assert await work_once(rt_a) == []
        assert await work_once(rt_b, QA) == ["completed"]
        status = await client.status(run.run_id)
    assert status.output == B
    assert [(a.release_id, a.disposition, a.outcome) for a in status.attempts] == [
        (A, "own", "parked"),
        (B, "adopt", "retrying"),
        (B, "own", "completed"),
    ]


async def _a_lane_write_waits_for_a_lock(url: str) -> bool:
    """Tell whether some session's statement on the lane registry waits for a lock."""
    conn = await connect(url)
    try:
        return bool(
            await conn.fetchval(
                "select exists (select 1 from pg_stat_activity where datname = current_database()"
                " and wait_event_type = 'Lock' and query like '%releases%')"
            )
        )
    finally:
        await conn.close()


async def _woken_parked_run_of_a(
    client: LaneClient, rt_a: Runtime, claimer: asyncpg.Connection[asyncpg.Record]
) -> str:
    """A's napper, parked by A and due now (the claiming release may take it again)."""
    napper = await client.submit("napper")
    assert await work_once(rt_a) == ["parked"]
    await claimer.execute(f"update absurd.r_{QA} set available_at = now() where state = 'sleeping'")
    return napper.run_id


async def _claim_as_as_own_loop(
    rt_a: Runtime, claimer: asyncpg.Connection[asyncpg.Record]
) -> engine.ClaimBatch:
    """Claim on ``claimer`` exactly as A's own loop does (its facts, its attempts begun)."""
    worker_id = rt_a.worker_id_for(QA)
    return await engine.claim(
        claimer, QA, worker_id, lease_s=30, qty=8, mode=rt_a.claim_mode(QA),
        store_schema=SCHEMA, own_queue=QA, plays=rt_a.plays, with_lanes=True,
        begin=engine.BeginOwn(A, worker_id, STEP_KEYS_CURRENT),
    )  # fmt: skip


async def test_a_retirement_waits_for_a_claim_in_flight_and_the_verdict_sees_its_run(
    database_url: str,
) -> None:
    """A's claim, open across the retirement, holds it up; `lanes wait` then says draining.

    Review D7: the claim read A's lane as claiming without a lock, so a claim of a
    woken parked run that committed after the retirement was invisible to the
    report's read: A was "safe to stop" while it started the run. Now the claim
    share-locks A's lane row until it commits, and a retirement's update of that
    row (here the store's own statement, as the scaler's retire_superseded writes
    it: nothing else of the lane) waits for it, so the report sees the run A began.
    """
    app = drain_app({})
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b)  # B adopts A's parked runs once A is retired
        claimer = await connect(database_url)
        retirer = await connect(database_url)
        try:
            run_id = await _woken_parked_run_of_a(client, rt_a, claimer)
            async with claimer.transaction():
                batch = await _claim_as_as_own_loop(rt_a, claimer)
                assert [r.begun is not None for r in batch.runs] == [True]
                retire = asyncio.create_task(
                    Store(SCHEMA).lanes.set_status(
                        retirer, queue=QA, status="retired", release_id=A
                    )
                )

                async def retire_waits() -> bool:
                    assert not retire.done(), "the retirement did not wait for the claim"
                    return await _a_lane_write_waits_for_a_lock(database_url)

                await eventually(retire_waits, what="the retirement to wait for the claim")
            assert await retire == "retired"
        finally:
            await claimer.close()
            await retirer.close()
        view = await client.lane(A)
        assert view.status == "draining"
        assert not view.safe_to_stop
        assert (await client.status(run_id)).status == "running"


async def test_lanes_retire_never_deadlocks_with_a_claim_that_holds_the_lane(
    database_url: str,
) -> None:
    """`lanes retire` writes the lane row before it makes sure of the queue's tables.

    A claim share-locks its lane row first and writes the queue's tables after.
    The retirement made sure of the queue first (its index checks share-lock those
    tables), then waited for the row: a claim between its two steps then waited
    for the tables, a deadlock. Now the row comes first: the retirement waits for
    the claim, which finishes; then the report sees the run it began.
    """
    app = drain_app({})
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        await register_worker(rt_b)
        claimer = await connect(database_url)
        # No retries: a deadlock's victim would be retried unseen (40P01 is transient).
        retirer = await LaneClient.connect(database_url, env=ENV_A, retry_for_s=0)
        try:
            run_id = await _woken_parked_run_of_a(client, rt_a, claimer)
            async with claimer.transaction():
                # The claim's first step (claim_v1.sql), as one claim in flight is
                # when the retirement begins.
                await claimer.execute(
                    f"select 1 from {SCHEMA}.releases where queue = $1 for share", QA
                )
                retire = asyncio.create_task(retirer.retire_release(A))
                await eventually(
                    lambda: _a_lane_write_waits_for_a_lock(database_url),
                    what="the retirement to wait for the claim's lane lock",
                )
                batch = await _claim_as_as_own_loop(rt_a, claimer)  # the claim's next steps
                assert [r.begun is not None for r in batch.runs] == [True]
                assert not retire.done()
            await retire
        finally:
            await claimer.close()
            await retirer.close()
        view = await client.lane(A)
        assert view.status == "draining"
        assert not view.safe_to_stop
        assert (await client.status(run_id)).status == "running"
