"""Plays for the daemon end-to-end tests (`python -m worker run --app support.apps.basic:app`).

Step bodies that a test must count write one line per execution to a file in
a directory the test passes in the input, so executions survive a SIGKILL and
can be counted across processes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from worker import App, TaskContext

app = App()


def record(directory: str, step: str, ctx: TaskContext) -> int:
    """Append one line for an execution of ``step``; return how many came before it."""
    path = Path(directory) / f"{step}.log"
    before = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as out:
        out.write(f"{ctx.release_id} pid={os.getpid()} attempt={ctx.attempt}\n")
        out.flush()
    return before


@app.play("plain")
async def plain(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """One step that returns the input and who ran it."""
    return await ctx.step("echo", lambda: {"input": params, "release": ctx.release_id})


@app.play("sleeper")
async def sleeper(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A step, a durable sleep of ``seconds``, a step; returns the release of each step."""
    before = await ctx.step("before", lambda: ctx.release_id)
    await ctx.sleep("nap", float(params["seconds"]))
    after = await ctx.step("after", lambda: ctx.release_id)
    return {"before": before, "after": after}


@app.play("waiter")
async def waiter(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """Wait for event ``go``; return what it carried and who resumed it."""
    reply = await ctx.wait_for_event("gate", "go", timeout=600)
    return {
        "resumed": reply["resumed"],
        "timed_out": reply["timed_out"],
        "by": reply.get("by"),
        "release": ctx.release_id,
    }


@app.play("short-waiter")
async def short_waiter(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Wait for event ``go`` at most ``timeout`` seconds; return whether it timed out."""
    reply = await ctx.wait_for_event("gate", "go", timeout=float(params["timeout"]))
    return {"timed_out": reply["timed_out"], "release": ctx.release_id}


@app.play("late-waiter")
async def late_waiter(ctx: TaskContext, params: dict[str, Any]) -> None:
    """A step of ``linger`` seconds, then a wait for an event that never comes."""

    async def linger() -> None:
        await asyncio.sleep(float(params["linger"]))

    await ctx.step("linger", linger)
    await ctx.wait_for_event("never", "never", timeout=3600)


@app.play("flaky")
async def flaky(ctx: TaskContext, params: Any) -> None:
    """A step that always raises, so the run sits in retry backoff."""

    def boom() -> None:
        raise RuntimeError("upstream is down")

    await ctx.step("boom", boom)


def _exists(path: Path) -> bool:
    return path.exists()


async def _until_exists(path: Path, limit_s: float) -> None:
    """Return once the file ``path`` exists, or after ``limit_s`` seconds."""
    for _ in range(int(limit_s / 0.05)):
        if _exists(path):
            return
        await asyncio.sleep(0.05)


@app.play("slow")
async def slow(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Step ``one`` (quick), then step ``two``, which sleeps ``seconds`` the first time.

    Both record each execution under ``params["dir"]``; a re-run of ``two``
    (after a hand-back or a crash) sleeps ``rerun_seconds`` (default 0). With
    ``gate`` (a path), ``two`` then also waits until that file exists (at most 300 s).
    """
    directory = params["dir"]

    def one() -> str:
        record(directory, "one", ctx)
        return ctx.release_id

    async def two() -> str:
        before = record(directory, "two", ctx)
        seconds = params["seconds"] if before == 0 else params.get("rerun_seconds", 0)
        await asyncio.sleep(float(seconds))
        # Then, with a ``gate`` file named, until it exists (the test decides when it ends).
        if params.get("gate"):
            await _until_exists(Path(params["gate"]), 300)
        return ctx.release_id

    first = await ctx.step("one", one)
    second = await ctx.step("two", two)
    return {"one": first, "two": second}


@app.play("gated")
async def gated(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A step that fails (so the run retries) until the file ``open`` exists in ``dir``."""

    def through() -> str:
        record(params["dir"], "gated", ctx)
        if not (Path(params["dir"]) / "open").exists():
            raise RuntimeError("the gate is closed")
        return ctx.release_id

    return {"release": await ctx.step("through", through)}


@app.play("sandboxed")
async def sandboxed(ctx: TaskContext, params: dict[str, Any]) -> str:
    """Register sandbox ``params["sandbox"]`` (deleted once the run ends) and end."""
    await ctx.register_sandbox(params["sandbox"])
    return "done"
