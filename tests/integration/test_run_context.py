"""What a play sees (worker/run/context.py), on real Postgres with in-process runtimes.

Step names map one-to-one to checkpoints (also for runs an older build executed),
durable sleeps and event-wait timeouts are measured on the database's clock however
skewed the worker's is, and a sleep beside a step in a task group parks without
spending an attempt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import asyncpg
import pytest

from support.db import attempt_rows
from support.runtime import eventually, open_client, open_runtime, work_once, work_until
from worker import App, DetachedRunner, TaskContext
from worker.run.execute import Runtime

RELEASE = "rel-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_a"
# Three attempts: a play that fails is retried, so its first error is seen on a live run.
ENV_A3 = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE, "LANE_WORKER_MAX_ATTEMPTS": "3"}
SCHEMA = "runtime_scheduler"


# Workers' clocks are set an hour off: far outside anything load can do to a
# claim's round trip, so a duration measured on a worker's own clock shows.
SKEW_S = 3600.0
# The worker reads the database's clock at its claim and counts from when it sent
# the claim, so a wait is armed up to one round trip late (never early).
ROUND_TRIP_SLACK_MS = 60_000


def skew_clock(monkeypatch: pytest.MonkeyPatch, offset_s: float) -> dict[str, float]:
    """Make ``time.time`` run ``offset_s`` off the real clock; return the mutable offset."""
    real = time.time
    skew = {"s": offset_s}
    monkeypatch.setattr(time, "time", lambda: real() + skew["s"])
    return skew


# -- defect 9: step names map one-to-one to checkpoints --------------------------


async def test_step_named_like_a_repeated_step_keeps_its_own_checkpoint(database_url: str) -> None:
    """`a#2` once and `a` twice: three checkpoints, each body ran once, each replays its value."""
    calls: Counter[str] = Counter()
    app = App()

    def ran(value: str) -> str:
        calls[value] += 1
        return value

    @app.play("names")
    async def names(ctx: TaskContext, params: dict[str, Any]) -> list[str]:
        hashed = await ctx.step("a#2", lambda: ran("hash"))
        first = await ctx.step("a", lambda: ran("first"))
        second = await ctx.step("a", lambda: ran("second"))
        await ctx.sleep("nap", 0.5)
        return [hashed, first, second]

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE) as rt,
    ):
        submitted = await client.submit("names")
        assert await work_once(rt) == ["parked"]
        await work_until(rt, "completed", timeout_s=10)
        status = await client.status(submitted.run_id)
        keys = await rt.db.fetch(f"select checkpoint_name from absurd.c_{QUEUE}")
    assert status.output == ["hash", "first", "second"]
    assert calls == Counter({"hash": 1, "first": 1, "second": 1})
    assert len({k["checkpoint_name"] for k in keys}) == 3


async def test_run_first_executed_by_an_older_build_keeps_its_step_keys(database_url: str) -> None:
    """A run whose checkpoints use the old key of `p#q` (step_keys NULL) replays, not re-runs."""
    calls: Counter[str] = Counter()
    app = App()

    def body() -> str:
        calls["p#q"] += 1
        return "committed once"

    @app.play("legacy")
    async def legacy(ctx: TaskContext, params: dict[str, Any]) -> str:
        value = await ctx.step("p#q", body)
        await ctx.sleep("nap", 0.5)
        return str(value)

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE) as rt,
    ):
        submitted = await client.submit("legacy")
        assert await work_once(rt) == ["parked"]
        # Make it look like an older build executed it: the old key, no mapping stamped.
        renamed = await rt.db.execute(
            f"update absurd.c_{QUEUE} set checkpoint_name = 'step:p#q'"
            " where checkpoint_name = 'step:p##q'"
        )
        assert renamed == "UPDATE 1"
        unstamped = await rt.db.execute(
            f"update {SCHEMA}.runs set step_keys = null where run_id = $1::uuid",
            submitted.run_id,
        )
        assert unstamped == "UPDATE 1"
        await work_until(rt, "completed", timeout_s=10)
        status = await client.status(submitted.run_id)
        step_keys = await rt.db.fetchval(
            f"select step_keys from {SCHEMA}.runs where run_id = $1::uuid", submitted.run_id
        )
    assert status.output == "committed once"
    assert calls == Counter({"p#q": 1})
    assert step_keys is None  # a resume does not restamp the mapping


# -- defect 10: durations are measured on the database's clock -------------------


async def drive_to_completion(rt: Runtime, *, timeout_s: float = 10) -> None:
    """Claim and handle every 50 ms until a run completes."""

    async def completed() -> bool:
        return "completed" in await work_once(rt)

    await eventually(completed, timeout_s=timeout_s, what="the run to complete")


async def armed_wait(rt: Runtime, run_id: str, boundary_id: str) -> dict[str, Any]:
    """The wait ``boundary_id`` as armed in the run's stored envelope (while it is parked)."""
    armed = await rt.db.fetchval(
        f"select checkpoint->'armedWaits'->$2 from {SCHEMA}.runs where run_id = $1::uuid",
        run_id,
        boundary_id,
    )
    assert armed is not None, f"{boundary_id!r} is not armed in run {run_id}"
    return dict(json.loads(armed) if isinstance(armed, str) else armed)


