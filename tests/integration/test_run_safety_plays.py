"""Run safety seen from plays: stale attempts, BaseExceptions, non-JSON values, step keys, clocks.

Regression tests for defects 6 to 10 of issue 9, each driven through in-process
runtimes on real Postgres.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from support.runtime import eventually, open_client, open_runtime, work_once, work_until
from worker import App, TaskContext
from worker.db.engine import ClaimedRun
from worker.errors import FatalRunError
from worker.run.execute import Handled, Runtime

RELEASE = "rel-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_a"
SCHEMA = "runtime_scheduler"


async def attempt_rows(rt: Runtime, run_id: str) -> list[asyncpg.Record]:
    """Return the store's attempt rows of a run, oldest first."""
    rows: list[asyncpg.Record] = await rt.db.fetch(
        f"select attempt, worker_id, outcome, error, claimed_at, finished_at"
        f" from {SCHEMA}.attempts where run_id = $1::uuid order by attempt_id",
        run_id,
    )
    return rows


async def terminal_facts(rt: Runtime, run_id: str) -> list[str]:
    """Return the types of a run's terminal ledger facts."""
    rows = await rt.db.fetch(
        f"select type from {SCHEMA}.ledger where run_id = $1::uuid"
        " and type in ('run.completed', 'run.failed', 'run.cancelled') order by fact_id",
        run_id,
    )
    return [r["type"] for r in rows]


async def claim_one(rt: Runtime, *, timeout_s: float = 10) -> ClaimedRun:
    """Claim on the runtime's own queue until one run is handed out; return it."""

    async def claimed() -> ClaimedRun | None:
        batch = await rt.claim(rt.queue, 1)
        return batch.runs[0] if batch.runs else None

    run: ClaimedRun = await eventually(claimed, timeout_s=timeout_s, what="a run to claim")
    return run


async def work_once_contained(rt: Runtime) -> list[str]:
    """``work_once``, failing the test (not killing it) when any exception escapes the runtime."""
    try:
        return await work_once(rt)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included
        pytest.fail(f"{type(exc).__name__} escaped Runtime.handle: {exc!r}")


def skew_clock(monkeypatch: pytest.MonkeyPatch, offset_s: float) -> dict[str, float]:
    """Make ``time.time`` run ``offset_s`` off the real clock; return the mutable offset."""
    real = time.time
    skew = {"s": offset_s}
    monkeypatch.setattr(time, "time", lambda: real() + skew["s"])
    return skew


# -- defect 6: a stale attempt must not cancel the new owner's run --------------


async def test_stale_attempt_failing_for_good_leaves_the_new_owners_run_alone(
    database_url: str,
) -> None:
    """Attempt 1, its lease expired, fails for good: attempt 2 (another worker) still completes."""
    started = {1: asyncio.Event(), 2: asyncio.Event()}
    release = {1: asyncio.Event(), 2: asyncio.Event()}
    app = App()

    @app.play("stale")
    async def stale(ctx: TaskContext, params: dict[str, Any]) -> dict[str, int]:
        started[ctx.attempt].set()
        await release[ctx.attempt].wait()
        if ctx.attempt == 1:
            raise FatalRunError("attempt 1 gives up for good")
        return {"attempt": ctx.attempt}

    async def outcome_of(task: asyncio.Task[Handled]) -> str:
        """The attempt's outcome, or the exception that escaped ``handle``."""
        try:
            return (await asyncio.wait_for(task, 10)).outcome
        except Exception as exc:
            return f"raised {exc!r}"

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE, lease_s=30, worker_base="w1") as rt1,
        open_runtime(database_url, app, RELEASE, lease_s=30, worker_base="w2") as rt2,
    ):
        submitted = await client.submit("stale")
        first = asyncio.create_task(rt1.handle(await claim_one(rt1)))
        second: asyncio.Task[Handled] | None = None
        try:
            await asyncio.wait_for(started[1].wait(), 10)
            expired = await rt1.db.execute(
                f"update absurd.r_{QUEUE} set claim_expires_at = now() - interval '1 second'"
                " where state = 'running' and claimed_by = 'w1'"
            )
            assert expired == "UPDATE 1"
            # rt2's claims sweep the expired lease; the retry is due 1 s later.
            second = asyncio.create_task(rt2.handle(await claim_one(rt2)))
            await asyncio.wait_for(started[2].wait(), 10)
            release[1].set()
            first_outcome = await outcome_of(first)
            release[2].set()
            second_outcome = await outcome_of(second)
        finally:
            for event in release.values():
                event.set()
            for task in (first, second):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(first, *([second] if second else []), return_exceptions=True)
        status = await client.status(submitted.run_id)
        engine_state = await rt1.db.fetchval(f"select state from absurd.t_{QUEUE}")
        attempts = await attempt_rows(rt1, submitted.run_id)
        facts = await terminal_facts(rt1, submitted.run_id)
    assert (first_outcome, second_outcome) == ("lease_lost", "completed")
    assert status.status == "completed"
    assert status.output == {"attempt": 2}
    assert engine_state == "completed"
    assert [(a["attempt"], a["worker_id"], a["outcome"]) for a in attempts] == [
        (1, "w1", "lease_lost"),
        (2, "w2", "completed"),
    ]
    assert facts == ["run.completed"]


