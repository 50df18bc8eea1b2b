"""The in-process apps the integration tests share, and what their plays tell the test.

``remedies_app`` (the remedies and run-safety tests) records every execution of a
play or step body in ``RemedyPlays.effects`` and holds its gated steps per run name;
``report_app`` (the drain report and deferral tests) puts a run in each bucket of the
report and holds every gated step on one gate. Both count the failures of ``flaky``
per run. The fixtures ``remedy_plays`` and ``report_plays`` (registered by
``tests/integration/conftest.py``) give a test their state and open every gate at
the end, so no play is left blocked. ``two_lanes`` is the usual stage: lanes A then
B registered, both live.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from support.runtime import open_client, open_runtime, queue_of, register_worker
from worker import App, TaskContext
from worker.client import LaneClient
from worker.run.execute import Runtime

A, B = "rel-a", "rel-b"
QA, QB = queue_of(A), queue_of(B)
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "5"}

LONG_NAP_S = 3600  # a sleep that never comes due during a test
SHORT_NAP_S = 0.3


class RemedyPlays:
    """What the plays tell the test: side effects per release, gated steps entered."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}
        self.failures: dict[str, int] = {}
        #: (release, run id, what) for every execution of a play body or step body.
        self.effects: list[tuple[str, str, str]] = []

    def gate(self, name: str) -> asyncio.Event:
        """Return the event that lets the gated step of run ``name`` finish."""
        return self.gates.setdefault(name, asyncio.Event())

    def entered_event(self, name: str) -> asyncio.Event:
        """Return the event set when the gated step of run ``name`` starts."""
        return self.entered.setdefault(name, asyncio.Event())

    def by(self, release: str, run_id: str | None = None) -> list[str]:
        """Return what ran on ``release`` (for ``run_id``, if given), in order."""
        return [
            what
            for rel, rid, what in self.effects
            if rel == release and (run_id is None or rid == run_id)
        ]

    def open_all(self) -> None:
        """Open every gate (the fixture's teardown: no play is left blocked)."""
        for event in self.gates.values():
            event.set()


def remedies_app(plays: RemedyPlays) -> App:
    """Plays that put a run in each state, recording every execution in ``plays.effects``.

    `plain` (one step), `napper` (a durable sleep of ``seconds``, then a step),
    `waiter` (an event wait, then a step), `nap-then-wait` (a short sleep, an
    event wait, a step), `flaky` (its step fails the first
    time, per run), `gated` (a step that holds until the run's gate opens, then
    a second step), `journey` (a step, a gated step, a sleep, a step).
    """
    app = App()

    def record(ctx: TaskContext, what: str) -> str:
        plays.effects.append((ctx.release_id, ctx.run_id, what))
        return ctx.release_id

    @app.play("plain")
    async def plain(ctx: TaskContext, params: Any) -> str:
        record(ctx, "play")
        return str(await ctx.step("s", lambda: record(ctx, "s")))

    @app.play("napper")
    async def napper(ctx: TaskContext, params: Any) -> list[str]:
        first = await ctx.step("first", lambda: record(ctx, "first"))
        await ctx.sleep("nap", float(params.get("seconds", LONG_NAP_S)))
        return [first, str(await ctx.step("second", lambda: record(ctx, "second")))]

    @app.play("waiter")
    async def waiter(ctx: TaskContext, params: Any) -> str:
        await ctx.wait_for_event("gate", "go")
        return str(await ctx.step("after", lambda: record(ctx, "after")))

    @app.play("flaky")
    async def flaky(ctx: TaskContext, params: Any) -> str:
        def once() -> str:
            plays.failures[ctx.run_id] = plays.failures.get(ctx.run_id, 0) + 1
            if plays.failures[ctx.run_id] == 1:
                raise RuntimeError("the first try fails")
            return record(ctx, "once")

        return str(await ctx.step("once", once))

    async def held(ctx: TaskContext, name: str) -> str:
        plays.entered_event(name).set()
        await plays.gate(name).wait()
        return record(ctx, "held")

    @app.play("gated")
    async def gated(ctx: TaskContext, params: Any) -> list[str]:
        first = await ctx.step("held", lambda: held(ctx, params["name"]))
        return [first, str(await ctx.step("after", lambda: record(ctx, "after")))]

    @app.play("journey")
    async def journey(ctx: TaskContext, params: Any) -> list[str]:
        first = await ctx.step("first", lambda: record(ctx, "first"))
        middle = await ctx.step("held", lambda: held(ctx, params["name"]))
        await ctx.sleep("nap", SHORT_NAP_S)
        return [first, middle, str(await ctx.step("second", lambda: record(ctx, "second")))]

    @app.play("nap-then-wait")
    async def nap_then_wait(ctx: TaskContext, params: Any) -> str:
        await ctx.sleep("nap", SHORT_NAP_S)
        await ctx.wait_for_event("gate", "go")
        return str(await ctx.step("after", lambda: record(ctx, "after")))

    return app