def ms(at: Any) -> int:
    """Unix milliseconds of a timestamptz read from the database."""
    return round(at.timestamp() * 1000)


def assert_measured_on_the_db_clock(
    attempts: list[dict[str, Any]], armed_at_ms: int, due_ms: int
) -> None:
    """The wait was armed on the database's clock and ended by it, however skewed the workers.

    Armed inside the first attempt (claim to park plus a round trip, on the
    database's clock: a worker's own would put it an hour outside); parked again
    only by an attempt claimed before it was due (a worker's clock that lags
    would park after); ended no earlier than it was due. These hold however
    slow the machine is (1 ms is rounding: both sides are whole milliseconds).
    """
    first = attempts[0]
    armed_from, armed_by = ms(first["claimed_at"]), ms(first["finished_at"])
    assert armed_from - 1 <= armed_at_ms <= armed_by + ROUND_TRIP_SLACK_MS
    for later in attempts[1:]:
        if later["outcome"] == "parked":
            assert ms(later["claimed_at"]) < due_ms, "parked again after it was due"
    assert ms(attempts[-1]["finished_at"]) >= due_ms, "ended before it was due"


def resumed_after(attempts: list[asyncpg.Record]) -> tuple[float, float]:
    """Seconds (DB clock) from the first claim and from the park to the next claim."""
    parked, resumed = attempts[0], attempts[1]
    return (
        (resumed["claimed_at"] - parked["claimed_at"]).total_seconds(),
        (resumed["claimed_at"] - parked["finished_at"]).total_seconds(),
    )


@pytest.mark.parametrize("offset_s", [-SKEW_S, SKEW_S], ids=["worker-behind", "worker-ahead"])
async def test_durable_sleep_on_a_skewed_worker_wakes_on_time(
    database_url: str, monkeypatch: pytest.MonkeyPatch, offset_s: float
) -> None:
    """A 2 s sleep on a worker an hour off wakes after 2 s of database time, in few claims."""
    app = App()

    @app.play("napper")
    async def napper(ctx: TaskContext, params: dict[str, Any]) -> str:
        await ctx.sleep("nap", 2)
        return "rested"

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE) as rt,
    ):
        submitted = await client.submit("napper")
        skew_clock(monkeypatch, offset_s)
        assert await work_once(rt) == ["parked"]
        armed = await armed_wait(rt, submitted.run_id, "nap")
        await drive_to_completion(rt)
        monkeypatch.undo()
        status = await client.status(submitted.run_id)
        attempts = await attempt_rows(database_url, submitted.run_id)
    assert status.output == "rested"
    from_claim_s, _ = resumed_after(attempts)
    outcomes = [a["outcome"] for a in attempts]
    assert len(attempts) <= 3, f"{len(attempts)} claims; first resume after {from_claim_s:.2f} s"
    assert outcomes[0] == "parked"
    assert outcomes[-1] == "completed"
    assert from_claim_s >= 2.0
    assert armed["wakeAtMs"] - armed["armedAtMs"] == 2000
    assert_measured_on_the_db_clock(attempts, armed["armedAtMs"], armed["wakeAtMs"])


