"""Attacks of 2026-12-07 (b) on dev lanes standing apart, idle dev lanes and their neighbours.

Each xfail(strict) test is a defect found against real Postgres and real daemons:
it fails on the code of its commit and passes once the defect is fixed.
"""

from __future__ import annotations

import asyncio

import pytest

from support.daemon import Daemon, Daemons
from support.db import sql
from support.runtime import SCHEMA, open_client



async def finished_by(daemons: tuple[Daemon, ...], run_id: str) -> Daemon:
    """The daemon that logs the run's completion first (whichever of them)."""
    while True:
        for daemon in daemons:
            if daemon.events("run.completed", run_id=run_id):
                return daemon
        await asyncio.sleep(0.05)


SHARED = "foo"  # a release id and a worktree suffix that both give queue runs_foo
QUEUE_SHARED = "runs_foo"
NEWER = "rel-newer"


@pytest.mark.xfail(
    strict=True,
    reason="a worktree whose suffix names a release's queue (release foo, suffix foo: runs_foo) "
    "boots on it unrefused; its dev-foo spelling makes the release lane 'dev' (lane_is_dev), "
    "so the newer release stops adopting the release's parked run and the worktree runs it",
)
async def test_a_worktree_on_a_release_s_queue_never_runs_the_release_s_parked_run(
    database_url: str,
) -> None:
    """Release foo parks a run and retires behind rel-newer; a worktree with suffix foo boots.

    The run must be adopted by rel-newer (or the worktree refused): never executed by
    the worktree's code, never stranded.
    """
    rel_env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": SHARED}
    async with Daemons(database_url) as pool, open_client(database_url, rel_env) as client:
        rel = pool.start(SHARED, name="rel-foo")
        assert (await rel.ready())["queue"] == QUEUE_SHARED
        run = await client.submit("waiter", {})
        await rel.wait_for("run.parked", run_id=run.run_id)
        rel.terminate()
        assert await rel.wait_exit(timeout_s=15) == 0

        newer = pool.start(NEWER, name="rel-newer")
        await newer.ready()
        assert await client.retire_release(SHARED) == QUEUE_SHARED

        dev = pool.start(
            f"dev-{SHARED}", name="worktree", DEEPLINE_ABSURD_QUEUE_SUFFIX=SHARED,
            DEEPLINE_RUNTIME_DEPLOY_VERSION=None,
        )  # fmt: skip
        # Either the worktree is refused, or it boots beside the release lane.
        await dev.wait_for("worker.ready")
        assert not (await client.signal(run.run_id, "go", {"by": "attack"})).duplicate
        await finished_by((newer, dev), run.run_id)
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert status.adopted_release_id == NEWER
        assert not dev.events(run_id=run.run_id)
        for daemon in (dev, newer):
            daemon.terminate()
            await daemon.wait_exit(timeout_s=15)
        rows = await sql(
            database_url, f"select release_ids from {SCHEMA}.releases where queue = $1",
            QUEUE_SHARED,
        )  # fmt: skip
        assert rows is not None
