"""Run safety, as an adversarial review attacked it: stray CancelledErrors, unstorable errors,
sleeps in task groups, adoption without the play, and adopted runs on a lane that claims again."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from support.runtime import (
    connect,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    sleepers_due,
    work_once,
    work_until,
)
from worker import App, TaskContext

A, B = "rel-a", "rel-b"
QA = queue_of(A)
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "3"}


async def test_a_play_raising_cancelled_error_fails_its_attempt_only(database_url: str) -> None:
    """A play that awaits a task it cancelled: that attempt fails, the runtime goes on."""
    app = App()

    @app.play("self-cancel")
    async def self_cancel(ctx: TaskContext, params: Any) -> None:
        task = asyncio.ensure_future(asyncio.sleep(60))
        task.cancel()
        await task  # raises CancelledError into the play

    @app.play("fine")
    async def fine(ctx: TaskContext, params: Any) -> int:
        return int(await ctx.step("one", lambda: 1))

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt,
    ):
        bad = await client.submit("self-cancel")
        assert await work_once(rt) == ["retrying"]
        good = await client.submit("fine")
        assert await work_once(rt) == ["completed"]
        bad_status = await client.status(bad.run_id)
        good_status = await client.status(good.run_id)
    assert bad_status.status == "retrying"
    assert bad_status.error["name"] == "CancelledError"
    assert good_status.status == "completed"


async def test_an_error_whose_message_is_not_utf8_fails_the_attempt(database_url: str) -> None:
    """A lone surrogate in an error message (a surrogateescape'd file name) is stored escaped."""
    app = App()

    @app.play("missing-file")
    async def missing_file(ctx: TaskContext, params: Any) -> None:
        name = b"caf\xff.txt".decode("utf-8", "surrogateescape")
        raise FileNotFoundError(f"no such file: {name}")

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt,
    ):
        run = await client.submit("missing-file")
        assert await work_once(rt) == ["retrying"]
        status = await client.status(run.run_id)
    assert status.error == {"name": "FileNotFoundError", "message": "no such file: caf\\udcff.txt"}


async def test_a_sleep_inside_a_task_group_parks_without_spending_an_attempt(
    database_url: str,
) -> None:
    """``ctx.sleep`` next to a step in an asyncio.TaskGroup parks; the engine attempt stays 1."""
    app = App()
    calls: list[str] = []

    @app.play("grouped")
    async def grouped(ctx: TaskContext, params: Any) -> str:
        async with asyncio.TaskGroup() as group:
            group.create_task(ctx.step("side", lambda: calls.append("side")))
            group.create_task(ctx.sleep("nap", 0.3))
        return "done"

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt,
    ):
        run = await client.submit("grouped")
        assert await work_once(rt) == ["parked"]
        await work_until(rt, "completed")
        status = await client.status(run.run_id)
    assert status.status == "completed"
    assert [(a.attempt, a.outcome) for a in status.attempts] == [(1, "parked"), (1, "completed")]


def napping_app(name: str, naps: int = 1) -> App:
    """Play ``name``: a step, then ``naps`` times a 0.3 s nap and a step; returns who ran each."""
    app = App()

    @app.play(name)
    async def nap(ctx: TaskContext, params: Any) -> list[str]:
        ran = [await ctx.step("first", lambda: ctx.release_id)]
        for n in range(naps):
            await ctx.sleep(f"nap-{n}", 0.3)
            ran.append(await ctx.step(f"after-{n}", lambda: ctx.release_id))
        return ran

    return app


async def test_a_parked_run_whose_play_the_newer_release_lacks_stays_with_its_own_lane(
    database_url: str,
) -> None:
    """B lacks the play: B never adopts it; A stays draining and its own worker finishes it."""
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, napping_app("only-in-a"), A) as rt_a,
        open_runtime(database_url, napping_app("something-else"), B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b)  # B is live, and registers its plays
        run = await client.submit("only-in-a")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        rt_a.draining = True
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        assert await work_once(rt_b, QA) == []  # not handed to B at all
        assert await work_once(rt_a) == ["completed"]
        status = await client.status(run.run_id)
    assert lanes[QA] == "draining"  # B cannot adopt it: only A may run it
    assert status.output == [A, A]
    assert status.adopted_release_id is None


async def test_adopting_without_the_play_in_a_race_defers_and_counts(database_url: str) -> None:
    """Handed a parked run whose play it lacks (a race), B defers it, never fails it."""
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, napping_app("only-in-a"), A) as rt_a,
        open_runtime(database_url, napping_app("something-else"), B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        run = await client.submit("only-in-a")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        rt_b.plays = ["only-in-a"]  # the claim believes B has it: the race
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        with structlog.testing.capture_logs() as logs:
            assert await work_once(rt_b, QA) == ["deferred"]
        status = await client.status(run.run_id)
    assert status.status == "waiting"
    assert [(a.release_id, a.disposition) for a in status.attempts] == [(A, "own"), (B, "defer")]
    (deferred,) = [e for e in logs if e["event"] == "run.deferred"]
    assert "only-in-a" in deferred["reason"]
    assert B in deferred["reason"]


async def test_a_lane_activated_again_leaves_its_adopted_runs_to_their_adopter(
    database_url: str,
) -> None:
    """B adopted A's run; `lanes activate A`: A's own loop never runs it again, B finishes it."""
    app = App()
    executed: list[tuple[str, str]] = []

    @app.play("two-naps")
    async def two_naps(ctx: TaskContext, params: Any) -> None:
        for step in ("one", "two", "three"):
            await ctx.step(step, lambda s=step: executed.append((s, ctx.release_id)))
            if step != "three":
                await ctx.sleep(f"nap-{step}", 0.3)

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        run = await client.submit("two-naps")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await work_until(rt_b, "parked", queue=QA)  # B adopted it at nap-one
        await client.activate_release(A, force=True)  # a rollback: A claims again
        rt_b.claiming_queues = frozenset({QA})  # as B's registry refresh sees it
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="nap-two due")
        finally:
            await conn.close()
        # A's own loop (the engine's claim) is handed it once, gives it to B, and
        # skips it from then on.
        assert await work_once(rt_a) == ["deferred"]
        assert rt_a.foreign_adoptees
        assert await work_once(rt_a) == []

        async def b_finished() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_finished, what="B to finish its adopted run on a claiming lane")
        status = await client.status(run.run_id)
    assert executed == [("one", A), ("two", B), ("three", B)]
    assert status.status == "completed"


