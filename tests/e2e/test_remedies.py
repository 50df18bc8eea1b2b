"""Deploy day gone wrong, repaired with the remedies, against real daemons and the real CLI.

Release A's machine is stopped (SIGKILL) before its lane drained, holding a fresh
run, a retrying run and a run in flight. The drain report names each stranded
run with a remedy, and the operator applies them through `lane-worker`: `lanes
move` for the fresh run, `runs fail` + `runs retry` for one that started, a new
A machine for the other; then `lanes wait` and `lanes prune`. The daemons run
``support.apps.drain:app``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.cli import lane_worker, lane_worker_json
from support.daemon import Daemon, Daemons, queue_of
from support.db import backdate_heartbeats
from support.runtime import connect, eventually, open_client

A, B = "rm-a", "rm-b"  # as deployed (launch stamps)
# How the workers name their release: as deployed (issue 31 §1), not rel_a.
A_ID = A
B_ID = B
QA, QB = queue_of(A), queue_of(B)
APP = "support.apps.drain:app"
CLIENT_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "20"}


# -- the operator's commands ------------------------------------------------------------------


async def run_status(database_url: str, run_id: str) -> dict[str, Any]:
    """Return `lane-worker status RUN_ID --json`."""
    status: dict[str, Any] = await lane_worker_json(database_url, "status", run_id)
    return status


async def listed(database_url: str, *filters: str) -> list[str]:
    """Return the run ids `lane-worker runs FILTERS --json` lists, in its order."""
    runs = await lane_worker_json(database_url, "runs", *filters)
    return [run["runId"] for run in runs["runs"]]


def attempts(status: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """Return a status's attempts as (release, disposition, outcome)."""
    return [(a["releaseId"], a["disposition"], a["outcome"]) for a in status["claims"]]


