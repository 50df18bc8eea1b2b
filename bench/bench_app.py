"""The benchmarks' app: `python -m worker run --app bench_app:app` (bench/ on PYTHONPATH).

``trivial`` is one step that returns; ``waiter`` parks until it is signalled;
``sleep_ms`` and ``busy_ms`` are one step of about a millisecond of work (steady.py):
an awaited 1 ms sleep, or 1 ms of busy CPU on the event loop.
With ``LANE_WORKER_BENCH_DROP_RUN_LOGS=1`` the daemon's two per-run info lines
(``run.started``, ``run.completed``) are dropped before rendering, so a drain can
be timed with and without them. The daemon configures logging before it imports
the app, so this runs after that.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import MutableMapping
from typing import Any

import structlog

from worker import App, TaskContext

PER_RUN_EVENTS = frozenset({"run.started", "run.completed"})

app = App()


@app.play("trivial")
async def trivial(ctx: TaskContext, params: Any) -> Any:
    """One step that echoes the input."""
    return await ctx.step("echo", lambda: {"echo": params})


@app.play("waiter")
async def waiter(ctx: TaskContext, params: Any) -> Any:
    """Park until the event ``go`` arrives, then return its payload (signal to resume)."""
    return await ctx.wait_for_event("wait", "go")


async def sleep_ms() -> dict[str, Any]:
    """A millisecond of waiting, as a step awaiting I/O would (other runs go on meanwhile)."""
    await asyncio.sleep(0.001)
    return {"slept_ms": 1}


async def busy_ms() -> dict[str, Any]:
    """A millisecond of CPU on the event loop (nothing else runs meanwhile)."""
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
    return {"busy_ms": 1}


# Async step bodies: they run on the event loop, as the SDK worker's do (a sync
# body would go to a thread here and add a hand-off the SDK side does not have).
@app.play("sleep_ms")
async def sleep_play(ctx: TaskContext, params: Any) -> Any:
    """One step that sleeps 1 ms."""
    return await ctx.step("work", sleep_ms)


@app.play("busy_ms")
async def busy_play(ctx: TaskContext, params: Any) -> Any:
    """One step that spins 1 ms."""
    return await ctx.step("work", busy_ms)


def _drop_per_run(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Any:
    if event.get("event") in PER_RUN_EVENTS:
        raise structlog.DropEvent
    return event


if os.environ.get("LANE_WORKER_BENCH_DROP_RUN_LOGS") == "1":
    structlog.configure(processors=[_drop_per_run, *structlog.get_config()["processors"]])