# -- defect 7: a play's BaseException fails the attempt, not the daemon ---------


class Boom(BaseException):
    """A BaseException of the play author's own."""


@pytest.mark.parametrize(
    "error",
    [SystemExit("bye"), KeyboardInterrupt("interrupted"), Boom("kaboom")],
    ids=["SystemExit", "KeyboardInterrupt", "custom-BaseException"],
)
async def test_play_raising_a_base_exception_fails_the_attempt_and_the_runtime_goes_on(
    database_url: str, error: BaseException
) -> None:
    """Each attempt fails with the error's name and message; the same runtime runs on."""
    app = App()

    @app.play("raiser")
    async def raiser(ctx: TaskContext, params: dict[str, Any]) -> None:
        raise error

    @app.play("fine")
    async def fine(ctx: TaskContext, params: dict[str, Any]) -> str:
        return "still here"

    expected = {"name": type(error).__name__, "message": str(error)}
    env = {**ENV, "LANE_WORKER_MAX_ATTEMPTS": "2"}
    async with (
        open_client(database_url, env) as client,
        open_runtime(database_url, app, RELEASE) as rt,
    ):
        submitted = await client.submit("raiser")
        assert await work_once_contained(rt) == ["retrying"]
        retrying = await client.status(submitted.run_id)

        async def last_attempt_failed() -> bool:
            return "failed" in await work_once_contained(rt)

        await eventually(last_attempt_failed, timeout_s=10, what="the last attempt to fail")
        failed = await client.status(submitted.run_id)
        attempts = await attempt_rows(rt, submitted.run_id)
        other = await client.submit("fine")
        assert await work_once_contained(rt) == ["completed"]
        other_status = await client.status(other.run_id)
    assert retrying.status == "retrying"
    assert retrying.error == expected
    assert failed.status == "failed"
    assert failed.error == expected
    assert failed.facts == ("run.failed",)
    assert [(a["outcome"], a["error"]) for a in attempts] == [
        ("retrying", expected),
        ("failed", expected),
    ]
    assert other_status.output == "still here"


# -- defect 8: a value that is not JSON fails the attempt at once ----------------


def returns(value: Callable[[], Any]) -> App:
    """A play ``out`` returning ``value()`` as its output."""
    app = App()

    @app.play("out")
    async def out(ctx: TaskContext, params: dict[str, Any]) -> Any:
        return value()

    return app


def steps(value: Callable[[], Any]) -> App:
    """A play ``out`` whose step returns ``value()``."""
    app = App()

    @app.play("out")
    async def out(ctx: TaskContext, params: dict[str, Any]) -> Any:
        return await ctx.step("make", value)

    return app


