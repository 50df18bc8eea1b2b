"""Where `runs retry` sends a retry: a dev lane's run stays on its dev lane, a release's
run never goes to a dev lane (worker/ops/retry_target.py), on real Postgres.

Each lane has a live worker that registers every play. Before issue 31 a dev-wt
run's retry went to the newest claiming lane: B (production) when it was newest,
or another worktree's lane.
"""

from __future__ import annotations

import uuid

import pytest

from support.db import age_worker, run_row
from support.plays import RemedyPlays, remedies_app, two_lanes
from support.runtime import (
    env_of,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    work_once,
)
from worker.errors import InvalidRequestError, NoClaimingLaneError, RetryRefusedError

B = "rel-b"
DEV, DEV_NEW = "dev-wt", "dev-new"


async def test_a_dev_lane_run_is_retried_on_its_own_dev_lane_only(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """The dev run's retry goes to dev-wt (not B, not dev-new); with dev-wt's worker gone it
    is refused naming --to and nothing is written; --to B is refused (a release), --to
    dev-new (another worktree's lane) sends it there."""
    app = remedies_app(remedy_plays)
    async with (
        open_client(database_url, env_of("rel-a")) as client,
        open_runtime(database_url, app, "rel-a") as rt_a,
        open_runtime(database_url, app, DEV) as rt_dev,
        open_runtime(database_url, app, B) as rt_b,
        open_runtime(database_url, app, DEV_NEW) as rt_new,
    ):
        # Registered in this order: B, the newest lane, came after both dev lanes.
        for release, runtime in (("rel-a", rt_a), (DEV_NEW, rt_new), (DEV, rt_dev), (B, rt_b)):
            await client.activate_release(release, force=True)
            await register_worker(runtime)

        dev_run = await client.submit("plain", {"k": 1}, queue_suffix="wt")
        assert (await run_row(database_url, dev_run.run_id))["release_id"] == DEV
        assert await client.fail_run(dev_run.run_id, "try again")
        retried = await client.retry_run(dev_run.run_id)
        assert (retried.release_id, retried.queue) == (DEV, queue_of(DEV))
        assert await work_once(rt_b) == []
        assert await work_once(rt_dev) == ["completed"]

        # Its lane has no live worker: refused, naming --to; nothing submitted.
        second = await client.submit("plain", {"k": 2}, queue_suffix="wt")
        assert await client.fail_run(second.run_id, "try again")
        await age_worker(database_url, rt_dev.worker_base)
        before = len(await client.runs(limit=100))
        with pytest.raises(NoClaimingLaneError, match=r"--to") as refused:
            await client.retry_run(second.run_id)
        assert DEV in str(refused.value)
        assert len(await client.runs(limit=100)) == before
        assert (await run_row(database_url, second.run_id))["retried_by"] is None
        # Named, a release is refused: a worktree's run never goes to a release.
        with pytest.raises(InvalidRequestError, match="never goes to release lane"):
            await client.retry_run(second.run_id, to_release=B)
        assert (await run_row(database_url, second.run_id))["retried_by"] is None
        # Another worktree's dev lane is a target (checked as always).
        to_new = await client.retry_run(second.run_id, to_release=DEV_NEW)
        assert (to_new.release_id, to_new.queue) == (DEV_NEW, queue_of(DEV_NEW))
        assert await work_once(rt_b) == []
        assert await work_once(rt_new) == ["completed"]


async def test_a_release_run_is_never_retried_on_a_dev_lane(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """A release run's retry goes to B though dev-new is the newest claiming lane; with
    every release lane retired it is refused, never sent to a dev lane."""
    app = remedies_app(remedy_plays)
    async with (
        two_lanes(database_url, app) as (client, _rt_a, _rt_b),
        open_runtime(database_url, app, DEV_NEW) as rt_new,
    ):
        await client.activate_release(DEV_NEW, force=True)
        await register_worker(rt_new)
        run = await client.submit("plain", {"k": 3})
        assert await client.fail_run(run.run_id, "try again")
        retried = await client.retry_run(run.run_id)
        assert (retried.release_id, retried.queue) == (B, queue_of(B))

        other = await client.submit("plain", {"k": 4})
        assert await client.fail_run(other.run_id, "try again")
        await client.retire_release("rel-a")
        await client.retire_release(B)
        with pytest.raises(NoClaimingLaneError):
            await client.retry_run(other.run_id)
        assert (await run_row(database_url, other.run_id))["retried_by"] is None


async def test_a_retry_expecting_another_target_is_refused(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """The page's expect_queue: a retry whose target is no longer the previewed lane is
    refused and writes nothing; a bad --to is refused; the plan says what would happen."""
    app = remedies_app(remedy_plays)
    async with two_lanes(database_url, app) as (client, _rt_a, _rt_b):
        run = await client.submit("plain", {"k": 5})
        assert await client.fail_run(run.run_id, "try again")
        remedies = client.remedies
        with pytest.raises(RetryRefusedError, match="preview"):
            await remedies.retry_run(run.run_id, expect_queue=queue_of("rel-a"))
        assert (await run_row(database_url, run.run_id))["retried_by"] is None
        with pytest.raises(InvalidRequestError, match="not a registered lane"):
            await remedies.retry_run(run.run_id, to_release="rel-nowhere")
        [plan] = (await remedies.plan_retries([uuid.UUID(run.run_id)], None)).values()
        assert (plan.release_id, plan.queue, plan.retried) == (B, queue_of(B), False)
        done = await remedies.retry_run(run.run_id, expect_queue=queue_of(B))
        assert (done.created, done.queue) == (True, queue_of(B))
        [plan] = (await remedies.plan_retries([uuid.UUID(run.run_id)], None)).values()
        assert (plan.retried, plan.queue) == (True, None)
