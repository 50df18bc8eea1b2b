"""Adversarial review (wt-attack) of maintenance's auto-prune (LANE_WORKER_PRUNE_AFTER).

Marked ``xfail(strict=True)``: it fails on the code under review and must pass
once the defect is fixed (then the mark goes).
"""

from __future__ import annotations

from support.cli import lane_worker_json
from support.db import execute
from support.runtime import SCHEMA, env_of, open_client
from worker.daemon.maintenance import maintain

DAY = 86_400.0
GOOD_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-a"}


async def test_a_given_up_sandbox_stays_named_after_its_lane_is_pruned(database_url: str) -> None:
    release = "atk-prune-sbx"
    async with open_client(database_url, env_of(release)) as client:
        run = await client.submit("plain", {})
        assert await client.cancel(run.run_id)
        await client.retire_release(release)
    # The cleanup gave up (20 attempts): the operator must delete the sandbox by hand.
    await execute(
        database_url,
        f"insert into {SCHEMA}.run_sandboxes (run_id, sandbox_id, cleanup, cleanup_queue,"
        " cleanup_attempts) values ($1::uuid, 'sbx-left', 'failed', $2, 20)",
        run.run_id, run.queue,
    )  # fmt: skip
    before = await lane_worker_json(database_url, "lanes", "--json")
    assert "sbx-left" in str(before)
    await execute(
        database_url,
        f"update {SCHEMA}.releases set retired_at = now() - interval '2 days' where queue = $1",
        run.queue,
    )
    async with open_client(database_url, GOOD_ENV) as client:
        assert await maintain(client.db, client.store, worker_id="test", prune_after_s=DAY)
    after = await lane_worker_json(database_url, "lanes", "--json")
    assert "sbx-left" in str(after)
