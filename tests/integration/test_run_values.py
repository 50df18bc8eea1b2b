"""What a play hands the engine and what it is handed back, at their limits, on real Postgres.

Durations past the engine's int32 seconds park (clamped to about 68 years)
instead of failing every attempt (issue 34 item 6), an int past a double's range
and a runner's inf timeout too; a duration that can never be right (no number, or
a runner timeout of 0 or less) fails the run for good at the call, saying so
(review D8). A reused ``run_detached`` name is the next call, as a reused step
name is the next step (issue 29 §4). A payload the engine hands back that a run
could not keep fails that run for good.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest

from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    work_once,
)
from worker import App, DetachedRunner, TaskContext

REL = "rel-values"


def values_app(launched: list[DetachedRunner]) -> App:
    """Plays that wait very long, sleep for no number, and relaunch under one name."""
    app = App()

    @app.play("wait-long")
    async def wait_long(ctx: TaskContext, params: Any) -> Any:
        return await ctx.wait_for_event("gate", "go", timeout=params["timeout"])

    @app.play("sleep-long")
    async def sleep_long(ctx: TaskContext, params: Any) -> None:
        await ctx.sleep("nap", params["seconds"])

    @app.play("sleep-nan")
    async def sleep_nan(ctx: TaskContext, params: Any) -> None:
        await ctx.sleep("nap", float("nan"))

    @app.play("extreme")
    async def extreme(ctx: TaskContext, params: Any) -> Any:
        # JSON has no NaN, inf or 400-digit int that stays one: the play makes them.
        value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "huge": 10**400,
                 "-huge": -(10**400), "zero": 0, "text": "5"}[params["value"]]  # fmt: skip
        if params["call"] == "sleep":
            await ctx.sleep("nap", value)
            return None
        if params["call"] == "wait":
            return await ctx.wait_for_event("gate", "go", timeout=value)
        return await ctx.run_detached("job", launch, timeout=value)

    @app.play("detached")
    async def detached(ctx: TaskContext, params: Any) -> Any:
        return await ctx.run_detached("job", launch, timeout=params.get("timeout", 600))

    def launch(runner: DetachedRunner) -> dict[str, Any]:
        launched.append(runner)
        return {"ticket": runner.runner_attempt}

    @app.play("relaunch")
    async def relaunch(ctx: TaskContext, params: Any) -> Any:
        # The loop of the issue: until a runner reports in time, under one name.
        done = await ctx.run_detached("job", launch, timeout=params["timeout"])
        tries = 1
        while done["timedOut"] and tries < 3:
            done = await ctx.run_detached("job", launch, timeout=600)
            tries += 1
        return {"tries": tries, "done": done}

    return app


async def test_waits_longer_than_the_engine_counts_park(database_url: str) -> None:
    """A 1e10 s event timeout, a 1e13 s sleep and a 1e10 s runner wait each park at once."""
    launched: list[DetachedRunner] = []
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app(launched), REL) as rt,
    ):
        waiter = (await client.submit("wait-long", {"timeout": 1e10})).run_id
        sleeper = (await client.submit("sleep-long", {"seconds": 1e13})).run_id
        detached = (await client.submit("detached", {"timeout": 1e10})).run_id
        assert sorted(await work_once(rt)) == ["parked"] * 3
        for run_id in (waiter, sleeper, detached):
            assert (await client.status(run_id)).status == "waiting"
        # The event still wakes the run, which resumes from the store's signal.
        await client.signal(waiter, "go", {"by": "ada"})
        assert await work_once(rt) == ["completed"]
        output = (await client.status(waiter)).output
    assert (output["timed_out"], output["by"]) == (False, "ada")


async def _attempt_errors(url: str, run_id: str) -> list[str]:
    conn = await connect(url)
    try:
        rows = await conn.fetch(
            f"select error from {SCHEMA}.attempts where run_id = $1 order by attempt_id",
            uuid.UUID(run_id),
        )
    finally:
        await conn.close()
    return [r["error"]["message"] for r in rows]


async def test_a_sleep_of_no_number_fails_the_run_for_good_saying_so(database_url: str) -> None:
    """sleep(nan) raises at the call: the run fails for good with the reason, nothing parks.

    Review D8: it failed the attempt, and every attempt after it computed NaN again
    until the last one.
    """
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app([]), REL) as rt,
    ):
        run_id = (await client.submit("sleep-nan", {})).run_id
        assert await work_once(rt) == ["failed"]
        assert (await client.status(run_id)).status == "failed"
        errors = await _attempt_errors(database_url, run_id)
    assert len(errors) == 1
    assert "sleep needs a number of seconds, not nan; the run fails for good" in errors[0]


@pytest.mark.parametrize("call", ["sleep", "wait", "detached"])
@pytest.mark.parametrize("value", ["nan", "text"])
async def test_a_duration_that_is_no_number_fails_the_run_for_good(
    database_url: str, call: str, value: str
) -> None:
    """NaN or a string as a sleep, an event timeout or a runner timeout: one attempt, failed."""
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app([]), REL) as rt,
    ):
        run_id = (await client.submit("extreme", {"call": call, "value": value})).run_id
        assert await work_once(rt) == ["failed"]
        errors = await _attempt_errors(database_url, run_id)
    assert len(errors) == 1
    assert "the run fails for good" in errors[0]


@pytest.mark.parametrize("value", ["zero", "-inf", "-huge"])
async def test_a_runner_timeout_of_zero_or_less_fails_the_run_for_good(
    database_url: str, value: str
) -> None:
    """run_detached's timeout must be above 0: anything else can never be, so no retries."""
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app([]), REL) as rt,
    ):
        run_id = (await client.submit("extreme", {"call": "detached", "value": value})).run_id
        assert await work_once(rt) == ["failed"]
        errors = await _attempt_errors(database_url, run_id)
    assert len(errors) == 1
    assert "run_detached needs a timeout in seconds above 0" in errors[0]


