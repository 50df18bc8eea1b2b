"""A simulated TypeScript system beside a real daemon: its tasks on the shared lane are its own.

The daemon serves lane ``runs_rel_shared``; the TS app, stamped with the same
release, spawns its own tasks there and on a queue of its own. The daemon runs
its own run, leaves the TS tasks (once logged), and the TS worker then takes each
as its first attempt: nothing cancelled, nothing spent.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from support import typescript as ts
from support.daemon import Daemons, queue_of
from support.db import execute, fetch, sql
from support.runtime import env_of, eventually, open_client

RELEASE = "rel-shared"
QUEUE = queue_of(RELEASE)
TS_OWN_QUEUE = "ts_jobs"


async def test_a_daemon_leaves_the_typescript_apps_tasks_on_its_lane_to_their_owner(
    database_url: str,
) -> None:
    """Never claimed or cancelled; the TS worker runs each as attempt 1."""
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, env_of(RELEASE)) as client,
    ):
        daemon = pool.start(RELEASE, LANE_WORKER_CLAIM_TIMEOUT="30")
        await daemon.ready()
        theirs = [
            await ts.spawn(database_url, QUEUE),
            await ts.spawn(database_url, QUEUE, "play-run", {"runId": str(uuid.uuid4())}),
        ]
        untouched = await ts.spawn(database_url, TS_OWN_QUEUE)
        mine = await client.submit("plain")
        assert (await client.wait(mine.run_id, 30)).status == "completed"
        # Spawned before the run the daemon has just completed, so its claim walked past
        # them: never claimed, still pending as spawned.
        for task_id in theirs:
            (run,) = await ts.task_runs(database_url, QUEUE, task_id)
            assert (run["state"], run["claimed_by"], run["attempt"]) == ("pending", None, 1)
        daemon.terminate()
        assert await daemon.wait_exit() == 0, daemon.tail()

        taken: dict[uuid.UUID, int] = {}

        async def ts_worker_took_both() -> bool:
            for row in await ts.claim(database_url, QUEUE):
                taken[row["task_id"]] = row["attempt"]
                await ts.complete(database_url, QUEUE, row["run_id"])
            return len(taken) == 2

        await eventually(ts_worker_took_both, what="the TS worker to take its two tasks")
    assert taken == dict.fromkeys(theirs, 1)
    for task_id in theirs:
        (run,) = await ts.task_runs(database_url, QUEUE, task_id)
        assert (run["task_state"], run["claimed_by"]) == ("completed", ts.TS_WORKER)
    (own,) = await ts.task_runs(database_url, TS_OWN_QUEUE, untouched)
    assert (own["state"], own["claimed_by"], own["attempt"]) == ("pending", None, 1)
    assert daemon.events("run.foreign_left") == []  # never even handed over
    assert daemon.events("run.orphan_cancelled") == []


async def test_a_worker_boot_refuses_to_replace_the_typescript_apps_patched_engine(
    database_url: str,
) -> None:
    """An older engine with the TS app's patched claim_task: exit 78, one sentence, unchanged."""
    await ts.install_engine(database_url, "0.5.0", patch=True)
    async with Daemons(database_url) as pool:
        daemon = pool.start(RELEASE)
        assert await daemon.wait_exit() == 78, daemon.tail()
    (line,) = [ln for ln in daemon.stderr.splitlines() if ln.strip()]
    assert "absurd.claim_task" in line
    assert "--replace-engine-functions" in line
    assert await ts.engine_state(database_url) == ("0.5.0", True)


async def test_a_daemon_on_a_queue_the_typescript_app_created_leaves_its_policy(
    database_url: str,
) -> None:
    """Boot, claims and maintenance keep the app's policy; its own old task goes at 6 hours.

    The TS app created the lane's queue first (the engine's default policy: 30
    days, by which the app's own cleanup deletes the app's finished tasks). A
    lane-worker run on it ended 7 hours ago: the daemon's first maintenance pass
    deletes its task by lane-worker's retention, not the queue's policy, and keeps
    the app's task that ended as long ago.
    """
    policy = "select cleanup_ttl, cleanup_limit from absurd.get_queue_policy($1)"
    app_policy = [(timedelta(days=30), 1000)]
    async with open_client(database_url, env_of(RELEASE)) as client:
        theirs = await ts.spawn(database_url, QUEUE)
        await sql(database_url, "select absurd.cancel_task($1, $2)", QUEUE, theirs)
        old = await client.submit("plain")
        assert await client.cancel(old.run_id)
        old_task = await sql(
            database_url, "select task_id from runtime_scheduler.runs where run_id = $1::uuid",
            old.run_id,
        )  # fmt: skip
        await execute(
            database_url,
            f'update absurd."t_{QUEUE}" set cancelled_at = absurd.current_time()'
            " - interval '7 hours' where task_id = any($1::uuid[])",
            [theirs, old_task],
        )
        async with Daemons(database_url) as pool:
            daemon = pool.start(RELEASE)
            await daemon.ready()
            await daemon.wait_for("maintenance.passed")
            mine = await client.submit("plain")
            assert (await client.wait(mine.run_id, 30)).status == "completed"
            kept = {
                r["task_id"]
                for r in await fetch(database_url, f'select task_id from absurd."t_{QUEUE}"')
            }
            rows = await fetch(database_url, policy, QUEUE)
            daemon.terminate()
            assert await daemon.wait_exit() == 0, daemon.tail()
    assert old_task not in kept
    assert theirs in kept
    assert [(r["cleanup_ttl"], r["cleanup_limit"]) for r in rows] == app_policy
    assert daemon.events("maintenance.cleaned", queue=QUEUE)[0]["tasks"] == 1
