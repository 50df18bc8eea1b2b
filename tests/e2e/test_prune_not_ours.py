"""`lanes prune` never drops an engine queue lane-worker did not create (issue 29), by the CLI.

The TypeScript app, on the same engine and database, creates `runs_shared` (release
ids coincide) and runs a task there; its own cleanup removes the finished task; an
operator retires release `shared` with --force. `lanes prune` dropped the app's
queue, and the app's next spawn_task failed: relation absurd.t_runs_shared does
not exist.
"""

from __future__ import annotations

from support import typescript as ts
from support.cli import lane_worker, lane_worker_json
from support.db import sql
from support.runtime import queue_of

RELEASE = "shared"
QUEUE = queue_of(RELEASE)


async def test_lanes_prune_keeps_the_typescript_apps_queue_and_says_why(
    database_url: str,
) -> None:
    """Kept (keptNotOurs in --json, one sentence on stderr in text); the app spawns on."""
    assert QUEUE == "runs_shared"
    await sql(database_url, "select absurd.create_queue($1)", QUEUE)  # the TS app's
    await ts.spawn(database_url, QUEUE)
    (claimed,) = await ts.claim(database_url, QUEUE)
    await ts.complete(database_url, QUEUE, claimed["run_id"])
    await sql(database_url, f'delete from absurd."r_{QUEUE}"')  # the app's own cleanup
    await sql(database_url, f'delete from absurd."t_{QUEUE}"')
    retired = await lane_worker(database_url, "lanes", "retire", RELEASE, "--force")
    assert retired.returncode == 0, retired.stderr
    assert await lane_worker_json(database_url, "lanes", "prune", "--older-than", "0") == {
        "dryRun": False,
        "queues": [],
        "keptLive": [],
        "keptBusy": [],
        "keptForeign": [],
        "keptNotOurs": [QUEUE],
    }
    text = await lane_worker(database_url, "lanes", "prune", "--older-than", "0")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == ["pruned 0 lane queue(s)."]
    (said,) = text.stderr.splitlines()
    assert said.startswith(
        "kept 1 drained lane(s) whose engine queue lane-worker has no record of creating"
    )
    assert "absurdctl drop-queue" in said
    assert said.endswith(f": {QUEUE}")
    assert await sql(
        database_url, "select count(*) from absurd.queues where queue_name = $1", QUEUE
    )
    await ts.spawn(database_url, QUEUE)  # no "relation absurd.t_runs_shared does not exist"