def steps(status: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Return a status's steps as (name, release that committed it)."""
    return [(s["name"], s["releaseId"]) for s in status["steps"]]


async def engine_queues(database_url: str) -> list[str]:
    """Return the engine's queues."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("select queue_name from absurd.queues order by 1")
    finally:
        await conn.close()
    return [row["queue_name"] for row in rows]


def blockers(lane: dict[str, Any]) -> dict[str, tuple[int, list[str], str]]:
    """Return a lane's blockers by reason: (count, run ids, remedy)."""
    return {b["reason"]: (b["count"], b["runIds"], b["remedy"]) for b in lane["blockedBy"]}


async def stage_stranded_a(
    pool: Daemons, database_url: str, tmp_path: Path
) -> tuple[Daemon, Daemon, dict[str, str]]:
    """Start A (one slot), then B; leave A a retrying run, a run in flight and a fresh run.

    A's only slot is held by the in-flight run, so the retry and the fresh run
    stay A's to run for as long as the test wants.
    """
    a = pool.start(A, name="A", app=APP, LANE_WORKER_CONCURRENCY="1")
    await a.ready()  # A's lane registers first: B is the newer release
    b = pool.start(B, name="B", app=APP)
    await b.ready()
    async with open_client(database_url, CLIENT_ENV) as client:
        flaky = await client.submit("fail-until", {"pass": str(tmp_path / "pass")})
        await a.wait_for("run.attempt_failed", run_id=flaky.run_id)
        held = await client.submit("gated", {"gate": str(tmp_path / "gate")})
        await a.wait_for("run.started", run_id=held.run_id)  # A's only slot is taken now

        async def flaky_retrying() -> bool:
            return (await client.status(flaky.run_id)).status == "retrying"

        await eventually(flaky_retrying, what="the flaky run waiting for its retry")
        fresh = await client.submit("plain", {"n": 1})
    return a, b, {"flaky": flaky.run_id, "held": held.run_id, "fresh": fresh.run_id}


@pytest.mark.timeout(180)
async def test_a_machine_stopped_before_drained_is_repaired_with_every_remedy(
    database_url: str, tmp_path: Path
) -> None:
    """The report names each stranded run with a remedy, and each remedy works on it."""
    async with Daemons(database_url) as pool:
        a, b, runs = await stage_stranded_a(pool, database_url, tmp_path)
        flaky, held, fresh = runs["flaky"], runs["held"], runs["fresh"]

        retired = await lane_worker_json(database_url, "lanes", "retire", A)
        assert (retired["queue"], retired["status"]) == (QA, "retired")
        await a.wait_for("lane.draining")
        a.kill()  # stopped before drained
        assert await a.wait_exit(timeout_s=15) == -9
        # A minute later, without waiting it out.
        assert await backdate_heartbeats(database_url, QA) == "UPDATE 1"

        # -- the report names each stranded run, with a remedy ---------------------------------
        shown = await lane_worker_json(database_url, "lanes", "show", A)
        assert (shown["status"], shown["safeToStop"], shown["liveWorkers"]) == (
            "draining",
            False,
            0,
        )
        found = blockers(shown)
        assert {reason: ids for reason, (_, ids, _) in found.items()} == {
            "inFlight": [held],
            "fresh": [fresh],
            "retrying": [flaky],
        }
        for reason, (count, _, remedy) in found.items():
            assert count == 1, reason
            assert remedy.startswith(f"no live worker of {A_ID}: start one"), remedy
        assert f"lane-worker lanes move {A_ID} --to" in found["fresh"][2]
        for reason in ("inFlight", "retrying"):
            assert "lane-worker runs fail RUN_ID" in found[reason][2], found[reason]
            assert "lane-worker runs retry RUN_ID" in found[reason][2], found[reason]
        text = await lane_worker(database_url, "lanes", "show", A)
        assert text.returncode == 0, text.stderr
        for run_id in (flaky, held, fresh):
            assert run_id in text.stdout

        # -- lanes move: the fresh run goes to B, the started ones are refused ------------------
        moved = await lane_worker_json(database_url, "lanes", "move", A, "--to", B, exit_code=1)
        assert (moved["from"], moved["to"], moved["toReleaseId"]) == (QA, QB, B_ID)
        assert moved["moved"] == [fresh]
        assert [r["runId"] for r in moved["refused"]] == [flaky, held]  # oldest first
        for refusal, status in zip(moved["refused"], ("retrying", "running"), strict=True):
            assert f"it started on {A} ({status}, 1 attempt(s))" in refusal["reason"], refusal
            assert "runs fail" in refusal["reason"], refusal
            assert "runs retry" in refusal["reason"], refusal
        await b.wait_for("run.completed", run_id=fresh)
        done = await run_status(database_url, fresh)
        assert (done["status"], done["releaseId"], done["queue"]) == ("completed", B_ID, QB)
        assert done["output"] == {"release": B_ID}
        assert attempts(done) == [(B_ID, "own", "completed")]
        assert steps(done) == [("step:echo", B_ID)]
        # Asked again, nothing is left to move; the refusals are said in text and exit 1.
        again = await lane_worker(database_url, "lanes", "move", A, "--to", B)
        assert again.returncode == 1, (again.stdout, again.stderr)
        assert again.stdout.splitlines()[0] == f"moved 0 run(s) from {QA} to {QB} (release {B_ID})."
        assert [line.split(":")[0] for line in again.stdout.splitlines()[1:]] == [
            f"refused {flaky}",
            f"refused {held}",
        ]
        assert again.stderr.strip() == (
            f"lane-worker: 2 run(s) of {QA} were not moved (listed above, each with the reason)."
        )

        # -- runs fail + runs retry: the run in flight on the dead machine ---------------------
        still_open = await lane_worker(database_url, "runs", "retry", held)
        assert still_open.returncode == 1, (still_open.stdout, still_open.stderr)
        assert f"lane-worker runs fail {held}" in still_open.stderr
        failed = await lane_worker_json(
            database_url, "runs", "fail", held, "--reason", "A's machine died mid-step"
        )
        assert failed == {"runId": held, "failed": True}
        ended = await run_status(database_url, held)
        assert ended["status"] == "failed"
        assert ended["error"] == {
            "name": "FailedByOperator",
            "message": "A's machine died mid-step",
            "fatal": True,
        }
        assert [(r, d) for r, d, _ in attempts(ended)] == [(A_ID, "own")]  # the dead machine's
        # Nothing is open on A but the retrying run: not prunable yet.
        assert await lane_worker_json(database_url, "lanes", "prune", "--older-than", "0s") == {
            "dryRun": False,
            "queues": [],
            "keptLive": [],
            "keptBusy": [],
            "keptForeign": [],
            "keptNotOurs": [],
        }
        (tmp_path / "gate").touch()  # the retry's step can finish
        retry = await lane_worker_json(database_url, "runs", "retry", held)
        retry_id = retry["runId"]
        assert retry == {
            "runId": retry_id,
            "releaseId": B_ID,
            "queue": QB,
            "retryOf": held,
            "created": True,
            "status": "queued",
            "droppedSignals": [],
        }
        await b.wait_for("run.completed", run_id=retry_id)
        redone = await run_status(database_url, retry_id)
        assert (redone["status"], redone["retryOf"], redone["play"]) == (
            "completed",
            held,
            "gated",
        )
        assert (redone["releaseId"], redone["output"]) == (B_ID, {"release": B_ID})
        assert attempts(redone) == [(B_ID, "own", "completed")]
        assert steps(redone) == [("step:held", B_ID)]

        # -- a new A machine finishes the retrying run -----------------------------------------
        (tmp_path / "pass").touch()
        a2 = pool.start(A, name="A2", app=APP)
        await a2.ready()  # a draining lane's worker may boot
        await a2.wait_for("run.completed", run_id=flaky, timeout_s=30)
        finished = await run_status(database_url, flaky)
        assert (finished["status"], finished["output"]) == ("completed", {"release": A_ID})
        assert attempts(finished) == [(A_ID, "own", "retrying"), (A_ID, "own", "completed")]
        assert steps(finished) == [("step:try", A_ID)]
        waited = await lane_worker(database_url, "lanes", "wait", A, "--timeout", "30")
        assert waited.returncode == 0, (waited.stdout, waited.stderr)
        assert "is drained: safe to stop its machines" in waited.stdout

        # -- the runs, as `lane-worker runs` lists them -----------------------------------------
        assert await listed(database_url) == [retry_id, fresh, held, flaky]
        assert await listed(database_url, "--limit", "1") == [retry_id]
        assert await listed(database_url, "--lane", A) == [held, flaky]
        assert await listed(database_url, "--lane", B) == [retry_id, fresh]
        assert await listed(database_url, "--status", "failed") == [held]
        assert await listed(database_url, "--play", "gated") == [retry_id, held]
        assert await listed(database_url, "--status", "completed", "--lane", B) == [
            retry_id,
            fresh,
        ]
        by_id = {r["runId"]: r for r in (await lane_worker_json(database_url, "runs"))["runs"]}
        assert by_id[retry_id]["retryOf"] == held
        assert (by_id[fresh]["releaseId"], by_id[fresh]["queue"]) == (B_ID, QB)
        table = await lane_worker(database_url, "runs")
        assert table.returncode == 0, table.stderr
        assert table.stdout.split()[:7] == [
            "RUN", "PLAY", "STATUS", "RELEASE", "QUEUE", "ATTEMPTS", "CREATED",
        ]  # fmt: skip
        assert len(table.stdout.splitlines()) == 5

        # -- stop A's machine, prune its queue -------------------------------------------------
        a2.terminate()
        assert await a2.wait_exit(timeout_s=30) == 0
        dry = await lane_worker_json(
            database_url, "lanes", "prune", "--older-than", "0s", "--dry-run"
        )
        assert dry == {
            "dryRun": True,
            "queues": [QA],
            "keptLive": [],
            "keptBusy": [],
            "keptForeign": [],
            "keptNotOurs": [],
        }
        assert QA in await engine_queues(database_url)
        pruned = await lane_worker_json(database_url, "lanes", "prune", "--older-than", "0s")
        assert pruned == {
            "dryRun": False,
            "queues": [QA],
            "keptLive": [],
            "keptBusy": [],
            "keptForeign": [],
            "keptNotOurs": [],
        }
        assert await engine_queues(database_url) == [QB]
        report = await lane_worker_json(database_url, "lanes")
        assert [lane["queue"] for lane in report["lanes"]] == [QB]
        # History stays: the runs and their status.
        assert await listed(database_url, "--lane", A) == [held, flaky]
        assert (await run_status(database_url, flaky))["status"] == "completed"
        assert (await run_status(database_url, held))["status"] == "failed"

        # B goes on serving after A's queue went.
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": B}) as client_b:
            after = await client_b.submit("plain", {"n": 2})
            await b.wait_for("run.completed", run_id=after.run_id)
        b.terminate()
        assert await b.wait_exit(timeout_s=30) == 0
        for daemon in (a, a2, b):
            assert daemon.malformed_lines() == [], daemon.name
        assert not b.events("loop.claim_failed"), b.events("loop.claim_failed")
        assert not b.events("maintenance.queue_failed")
