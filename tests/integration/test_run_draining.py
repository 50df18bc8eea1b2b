"""A retired lane drains: its own workers claim exactly the runs only its release may run."""

from __future__ import annotations

from typing import Any

from support.runtime import (
    connect,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    work_once,
)
from worker import App, TaskContext

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
        rt_a.draining = True
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
        rt_a.draining = True

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
