"""The basic plays and one detached runner: the TypeScript client's daemon test reports for it.

Imports the basic app and adds a play to it in the daemon's process only (the other
daemons' ``support.apps.basic:app`` is unchanged).
"""

from __future__ import annotations

from typing import Any

from support.apps.basic import app
from worker import DetachedRunner, TaskContext

__all__ = ["app"]


@app.play("detached")
async def detached(ctx: TaskContext, params: Any) -> dict[str, Any]:
    """Launch runner ``build`` (nothing starts: the test reports for it); return its report."""

    def launch(runner: DetachedRunner) -> dict[str, Any]:
        return {"runnerAttempt": runner.runner_attempt}

    return await ctx.run_detached("build", launch, timeout=3600)
