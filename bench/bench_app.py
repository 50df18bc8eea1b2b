"""The benchmarks' app: `python -m worker run --app bench_app:app` (bench/ on PYTHONPATH).

``trivial`` is one step that returns; ``waiter`` parks until it is signalled.
With ``LANE_WORKER_BENCH_DROP_RUN_LOGS=1`` the daemon's two per-run info lines
(``run.started``, ``run.completed``) are dropped before rendering, so a drain can
be timed with and without them. The daemon configures logging before it imports
the app, so this runs after that.
"""

from __future__ import annotations

import os
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


def _drop_per_run(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Any:
    if event.get("event") in PER_RUN_EVENTS:
        raise structlog.DropEvent
    return event


if os.environ.get("LANE_WORKER_BENCH_DROP_RUN_LOGS") == "1":
    structlog.configure(processors=[_drop_per_run, *structlog.get_config()["processors"]])