@pytest.mark.parametrize(
    ("call", "value"),
    [("sleep", "huge"), ("wait", "huge"), ("detached", "huge"), ("detached", "inf")],
)
async def test_an_int_past_a_double_or_an_infinite_runner_wait_parks_as_long_as_can_be(
    database_url: str, call: str, value: str
) -> None:
    """10**400 s (no double holds it) and a runner's inf wait park, clamped as 1e300 is.

    Review D8: run_detached refused inf and raised OverflowError on the int, each
    retried through every attempt.
    """
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app([]), REL) as rt,
    ):
        run_id = (await client.submit("extreme", {"call": call, "value": value})).run_id
        assert await work_once(rt) == ["parked"]
        status = await client.status(run_id)
    assert status.status == "waiting"


async def test_a_reused_detached_name_is_the_next_call(database_url: str) -> None:
    """After a timeout, run_detached("job") again launches runner attempt 2 and waits for it."""
    launched: list[DetachedRunner] = []
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app(launched), REL) as rt,
    ):
        run_id = (await client.submit("relaunch", {"timeout": 0.2})).run_id
        assert await work_once(rt) == ["parked"]

        async def relaunched() -> bool:
            await work_once(rt)
            return len(launched) >= 2

        await eventually(relaunched, what="runner attempt 2 launched after the timeout")
        assert [r.runner_attempt for r in launched] == [1, 2]
        assert (await client.status(run_id)).status == "waiting"
        late = await client.report_runner_result(run_id, 1, {"late": True})
        assert late.woke is False
        said = await client.report_runner_result(run_id, 2, {"ok": 2})
        assert said.woke is True
        assert await work_once(rt) == ["completed"]
        output = (await client.status(run_id)).output
    assert output["tries"] == 2
    assert output["done"] == {
        "runnerAttempt": 2,
        "result": {"ok": 2},
        "timedOut": False,
        "launched": {"ticket": 2},
    }
    assert len(launched) == 2  # a replay launched nothing again


async def test_an_engine_payload_the_run_cannot_keep_fails_it_for_good(database_url: str) -> None:
    """An event emitted straight to the engine, 600 levels deep: the run fails, saying why."""
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app([]), REL) as rt,
    ):
        run_id = (await client.submit("wait-long", {"timeout": 600})).run_id
        assert await work_once(rt) == ["parked"]
        conn = await connect(database_url)
        try:
            await conn.execute(
                "select absurd.emit_event($1, $2, $3::text::jsonb)",
                queue_of(REL),
                f"evt:{run_id}:go",
                '{"deep": ' + "[" * 600 + "]" * 600 + "}",
            )
        finally:
            await conn.close()
        assert await work_once(rt) == ["failed"]
        final = await client.status(run_id)
    assert final.status == "failed"
    assert "the payload of event 'go' cannot be stored" in final.error["message"]
    assert "deeper than 512 levels" in final.error["message"]


async def test_a_runner_result_no_worker_can_read_fails_its_run_alone(database_url: str) -> None:
    """A report written straight to its row, 3,000 deep: that run fails for good, saying which."""
    launched: list[DetachedRunner] = []
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, values_app(launched), REL) as rt,
    ):
        run_id = (await client.submit("detached", {})).run_id
        assert await work_once(rt) == ["parked"]
        conn = await connect(database_url)
        try:
            # As report_runner_result recorded it before store migration 0019.
            await conn.execute(
                f"update {SCHEMA}.runner_attempts set result = $2::text::jsonb,"
                " reported_at = now() where run_id = $1 and runner_attempt = 1",
                uuid.UUID(run_id),
                "[" * 3000 + "]" * 3000,
            )
            await conn.execute(
                "select absurd.emit_event($1, $2, null)",
                queue_of(REL),
                f"runner-terminal:{run_id}:1",
            )
        finally:
            await conn.close()
        assert await work_once(rt) == ["failed"]
        final = await client.status(run_id)
    assert "the result of runner attempt 1 cannot be read back" in final.error["message"]
