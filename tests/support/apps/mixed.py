"""Apps of one release, and the retry and signal plays (`--app support.apps.mixed:<app>`).

``lean`` and ``full`` are two apps of one release, as a rolling restart or a
mixed deployment runs them: both register ``common``, only ``full`` registers
``only-full``. ``safety`` holds the plays of the retry and signal tests.

Step bodies record each execution as one line in ``<dir>/<run id>.log`` (the
directory comes in the input), so a test counts executions across processes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from worker import App, TaskContext

lean = App()
full = App()
safety = App()

ONLY_FULL = "only-full"


def record(directory: str, ctx: TaskContext) -> None:
    """Append one line for an execution of a step of run ``ctx.run_id``."""
    with (Path(directory) / f"{ctx.run_id}.log").open("a") as out:
        out.write(f"{ctx.release_id} pid={os.getpid()} attempt={ctx.attempt}\n")
        out.flush()


@lean.play("common")
@full.play("common")
async def common(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """A play every machine of the release registers."""
    return {"release": await ctx.step("echo", lambda: ctx.release_id)}


@full.play(ONLY_FULL)
async def only_full(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """A play only the ``full`` app registers: one step of ``params["seconds"]``."""

    async def work() -> int:
        await asyncio.sleep(float(params.get("seconds", 0)))
        return os.getpid()

    return {"pid": await ctx.step("work", work), "n": params.get("n")}


@safety.play("counted")
async def counted(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """One recorded step that raises until the file ``<dir>/pass`` exists."""

    def attempt() -> str:
        record(params["dir"], ctx)
        if not (Path(params["dir"]) / "pass").exists():
            raise RuntimeError("upstream is down")
        return ctx.run_id

    return {"ran": await ctx.step("work", attempt)}


@safety.play("approval")
async def approval(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """Wait for event ``approved``; return what it carried."""
    reply = await ctx.wait_for_event("approval", "approved", timeout=600)
    return {
        "ok": reply.get("ok"),
        "n": reply.get("n"),
        "timed_out": reply["timed_out"],
        "run": ctx.run_id,
    }


def executions(directory: Path, run_id: str) -> int:
    """Return how many times a step of run ``run_id`` executed (:func:`record`)."""
    path = directory / f"{run_id}.log"
    return len(path.read_text().splitlines()) if path.exists() else 0
