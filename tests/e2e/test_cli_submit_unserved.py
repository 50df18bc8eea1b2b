"""``lane-worker submit`` to a lane nobody serves: accepted, with a warning (issue 31 §1).

A real daemon and the real CLI against a fresh database: before the release's
worker boots, ``submit`` prints the run id on stdout and one warning on stderr
naming the lane's queue and the worker that would serve it (``--json``: ``served``
false and ``warning``); with the worker up, or its lane still claiming after it
stopped, nothing is said; a play none of its live workers registers is accepted
with a warning naming the plays they do; retired with none of its workers live,
the warning says so.
"""

from __future__ import annotations

import json
import uuid

from support.cli import UNSERVED_WARNING, operator_env, run_cli, run_cli_async
from support.daemon import Daemons
from support.db import sql, statuses
from support.runtime import SCHEMA
from worker.client.results import PLAY_WARNING_CLAUSE

RELEASE = "Rel-B"  # as deployed: its queue is runs_rel_b


def submit_text(env: dict[str, str], *args: str) -> tuple[str, list[str]]:
    """Run ``submit ARGS``; return the run id it printed and its stderr lines."""
    result = run_cli(env, "submit", *args)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    assert str(uuid.UUID(run_id)) == run_id
    return run_id, result.stderr.splitlines()


async def test_submit_says_when_no_worker_serves_the_lane(database_url: str) -> None:
    env = operator_env(database_url, DEEPLINE_RUNTIME_DEPLOY_VERSION=RELEASE)
    assert run_cli(env, "migrate").returncode == 0

    _, said = submit_text(env, "plain")
    assert said == [
        f"{UNSERVED_WARNING}runs_rel_b (release 'Rel-B'): none registered it, none is live, "
        "and it is not the current deploy; the run waits there until a worker deployed with "
        "DEEPLINE_RUNTIME_DEPLOY_VERSION=Rel-B starts (worker_release_id(suffix, deploy "
        "version) gives the release id a worker serves)."
    ]
    quiet = run_cli(env, "submit", "plain", "--json")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    report = json.loads(quiet.stdout)
    assert (report["queue"], report["created"], report["served"]) == ("runs_rel_b", True, False)
    assert report["warning"] == said[0].removeprefix("lane-worker: warning: ")
    _, said = submit_text(env, "plain", "--queue-suffix", "PR-7")
    assert len(said) == 1
    assert said[0].startswith(f"{UNSERVED_WARNING}runs_pr_7 (release 'dev-pr_7')")
    assert "a worker with DEEPLINE_ABSURD_QUEUE_SUFFIX=pr_7 starts" in said[0]

    async with Daemons(database_url) as pool:
        # No grace for a play nobody registered: the typo below fails at once.
        worker = pool.start(RELEASE, LANE_WORKER_UNKNOWN_PLAY_GRACE="0")
        await worker.ready()
        run_id, said = submit_text(env, "plain", "--input", '{"name": "ada"}')
        assert said == []
        await worker.wait_for("run.completed", run_id=run_id)
        report = json.loads(run_cli(env, "submit", "plain", "--json").stdout)
        assert report["served"] is True
        assert "warning" not in report
        # A play none of the live workers registers (store 0038): accepted, with a warning.
        unknown, said = submit_text(env, "no_such_play")
        assert len(said) == 1
        assert said[0].startswith(
            "lane-worker: warning: no live worker of lane runs_rel_b registers play "
            "'no_such_play' (they register "
        )
        assert "plain" in said[0]
        # What the warning says is what happens: no worker of the lane ever registered
        # the play, so its live worker fails it for good once the grace (here 0) is over.
        assert PLAY_WARNING_CLAUSE in said[0], said[0]
        assert "waits there until" not in said[0], said[0]
        await worker.wait_for("run.failed_for_good", run_id=unknown)
        assert await statuses(database_url, [unknown]) == {unknown: "failed"}
        assert await sql(
            database_url,
            f"select error->>'name' from {SCHEMA}.runs where run_id = $1",
            uuid.UUID(unknown),
        ) == "UnknownPlayError"  # fmt: skip
        report = json.loads(run_cli(env, "submit", "no_such_play", "--json").stdout)
        assert (report["served"], report["playServed"], report["created"]) == (True, False, True)
        assert report["warning"] == said[0].removeprefix("lane-worker: warning: ")
        worker.terminate()
        assert await worker.wait_exit() == 0

    # Stopped, its lane still claims: a worker of it may start again any time.
    assert submit_text(env, "plain")[1] == []
    retired = await run_cli_async(env, "lanes", "retire", RELEASE)
    assert retired.returncode == 0, retired.stderr
    _, said = submit_text(env, "plain")
    assert said == [
        "lane-worker: warning: lane runs_rel_b (release 'Rel-B') is retired and none of its "
        "workers is live: the run waits there until one starts or `lane-worker lanes activate "
        "Rel-B` makes the lane claim again; to run it on the current release, submit it with "
        "that release's id (worker_release_id(suffix, deploy version) gives the release id a "
        "worker serves)."
    ]
