"""A deleted worktree's dev lane goes by itself, and comes back with its worktree (issue 31 §1).

Real daemons: a worktree's worker (``DEEPLINE_ABSURD_QUEUE_SUFFIX``) runs a run and
stops for good. A release worker's maintenance retires its lane once idle past
``LANE_WORKER_DEV_LANE_IDLE_AFTER``, and a later pass prunes it (engine queue
dropped) past ``LANE_WORKER_PRUNE_AFTER``. The worktree comes back: its worker boots
on the pruned lane, the lane claims again, and a run submitted there completes.
"""

from __future__ import annotations

from support.daemon import Daemons
from support.db import execute, sql
from support.runtime import SCHEMA, open_client

SUFFIX = "gone"
DEV = f"dev-{SUFFIX}"
QUEUE = "runs_gone"
KEEPER = "rel-keeper"
AGED = {"LANE_WORKER_DEV_LANE_IDLE_AFTER": "3600", "LANE_WORKER_PRUNE_AFTER": "60"}


async def lane_row(database_url: str) -> tuple[str, bool]:
    status = await sql(
        database_url, f"select status from {SCHEMA}.releases where queue = $1", QUEUE
    )
    pruned = await sql(
        database_url, f"select pruned_at is not null from {SCHEMA}.releases where queue = $1", QUEUE
    )
    return status, pruned


async def test_a_dev_lane_idle_long_is_retired_pruned_and_comes_back(database_url: str) -> None:
    dev_env = {"DEEPLINE_ABSURD_QUEUE_SUFFIX": SUFFIX, "DEEPLINE_RUNTIME_DEPLOY_VERSION": None}
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_ABSURD_QUEUE_SUFFIX": SUFFIX}) as client,
    ):
        dev = pool.start(DEV, name="worktree", **dev_env)
        assert (await dev.ready())["queue"] == QUEUE
        run = await client.submit("plain", {})
        await dev.wait_for("run.completed", run_id=run.run_id)
        dev.terminate()
        assert await dev.wait_exit(timeout_s=15) == 0
        # Two hours pass with no worker of it.
        for statement in (
            f"update {SCHEMA}.releases set updated_at = now() - interval '2 hours'"
            " where queue = $1",
            f"update {SCHEMA}.workers set heartbeat_at = now() - interval '2 hours',"
            " stopped_at = now() - interval '2 hours' where queue = $1",
        ):
            await execute(database_url, statement, QUEUE)

        keeper = pool.start(KEEPER, name="keeper", **AGED)
        await keeper.wait_for("lane.dev_retired", queue=QUEUE)
        keeper.terminate()
        assert await keeper.wait_exit(timeout_s=15) == 0
        assert await lane_row(database_url) == ("retired", False)

        await execute(
            database_url,
            f"update {SCHEMA}.releases set retired_at = now() - interval '2 hours'"
            " where queue = $1",
            QUEUE,
        )
        keeper = pool.start(KEEPER, name="keeper-again", **AGED)
        await keeper.wait_for("lane.pruned", queue=QUEUE)
        keeper.terminate()
        assert await keeper.wait_exit(timeout_s=15) == 0
        assert await lane_row(database_url) == ("retired", True)
        gone = await sql(
            database_url, "select count(*) from absurd.queues where queue_name = $1", QUEUE
        )
        assert gone == 0
        assert QUEUE not in {lane.queue for lane in await client.lanes()}  # pruned: hidden

        # The worktree comes back next week: it just works.
        back = pool.start(DEV, name="worktree-back", **dev_env)
        assert (await back.ready())["queue"] == QUEUE
        assert back.events("lane.dev_activated")
        assert await lane_row(database_url) == ("claiming", False)
        again = await client.submit("plain", {})
        await back.wait_for("run.completed", run_id=again.run_id)
        assert (await client.status(again.run_id)).status == "completed"
        back.terminate()
        assert await back.wait_exit(timeout_s=15) == 0
        assert back.malformed_lines() == []
