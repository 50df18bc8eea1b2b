"""``@app.play``: what it registers, and the plain ``def`` it refuses at import."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from worker import App, TaskContext


async def greet(ctx: TaskContext, params: Any) -> str:
    return "hi"


def logged(fn: Callable[[TaskContext, Any], Awaitable[Any]]) -> Any:
    """A decorator whose wrapper is a plain def returning the coroutine (``functools.wraps``)."""

    @functools.wraps(fn)
    def wrapper(ctx: TaskContext, params: Any) -> Awaitable[Any]:
        return fn(ctx, params)

    return wrapper


class CallablePlay:
    async def __call__(self, ctx: TaskContext, params: Any) -> str:
        return "called"


class Plays:
    async def method(self, ctx: TaskContext, params: Any) -> str:
        return "method"


@pytest.mark.parametrize(
    "play",
    [
        greet,
        logged(greet),
        functools.partial(greet),
        CallablePlay(),
        Plays().method,
    ],
    ids=["async-def", "wrapped", "partial", "async-call", "bound-method"],
)
def test_an_async_play_is_registered(play: Any) -> None:
    """Whatever gives a coroutine when called is a play: registered and returned as given."""
    app = App()
    assert app.play("p")(play) is play
    assert app.plays == {"p": play}


def test_a_plain_def_play_is_refused_at_registration() -> None:
    """A sync play is a TypeError naming the play and the function; nothing is registered."""
    app = App()

    def report(ctx: TaskContext, params: Any) -> dict[str, Any]:
        return {}

    with pytest.raises(TypeError) as refused:
        app.play("report")(report)  # type: ignore[arg-type]
    line = report.__code__.co_firstlineno
    assert str(refused.value) == (
        "play 'report': plays must be async def (got a plain function "
        "test_a_plain_def_play_is_refused_at_registration.<locals>.report at "
        f"tests/unit/test_app_registration.py line {line}); "
        "write it as `async def ...(ctx, params)`"
    )
    assert app.plays == {}


@pytest.mark.parametrize(
    ("play", "got"),
    [
        (lambda ctx, params: {}, "a plain function <lambda> at tests/unit/"),
        (print, "a builtin_function_or_method object"),
        (None, "a NoneType object"),
        (CallablePlay, "a type object"),  # the class, not an instance
    ],
)
def test_what_gives_no_coroutine_is_refused(play: Any, got: str) -> None:
    """A lambda, a builtin, a non-callable, a class: each refused, saying what it was."""
    with pytest.raises(TypeError, match="plays must be async def") as refused:
        App().play("p")(play)
    assert f"(got {got}" in str(refused.value)


def test_a_sync_play_is_refused_before_a_duplicate_name() -> None:
    """The same name given to a plain def is refused as sync, and the first play stays."""
    app = App()
    app.play("p")(greet)
    with pytest.raises(TypeError):
        app.play("p")(lambda ctx, params: None)
    with pytest.raises(ValueError, match="registered twice"):
        app.play("p")(greet)
    assert app.plays == {"p": greet}


def test_sync_step_functions_stay_allowed_in_the_demo() -> None:
    """Only plays must be async: the demo's steps are plain lambdas, and it still loads."""
    from worker.demo import app

    assert sorted(app.plays) == ["approval", "flaky-once", "greet", "nap"]