async def test_a_machine_of_the_adopter_without_the_play_never_fails_its_adoptee(
    database_url: str,
) -> None:
    """B adopted the run; another B machine whose app lacks the play is never handed it."""
    full, partial = napping_app("only-in-full", naps=2), napping_app("something-else")
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, full, A) as rt_a,
        open_runtime(database_url, full, B, worker_base="b-full") as rt_b_full,
        open_runtime(database_url, partial, B, worker_base="b-partial") as rt_b_partial,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_b_full)
        run = await client.submit("only-in-full")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await eventually(lambda: _adopted_and_parked(rt_b_full), what="B adopting the run")
        assert (await client.status(run.run_id)).status == "waiting"  # parked at nap-1
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, QA), what="the nap due")
        finally:
            await conn.close()
        assert await work_once(rt_b_partial, QA) == []
        # A race (the claim thought it had the play): deferred, never failed for good.
        rt_b_partial.plays = ["only-in-full"]
        assert await work_once(rt_b_partial, QA) == ["deferred"]
        status = await client.status(run.run_id)
    assert status.status == "waiting"
    assert status.adopted_release_id == B


async def _adopted_and_parked(rt: Any) -> bool:
    """Claim on A's queue with ``rt``; tell whether a run parked (adopted at the nap)."""
    outcomes = await work_once(rt, QA)
    return "parked" in outcomes or "completed" in outcomes


async def test_a_rollback_keeps_the_retired_adopter_draining_for_its_adoptee(
    database_url: str,
) -> None:
    """B adopted A's run; `activate A`, `retire B`: B stays draining and finishes it itself."""
    app = napping_app("loop", naps=2)
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_a)
        await register_worker(rt_b)
        run = await client.submit("loop")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A, force=True)
        await eventually(lambda: _adopted_and_parked(rt_b), what="B adopting the run")
        await client.activate_release(A, force=True)
        await client.retire_release(B, force=True)
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        rt_b.draining = True
        rt_a.foreign_adoptees = True
        assert await work_once(rt_a) == []  # A never takes back B's adoptee

        async def b_finished() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_finished, what="retired B to finish its adoptee")
        status = await client.status(run.run_id)
    assert lanes[queue_of(B)] == "draining"
    assert status.output == [A, B, B]


async def test_an_older_release_never_adopts_a_newer_release_s_parked_run(
    database_url: str,
) -> None:
    """B's deploy is aborted (B retired while A claims): A is not handed B's parked run."""
    app = napping_app("loop")
    async with (
        open_client(database_url, {**ENV_A, "DEEPLINE_RUNTIME_DEPLOY_VERSION": B}) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # A's lane exists first: it is the older one
        await client.activate_release(B, force=True)
        await register_worker(rt_a)
        run = await client.submit("loop")
        assert await work_once(rt_b) == ["parked"]
        await client.retire_release(B, force=True)
        conn = await connect(database_url)
        try:
            await eventually(lambda: sleepers_due(conn, queue_of(B)), what="the nap due")
        finally:
            await conn.close()
        assert await work_once(rt_a, queue_of(B)) == []
        lanes = {lane.queue: lane.status for lane in await client.lanes()}
        rt_b.draining = True
        assert await work_once(rt_b) == ["completed"]
        status = await client.status(run.run_id)
    assert lanes[queue_of(B)] == "draining"  # nothing newer can adopt it
    assert status.output == [B, B]


async def test_a_database_password_in_a_play_error_is_masked_before_it_is_stored(
    database_url: str,
) -> None:
    """A driver message quoting the URL's password is stored (and shown) with ``***``."""
    with_password = database_url.replace("postgres@", "postgres:S3cret%2FPw@", 1)
    assert with_password != database_url
    app = App()

    @app.play("leaky")
    async def leaky(ctx: TaskContext, params: Any) -> None:
        raise RuntimeError("could not connect with S3cret/Pw (S3cret%2FPw)")

    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(with_password, app, A) as rt,
    ):
        run = await client.submit("leaky")
        assert await work_once(rt) == ["retrying"]
        status = await client.status(run.run_id)
        stored = await rt.db.fetchval(
            "select error::text from runtime_scheduler.attempts where run_id = $1::uuid", run.run_id
        )
    assert status.error["message"] == "could not connect with *** (***)"
    assert "S3cret" not in stored
