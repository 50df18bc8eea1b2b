"""Executing a play: what its attempt stores when it raises, or returns or steps a value
that cannot be stored (``Runtime.handle``, worker/run/execute.py), on real Postgres.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from support.db import (
    attempt_rows,
)
from support.runtime import (
    eventually,
    open_client,
    open_runtime,
    work_once,
)
from worker import App, TaskContext
from worker.run.execute import Runtime

RELEASE = A = "rel-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
# Three attempts: a play that fails is retried, so its first error is seen on a live run.
ENV_A3 = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "3"}


def without_traceback(error: dict[str, Any]) -> dict[str, Any]:
    """The error's name and message (its traceback: ``test_run_tracebacks_shown.py``)."""
    return {k: v for k, v in error.items() if k != "traceback"}


# -- a play's BaseException fails the attempt, not the daemon -------------------------------


async def work_once_contained(rt: Runtime) -> list[str]:
    """``work_once``, failing the test (not killing it) when any exception escapes the runtime."""
    try:
        return await work_once(rt)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # SystemExit and KeyboardInterrupt included
        pytest.fail(f"{type(exc).__name__} escaped Runtime.handle: {exc!r}")


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
        attempts = await attempt_rows(database_url, submitted.run_id)
        other = await client.submit("fine")
        assert await work_once_contained(rt) == ["completed"]
        other_status = await client.status(other.run_id)
    assert retrying.status == "retrying"
    assert without_traceback(retrying.error) == expected
    assert failed.status == "failed"
    assert without_traceback(failed.error) == expected
    assert failed.error["traceback"].startswith("Traceback (most recent call last):\n  File ")
    assert ", in raiser\n    raise error\n" in failed.error["traceback"]
    assert failed.error["traceback"].endswith(f"{type(error).__name__}: {error}\n")
    assert failed.facts == ("run.failed",)
    assert [(a["outcome"], without_traceback(a["error"])) for a in attempts] == [
        ("retrying", expected),
        ("failed", expected),
    ]
    assert other_status.output == "still here"


# -- a value that is not JSON fails the attempt at once ---------------------------------------


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
        attempts = await attempt_rows(database_url, submitted.run_id)
    assert outcomes == ["retrying"]
    assert status.status == "retrying"
    assert status.error["name"] == "NotJsonError"
    message = status.error["message"]
    for name in names:
        assert name in message, f"{name!r} not named in {message!r}"
    assert [(a["outcome"], a["error"]) for a in attempts] == [("retrying", status.error)]


def forgets_await() -> App:
    """Plays that forget ``await`` on a step: returning it, or inside their output."""
    app = App()

    @app.play("returns-step")
    async def returns_step(ctx: TaskContext, params: Any) -> Any:
        return ctx.step("make", lambda: 1)  # no await

    @app.play("holds-step")
    async def holds_step(ctx: TaskContext, params: Any) -> Any:
        return {"made": ctx.step("make", lambda: 1)}  # no await

    return app


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # "coroutine ... was never awaited"
@pytest.mark.parametrize(("play", "where"), [("returns-step", "$"), ("holds-step", "$.made")])
async def test_a_play_that_forgets_await_on_a_step_is_told_so(
    database_url: str, play: str, where: str
) -> None:
    """Its failure says a call was never awaited, where, and asks: did you forget `await`?"""
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, forgets_await(), RELEASE) as rt,
    ):
        submitted = await client.submit(play)
        assert await work_once_contained(rt) == ["retrying"]
        status = await client.status(submitted.run_id)
    assert status.error["name"] == "NotJsonError"
    assert status.error["message"].startswith(
        f"the output of play {play!r} is not JSON: it holds a coroutine at {where}, a call "
        "that was never awaited (did you forget `await`, as in `await ctx.step(...)`?)."
    )


# -- errors that are hard to store ---------------------------------------------------------


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
        open_client(database_url, ENV_A3) as client,
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
        open_client(database_url, ENV_A3) as client,
        open_runtime(database_url, app, A) as rt,
    ):
        run = await client.submit("missing-file")
        assert await work_once(rt) == ["retrying"]
        status = await client.status(run.run_id)
    assert without_traceback(status.error) == {
        "name": "FileNotFoundError",
        "message": "no such file: caf\\udcff.txt",
    }
    assert "FileNotFoundError: no such file: caf\\udcff.txt" in status.error["traceback"]


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
        open_client(database_url, ENV_A3) as client,
        open_runtime(with_password, app, A) as rt,
    ):
        run = await client.submit("leaky")
        assert await work_once(rt) == ["retrying"]
        status = await client.status(run.run_id)
        stored = await rt.db.fetchval(
            "select error::text from runtime_scheduler.attempts where run_id = $1::uuid", run.run_id
        )
    assert status.error["message"] == "could not connect with *** (***)"
    assert "RuntimeError: could not connect with *** (***)" in status.error["traceback"]
    assert "S3cret" not in stored