class ReportPlays:
    """What the test's plays tell the test: which gated steps started, which runs failed."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered: dict[str, asyncio.Event] = {}
        self.failures: dict[str, int] = {}

    def entered_event(self, name: str) -> asyncio.Event:
        """Return the event set when the gated step of run ``name`` starts."""
        return self.entered.setdefault(name, asyncio.Event())


def report_app(plays: ReportPlays, *, without: tuple[str, ...] = ()) -> App:
    """Plays that put a run in each bucket (``without``: leave those plays out).

    `plain` (one step), `napper` (a durable sleep of ``seconds``, then a step),
    `waiter` (event `first`, then event `second`), `flaky` (its step fails the
    first time, per run), `gated` (a step that holds until ``plays.gate`` is set),
    `special` (an event wait: the play a newer release may lack).
    """
    app = App()

    async def plain(ctx: TaskContext, params: Any) -> str:
        return str(await ctx.step("s", lambda: ctx.release_id))

    async def napper(ctx: TaskContext, params: Any) -> str:
        await ctx.sleep("nap", float(params.get("seconds", LONG_NAP_S)))
        return str(await ctx.step("after", lambda: ctx.release_id))

    async def waiter(ctx: TaskContext, params: Any) -> list[str]:
        await ctx.wait_for_event("first", "first")
        first = await ctx.step("after-first", lambda: ctx.release_id)
        await ctx.wait_for_event("second", "second")
        return [first, str(await ctx.step("after-second", lambda: ctx.release_id))]

    async def flaky(ctx: TaskContext, params: Any) -> str:
        def once() -> str:
            plays.failures[ctx.run_id] = plays.failures.get(ctx.run_id, 0) + 1
            if plays.failures[ctx.run_id] == 1:
                raise RuntimeError("the first try fails")
            return ctx.release_id

        return str(await ctx.step("once", once))

    async def gated(ctx: TaskContext, params: Any) -> str:
        async def held() -> str:
            plays.entered_event(params["name"]).set()
            await plays.gate.wait()
            return ctx.release_id

        return str(await ctx.step("held", held))

    async def special(ctx: TaskContext, params: Any) -> str:
        await ctx.wait_for_event("special", "go")
        return ctx.release_id

    for name, play in (
        ("plain", plain),
        ("napper", napper),
        ("waiter", waiter),
        ("flaky", flaky),
        ("gated", gated),
        ("special", special),
    ):
        if name not in without:
            app.play(name)(play)
    return app


@pytest.fixture
def remedy_plays() -> Iterator[RemedyPlays]:
    """The remedies app's shared state; every gate opens at the end so no play is left blocked."""
    state = RemedyPlays()
    yield state
    state.open_all()


@pytest.fixture
def report_plays() -> Iterator[ReportPlays]:
    """The report app's shared state; the gate opens at the end so no play is left blocked."""
    state = ReportPlays()
    yield state
    state.gate.set()


@asynccontextmanager
async def two_lanes(
    database_url: str, app: App
) -> AsyncIterator[tuple[LaneClient, Runtime, Runtime]]:
    """A client submitting on A, and runtimes of A and B; lanes A then B registered.

    Both are live (a worker row with a fresh heartbeat, as a booted daemon has),
    registering every play: B can run what is moved or retried there, and adopt.
    """
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_a)
        await register_worker(rt_b)
        yield client, rt_a, rt_b


def narrow_app() -> App:
    """An app of release A without the remedies app's plays (a machine of another build)."""
    app = App()

    @app.play("other")
    async def other(ctx: TaskContext, params: Any) -> str:
        return "other"

    return app
