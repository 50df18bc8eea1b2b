"""Detached runners (``ctx.run_detached``), on real Postgres with real Runtimes.

A run launches work elsewhere, parks on ``runner-terminal:<runId>:<runnerAttempt>``
and resumes with what the runner reported (stored on the runner attempt's row), or
timed out at its deadline. A late report of an attempt nobody waits on is recorded
and ignored; the current one wakes the run, also after a newer release adopted it.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    work_once,
)
from worker import App, DetachedRunner, TaskContext
from worker.client import LaneClient
from worker.errors import RunNotFoundError

A, B = "rel-det-a", "rel-det-b"


def runner_app(launched: list[DetachedRunner]) -> App:
    """``build``: one detached call; ``retrying``: a short one, then a second if it timed out."""
    app = App()

    def launch(runner: DetachedRunner) -> dict[str, Any]:
        launched.append(runner)
        return {"ticket": f"t-{runner.runner_attempt}"}

    @app.play("build")
    async def build(ctx: TaskContext, params: Any) -> Any:
        return await ctx.run_detached("build", launch, timeout=600)

    @app.play("retrying")
    async def retrying(ctx: TaskContext, params: Any) -> Any:
        first = await ctx.run_detached("try-1", launch, timeout=params["first_timeout"])
        if not first["timedOut"]:
            return first
        return await ctx.run_detached("try-2", launch, timeout=600)

    return app


async def status_of(client: LaneClient, run_id: str) -> str:
    return (await client.status(run_id)).status


async def test_the_runner_s_report_resumes_the_run_with_its_result(database_url: str) -> None:
    """Launch (runner attempt 1), park, report: the run completes with the stored result."""
    launched: list[DetachedRunner] = []
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, runner_app(launched), A) as rt,
    ):
        run_id = (await client.submit("build", {})).run_id
        assert await work_once(rt) == ["parked"]
        assert launched == [DetachedRunner(run_id, 1)]
        assert await status_of(client, run_id) == "waiting"
        said = await client.report_runner_result(run_id, 1, {"artifact": "s3://b/1"})
        assert (said.recorded, said.woke, said.reason) == (True, True, None)
        assert await work_once(rt) == ["completed"]
        final = await client.status(run_id)
    assert final.output == {
        "runnerAttempt": 1,
        "result": {"artifact": "s3://b/1"},
        "timedOut": False,
        "launched": {"ticket": "t-1"},
    }
    assert len(launched) == 1  # the launch step ran once


async def test_a_late_report_of_a_timed_out_attempt_is_recorded_and_never_wakes_the_next(
    database_url: str,
) -> None:
    """Attempt 1 times out and attempt 2 launches; 1's late report changes nothing; 2's wakes."""
    launched: list[DetachedRunner] = []
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, runner_app(launched), A) as rt,
    ):
        run_id = (await client.submit("retrying", {"first_timeout": 0.2})).run_id
        assert await work_once(rt) == ["parked"]

        async def second_launched() -> bool:
            await work_once(rt)
            return len(launched) == 2

        await eventually(second_launched, what="runner attempt 2 launched after the timeout")
        assert [r.runner_attempt for r in launched] == [1, 2]
        assert await status_of(client, run_id) == "waiting"

        late = await client.report_runner_result(run_id, 1, {"late": True})
        assert (late.recorded, late.woke) == (True, False)
        assert late.reason == "its wait timed out before the report"
        assert await work_once(rt) == []  # nothing woke
        assert await status_of(client, run_id) == "waiting"

        current = await client.report_runner_result(run_id, 2, {"ok": 2})
        assert current.woke
        again = await client.report_runner_result(run_id, 2, {"ok": "overwritten?"})
        assert (again.recorded, again.duplicate, again.woke) == (False, True, False)
        assert await work_once(rt) == ["completed"]
        final = await client.status(run_id)
    assert final.output["runnerAttempt"] == 2
    assert final.output["result"] == {"ok": 2}
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            f"select runner_attempt, state, result from {SCHEMA}.runner_attempts"
            " where run_id = $1 order by runner_attempt",
            uuid.UUID(run_id),
        )
    finally:
        await conn.close()
    assert [(r["state"], r["result"]) for r in rows] == [
        ("timed_out", {"late": True}),
        ("resolved", {"ok": 2}),
    ]


async def test_a_run_parked_on_a_runner_is_adopted_and_resumed_by_a_newer_release(
    database_url: str,
) -> None:
    """A parks on the runner and is retired; the report wakes the run and B adopts it."""
    launched: list[DetachedRunner] = []
    async with (
        open_client(database_url, env_of(A)) as client,
        open_runtime(database_url, runner_app(launched), A) as rt_a,
        open_runtime(database_url, runner_app(launched), B) as rt_b,
    ):
        await client.activate_release(A, force=True)
        await client.activate_release(B, force=True)
        await register_worker(rt_b)
        run_id = (await client.submit("build", {})).run_id
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        assert (await client.report_runner_result(run_id, 1, {"by": "runner"})).woke
        assert await work_once(rt_b, queue_of(A)) == ["completed"]
        final = await client.status(run_id)
    assert final.adopted_release_id == B
    assert final.output["result"] == {"by": "runner"}
    assert [a.disposition for a in final.attempts] == ["own", "adopt"]
    assert len(launched) == 1  # B replayed the launch step, it did not run it again


async def test_a_report_for_no_such_runner_attempt_is_refused(database_url: str) -> None:
    """An unknown run or runner attempt: RunNotFoundError (SQLSTATE P0002), nothing written."""
    async with open_client(database_url, env_of(A)) as client:
        run_id = (await client.submit("build", {})).run_id
        with pytest.raises(RunNotFoundError, match="has no runner attempt 3"):
            await client.report_runner_result(run_id, 3, {})
        with pytest.raises(RunNotFoundError):
            await client.report_runner_result(str(uuid.uuid4()), 1, {})
    conn = await connect(database_url)
    try:
        with pytest.raises(asyncpg.NoDataFoundError):
            await conn.fetchval(
                f"select {SCHEMA}.report_runner_result($1, 1, '{{}}')", uuid.UUID(run_id)
            )
        assert await conn.fetchval(f"select count(*) from {SCHEMA}.runner_attempts") == 0
    finally:
        await conn.close()