async def test_event_wait_timeout_armed_and_resumed_on_skewed_workers_ends_on_time(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2 s wait armed on a worker an hour ahead, resumed on one an hour behind: 2 s."""
    app = App()

    @app.play("wait")
    async def wait(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
        return await ctx.wait_for_event("gate", "go", timeout=2)

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE, worker_base="ahead") as ahead,
        open_runtime(database_url, app, RELEASE, worker_base="behind") as behind,
    ):
        submitted = await client.submit("wait")
        skew = skew_clock(monkeypatch, SKEW_S)
        assert await work_once(ahead) == ["parked"]
        armed = await armed_wait(ahead, submitted.run_id, "gate")
        skew["s"] = -SKEW_S  # the worker that resumes it has its own clock
        await drive_to_completion(behind)
        monkeypatch.undo()
        status = await client.status(submitted.run_id)
        attempts = await attempt_rows(database_url, submitted.run_id)
    assert status.output["timed_out"] is True
    from_claim_s, _ = resumed_after(attempts)
    assert len(attempts) <= 3, f"{len(attempts)} claims; first resume after {from_claim_s:.2f} s"
    assert [a["outcome"] for a in attempts][-1] == "completed"
    assert from_claim_s >= 2.0
    assert armed["deadlineMs"] - armed["armedAtMs"] == 2000
    assert_measured_on_the_db_clock(attempts, armed["armedAtMs"], armed["deadlineMs"])


# -- a sleep beside a step --------------------------------------------------------------------


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
        open_client(database_url, ENV_A3) as client,
        open_runtime(database_url, app, RELEASE) as rt,
    ):
        run = await client.submit("grouped")
        assert await work_once(rt) == ["parked"]
        await work_until(rt, "completed")
        status = await client.status(run.run_id)
    assert status.status == "completed"
    assert [(a.attempt, a.outcome) for a in status.attempts] == [(1, "parked"), (1, "completed")]


# -- an engine event without a payload --------------------------------------------------------


async def test_an_engine_event_with_a_null_payload_resumes_the_wait_as_a_signal_does(
    database_url: str,
) -> None:
    """``absurd.emit_event`` with no payload (or JSON null) resumes a wait, not fails the run.

    The engine stores JSON null for an event emitted without a payload; read back,
    that is None, as the engine's "timed out" answer is. A wait took the event for a
    stale timeout three times and failed the run for good ("neither parked nor
    resolved"). Resumed, it sees what ``signal`` with no data gives: no payload.
    """
    app = App()
    launched: list[DetachedRunner] = []

    @app.play("wait")
    async def wait(ctx: TaskContext, params: Any) -> dict[str, Any]:
        return await ctx.wait_for_event("gate", "go", timeout=600)

    @app.play("detached")
    async def detached(ctx: TaskContext, params: Any) -> dict[str, Any]:
        return await ctx.run_detached("job", launched.append, timeout=600)

    emits = {
        "default": "select absurd.emit_event($1, $2)",
        "sql null": "select absurd.emit_event($1, $2, null)",
        "json null": "select absurd.emit_event($1, $2, 'null'::jsonb)",
    }
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE) as rt,
    ):
        signalled = (await client.submit("wait")).run_id
        emitted = {how: (await client.submit("wait")).run_id for how in emits}
        runner = (await client.submit("detached")).run_id
        assert await work_once(rt) == ["parked"] * (len(emits) + 2)
        await client.signal(signalled, "go")
        for how, sql in emits.items():
            await rt.db.execute(sql, QUEUE, f"evt:{emitted[how]}:go")
        # A runner's terminal event emitted straight to the engine, without a report.
        await rt.db.execute(
            "select absurd.emit_event($1, $2)", QUEUE, f"runner-terminal:{runner}:1"
        )
        assert await work_once(rt) == ["completed"] * (len(emits) + 2)
        by_signal = await client.status(signalled)
        by_engine = {how: await client.status(run_id) for how, run_id in emitted.items()}
        by_runner = await client.status(runner)
    assert by_signal.output["resumed"] is True
    assert by_signal.output["event_payload"] is None
    for how, status in by_engine.items():
        assert (status.status, status.output) == ("completed", by_signal.output), how
    assert by_runner.status == "completed"
    assert by_runner.output == {
        "runnerAttempt": 1,
        "result": None,
        "timedOut": False,
        "launched": None,
    }
