"""A worktree's worker and a retired release lane on one database: neither adopts the other's runs.

Found by the fresh-clone walk of 2026-12-07: a worker with
``DEEPLINE_ABSURD_QUEUE_SUFFIX`` registered after a release lane counted as a newer
release, so once that release retired it adopted the release's parked runs and ran
them on the worktree's code. Store migration 0035 keeps dev lanes out of the
roll-forward order.
"""

from __future__ import annotations

from support.daemon import Daemons
from support.runtime import open_client

REL = "rel-x"
QUEUE_REL = "runs_rel_x"
DEV_SUFFIX = "feature"
DEV = f"dev-{DEV_SUFFIX}"
QUEUE_DEV = "runs_feature"


async def test_a_worktree_worker_never_adopts_a_retired_release_lane_s_parked_run(
    database_url: str,
) -> None:
    """rel-x parks a run and retires; a live worktree worker leaves it to rel-x's machines."""
    env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": REL}
    async with Daemons(database_url) as pool, open_client(database_url, env) as client:
        rel = pool.start(REL, name="rel-x")
        await rel.ready()
        run = await client.submit("waiter", {})
        await rel.wait_for("run.parked", run_id=run.run_id)
        rel.terminate()
        assert await rel.wait_exit(timeout_s=15) == 0
        assert await client.retire_release(REL) == QUEUE_REL

        dev = pool.start(
            DEV, name="dev", DEEPLINE_ABSURD_QUEUE_SUFFIX=DEV_SUFFIX,
            DEEPLINE_RUNTIME_DEPLOY_VERSION=None,
        )  # fmt: skip
        booted = await dev.ready()
        assert booted["queue"] == QUEUE_DEV
        # The drain verdict does not count the worktree as a release that could adopt the
        # run: rel-x holds work only its own machines may run, so they must not stop.
        by_queue = {lane.queue: lane for lane in await client.lanes()}
        lane = by_queue[QUEUE_REL]
        assert (lane.status, lane.waiting, lane.adoptable) == ("draining", 1, 0)
        assert by_queue[QUEUE_DEV].status == "claiming"

        assert not (await client.signal(run.run_id, "go", {"by": "dev-test"})).duplicate
        # rel-x's own machine comes back and finishes it (its retired lane drains it).
        again = pool.start(REL, name="rel-x-again")
        await again.ready()
        await again.wait_for("run.completed", run_id=run.run_id)

        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert status.adopted_release_id is None
        assert {x.release_id for x in status.attempts} == {REL}
        assert not dev.events(run_id=run.run_id)
        assert not dev.events("loop.attached", queue=QUEUE_REL)
        for daemon in (dev, again):
            daemon.terminate()
            assert await daemon.wait_exit(timeout_s=15) == 0
            assert daemon.malformed_lines() == []
