"""The built-in demo app (``worker.demo:app``) that ``lane-worker dev`` runs.

Each play shows one durable feature: steps that run once, a sleep that
survives restarts, an event wait that ``lane-worker dev`` signals itself, and a
retry after a failed attempt.
"""

from __future__ import annotations

from typing import Any

from worker import App, TaskContext

app = App()

# What `lane-worker dev` submits, and the signal it sends to each event wait.
DEMO_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("greet", {"name": "lane-worker"}),
    ("nap", {"seconds": 2}),
    ("approval", {"order": "A-1001"}),
    ("flaky-once", {}),
]
DEMO_SIGNALS: dict[str, tuple[str, dict[str, Any]]] = {
    "approval": ("approved", {"by": "dev", "note": "looks good"}),
}


@app.play("greet")
async def greet(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Two steps; each runs once, however often the run resumes."""
    name = await ctx.step("pick-name", lambda: str(params.get("name", "world")))
    text = await ctx.step("compose", lambda: f"hello, {name}")
    return {"greeting": text, "release": ctx.release_id}


@app.play("nap")
async def nap(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A durable sleep between two steps: the run parks and resumes, on any worker."""
    before = await ctx.step("before", lambda: "awake")
    await ctx.sleep("nap", float(params.get("seconds", 2)))
    after = await ctx.step("after", lambda: "rested")
    return {"before": before, "after": after}


@app.play("approval")
async def approval(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Wait for an `approved` event (lane-worker dev sends it); time out after a minute."""
    order = await ctx.step("load-order", lambda: {"id": params.get("order"), "total": 42})
    reply = await ctx.wait_for_event("approval", "approved", timeout=60)
    return {"order": order, "approved": reply["resumed"], "by": reply.get("by")}


@app.play("flaky-once")
async def flaky_once(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Fail the first attempt, succeed on the retry (backoff 1 s)."""

    def call_upstream() -> str:
        if ctx.attempt == 1:
            raise RuntimeError("upstream timed out (the demo fails attempt 1 on purpose)")
        return "ok"

    answer = await ctx.step("call-upstream", call_upstream)
    return {"answer": answer, "attempt": ctx.attempt}
