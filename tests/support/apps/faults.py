"""Plays for the fault suites (`python -m worker run --app support.apps.faults:app`).

Every step records each execution of its body as one line in a file of its
own (``<dir>/<key>.<step>.log``, see :func:`support.apps.basic.record`), written inside the
step, so a test counts executions per run and step across restarts, outages
and processes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from support.apps.basic import record
from worker import App, TaskContext

app = App()
GATE_LIMIT_S = 60.0


GATE_POLL_S = 0.02


def gate_open(path: Path) -> bool:
    """Tell whether the gate file exists."""
    return path.exists()


async def wait_for_gate(path: Path, limit_s: float) -> None:
    """Return once the file ``path`` exists, or after ``limit_s`` seconds."""
    for _ in range(int(limit_s / GATE_POLL_S)):
        if gate_open(path):
            return
        await asyncio.sleep(GATE_POLL_S)


def executions(directory: str | Path, key: str, step: str) -> int:
    """Return how many times step ``step`` of the run keyed ``key`` executed (0 when never)."""
    path = Path(directory) / f"{key}.{step}.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


@app.play("stepper")
async def stepper(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Step ``a``, step ``long``, an optional durable sleep ``nap``, step ``b``.

    ``long`` sleeps ``seconds`` on its first execution and ``rerun_seconds``
    (default 0) on any later one, so a run handed back mid-step finishes fast
    on the next claim. With ``gate`` (a file path) the first execution first
    waits until that file exists (at most 60 s), so a test decides when the
    step can end. ``nap`` (durable) lasts ``nap`` seconds when that is > 0.
    Each step returns which execution of it this was (1 for the first), so the
    output names the execution whose result was committed.
    """
    directory, key = params["dir"], params["key"]

    def a() -> int:
        return record(directory, f"{key}.a", ctx) + 1

    async def long() -> int:
        before = record(directory, f"{key}.long", ctx)
        if before == 0 and params.get("gate"):
            await wait_for_gate(Path(params["gate"]), GATE_LIMIT_S)
        seconds = params.get("seconds", 0) if before == 0 else params.get("rerun_seconds", 0)
        await asyncio.sleep(float(seconds))
        return before + 1

    def b() -> int:
        return record(directory, f"{key}.b", ctx) + 1

    committed = {"a": await ctx.step("a", a), "long": await ctx.step("long", long)}
    if float(params.get("nap", 0)) > 0:
        await ctx.sleep("nap", float(params["nap"]))
    committed["b"] = await ctx.step("b", b)
    return {"committed": committed, "release": ctx.release_id}


@app.play("blocking")
async def blocking(ctx: TaskContext, params: dict[str, Any]) -> int:
    """One sync step that blocks its thread for ``seconds`` (a client without async)."""

    def block() -> int:
        before = record(params["dir"], f"{params['key']}.block", ctx)
        time.sleep(float(params["seconds"]) if before == 0 else 0)
        return before + 1

    return int(await ctx.step("block", block))