@pytest.mark.parametrize(
    ("app_of", "value", "names"),
    [
        (returns, lambda: {"when": datetime.now()}, ("datetime", "$.when")),
        (steps, lambda: [datetime.now()], ("datetime", "$[0]")),
        (returns, lambda: {"ratio": math.nan}, ("nan", "$.ratio")),
        (steps, lambda: {"ratio": math.nan}, ("nan", "$.ratio")),
        (returns, lambda: {"counts": {1: "one"}}, ("int key", "$.counts")),
        (steps, lambda: {"counts": {1: "one"}}, ("int key", "$.counts")),
        (returns, lambda: {"text": "a\x00b"}, ("NUL", "$.text")),
        (steps, lambda: ["ok", "a\x00b"], ("NUL", "$[1]")),
        (returns, lambda: {"name": "caf\ud800"}, ("surrogate", "$.name")),
        (steps, lambda: {"n": 10**5000}, ("too long", "$.n")),
    ],
    ids=[
        "play-datetime",
        "step-datetime-in-list",
        "play-nan",
        "step-nan",
        "play-int-key",
        "step-int-key",
        "play-nul-string",
        "step-nul-string",
        "play-lone-surrogate",
        "step-int-past-the-digit-limit",
    ],
)
async def test_value_that_is_not_json_fails_the_attempt_at_once_naming_type_and_place(
    database_url: str,
    app_of: Callable[[Callable[[], Any]], App],
    value: Callable[[], Any],
    names: tuple[str, str],
) -> None:
    """The handle call returns 'retrying'; the stored error names the type and where it sits."""
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app_of(value), RELEASE) as rt,
    ):
        submitted = await client.submit("out")
        outcomes = await work_once_contained(rt)
        status = await client.status(submitted.run_id)
        attempts = await attempt_rows(rt, submitted.run_id)
    assert outcomes == ["retrying"]
    assert status.status == "retrying"
    assert status.error["name"] == "NotJsonError"
    message = status.error["message"]
    for name in names:
        assert name in message, f"{name!r} not named in {message!r}"
    assert [(a["outcome"], a["error"]) for a in attempts] == [("retrying", status.error)]


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


def resumed_after(attempts: list[asyncpg.Record]) -> tuple[float, float]:
    """Seconds (DB clock) from the first claim and from the park to the next claim."""
    parked, resumed = attempts[0], attempts[1]
    return (
        (resumed["claimed_at"] - parked["claimed_at"]).total_seconds(),
        (resumed["claimed_at"] - parked["finished_at"]).total_seconds(),
    )


@pytest.mark.parametrize("offset_s", [-1.5, 1.5], ids=["worker-behind", "worker-ahead"])
async def test_durable_sleep_on_a_skewed_worker_wakes_on_time(
    database_url: str, monkeypatch: pytest.MonkeyPatch, offset_s: float
) -> None:
    """A 2 s sleep on a worker 1.5 s off wakes after 2 s of database time, in few claims."""
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
        await drive_to_completion(rt)
        monkeypatch.undo()
        status = await client.status(submitted.run_id)
        attempts = await attempt_rows(rt, submitted.run_id)
    assert status.output == "rested"
    from_claim_s, from_park_s = resumed_after(attempts)
    outcomes = [a["outcome"] for a in attempts]
    assert len(attempts) <= 3, f"{len(attempts)} claims; first resume after {from_claim_s:.2f} s"
    assert outcomes[0] == "parked"
    assert outcomes[-1] == "completed"
    assert from_claim_s >= 2.0
    assert from_park_s <= 2.6


async def test_event_wait_timeout_armed_and_resumed_on_skewed_workers_ends_on_time(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2 s wait armed on a worker 1.5 s ahead, resumed on one 1.5 s behind, times out at ~2 s."""
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
        skew = skew_clock(monkeypatch, 1.5)
        assert await work_once(ahead) == ["parked"]
        skew["s"] = -1.5  # the worker that resumes it has its own clock
        await drive_to_completion(behind)
        monkeypatch.undo()
        status = await client.status(submitted.run_id)
        attempts = await attempt_rows(behind, submitted.run_id)
    assert status.output["timed_out"] is True
    from_claim_s, _ = resumed_after(attempts)
    assert len(attempts) <= 3, f"{len(attempts)} claims; first resume after {from_claim_s:.2f} s"
    assert [a["outcome"] for a in attempts][-1] == "completed"
    finished_s = (attempts[-1]["finished_at"] - attempts[0]["finished_at"]).total_seconds()
    assert from_claim_s >= 2.0
    assert finished_s <= 2.6, f"timed out {finished_s:.2f} s after it parked"
