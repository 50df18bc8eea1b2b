"""A simulated TypeScript system beside a real daemon: its tasks on the shared lane are its own.

The daemon serves lane ``runs_rel_shared``; the TS app, stamped with the same
release, spawns its own tasks there and on a queue of its own. The daemon runs
its own run, leaves the TS tasks (once logged), and the TS worker then takes each
as its first attempt: nothing cancelled, nothing spent.
"""

from __future__ import annotations

import uuid

from support import typescript as ts
from support.daemon import Daemons, queue_of
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
