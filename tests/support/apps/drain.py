"""Plays for deploy day judged by the drain report (`--app support.apps.drain:app`).

The `lanes wait` and remedies e2e tests run these: a one-step play, a durable nap,
an event wait, a step that fails until a file exists (a flaky upstream) and a step
that holds until a file exists (work in flight for as long as the test wants).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.apps.faults import wait_for_gate
from worker import App, TaskContext

app = App()
GATE_LIMIT_S = 120.0


@app.play("plain")
async def plain(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """One step; returns who ran it."""
    return {"release": await ctx.step("echo", lambda: ctx.release_id)}


@app.play("nap")
async def nap(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A durable sleep of ``seconds``, then a step."""
    await ctx.sleep("nap", float(params["seconds"]))
    return {"release": await ctx.step("after", lambda: ctx.release_id)}


@app.play("waiter")
async def waiter(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """Wait for event ``go``, then a step."""
    reply = await ctx.wait_for_event("gate", "go", timeout=600)
    return {"release": await ctx.step("after", lambda: ctx.release_id), "by": reply.get("by")}


@app.play("fail-until")
async def fail_until(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A step that fails until the file ``params["pass"]`` exists (a flaky upstream)."""

    def attempt() -> str:
        if not Path(params["pass"]).exists():
            raise RuntimeError("upstream is down")
        return ctx.release_id

    return {"release": await ctx.step("try", attempt)}


@app.play("gated")
async def gated(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A step that holds until the file ``params["gate"]`` exists (at most 120 s)."""

    async def held() -> str:
        await wait_for_gate(Path(params["gate"]), GATE_LIMIT_S)
        return ctx.release_id

    return {"release": await ctx.step("held", held)}
