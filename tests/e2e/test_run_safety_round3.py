"""Run safety, round 3, against real daemons, the real CLI and the store's tables.

- A lane served by machines of one release with different apps: a machine whose
  app lacks a play leaves its runs to the machine that has it, even runs moved
  onto the lane by `lanes move`; a play no machine of the lane ever registered
  still fails visibly (UnknownPlayError).
- A SIGKILLed worker's attempt is closed (lease_lost): by the attempt that takes
  the run over, or, after a cancel, by a live daemon's maintenance pass once the
  dead worker's heartbeat is old.
- `runs retry` from four processes at once makes one retry; a completed run is
  retried only with --completed.
- A signal follows a run's retry: kept on a failed run for its retry, and sent
  to a retried run, delivered to (and waking) the retry.

Apps: `mixed_apps.py` beside this file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from daemon import REPO, Daemon, Daemons, queue_of
from runtime_harness import SCHEMA, connect, eventually, open_client

from worker import lanes

TERMINAL = ("completed", "failed", "cancelled")


# -- helpers -------------------------------------------------------------------------------------


async def lane_worker(
    database_url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m worker ARGS`` as an operator does (the database, nothing else)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env={
            "PATH": os.environ.get("PATH", ""),
            "WORKFLOW_RUNTIME_POSTGRES": database_url,
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def lane_worker_json(database_url: str, *args: str, exit_code: int = 0) -> Any:
    """Run ``lane-worker ARGS --json``, expecting ``exit_code``; return its JSON object."""
    done = await lane_worker(database_url, *args, "--json")
    assert done.returncode == exit_code, (args, done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


async def fetch(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on a connection of its own."""
    conn = await connect(database_url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def attempts_of(database_url: str, run_id: str) -> list[asyncpg.Record]:
    """Return the store's attempt rows of a run, oldest first."""
    return await fetch(
        database_url,
        f"select attempt_id, worker_id, release_id, disposition, outcome, error, finished_at"
        f" from {SCHEMA}.attempts where run_id = $1 order by attempt_id",
        run_id,
    )


async def statuses(database_url: str, run_ids: list[str]) -> dict[str, str]:
    """Return the store status of each run."""
    rows = await fetch(
        database_url,
        f"select run_id::text, status from {SCHEMA}.runs where run_id = any($1::uuid[])",
        run_ids,
    )
    return {row["run_id"]: row["status"] for row in rows}


async def all_ended(database_url: str, run_ids: list[str], *, timeout_s: float = 60) -> None:
    """Wait until every run is in a terminal status."""

    async def ended() -> bool:
        found = await statuses(database_url, run_ids)
        return len(found) == len(run_ids) and all(s in TERMINAL for s in found.values())

    await eventually(ended, timeout_s=timeout_s, what=f"{len(run_ids)} runs to end")


def executions(directory: Path, run_id: str) -> int:
    """Return how many times a step of run ``run_id`` executed (mixed_apps.record)."""
    path = directory / f"{run_id}.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def logged_runs(directory: Path) -> list[str]:
    """Return the runs that executed a step at all (a log of their own), sorted."""
    return sorted(path.stem for path in directory.glob("*.log"))


# -- A: mixed apps within one release ------------------------------------------------------------

MIXED, OLD = "rs3-mixed", "rs3-old"


@pytest.mark.timeout(150)
async def test_mixed_apps_of_one_release_run_each_play_on_the_machine_that_has_it(
    database_url: str,
) -> None:
    """M1's app lacks `only-full`; M2's has it. Every such run completes on M2, none fails.

    Before the fix, M1's own loop claimed runs of `only-full` and failed them for
    good with UnknownPlayError. Runs moved onto the lane from a retired lane go
    the same way. A play that no machine of the lane ever registered still fails
    visibly.
    """
    mixed_id = lanes.current_release_id({"DEEPLINE_RUNTIME_DEPLOY_VERSION": MIXED})
    mixed_q, old_q = queue_of(MIXED), queue_of(OLD)
    # Fresh runs on an old lane that no machine will serve: `lanes move` brings them over.
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": OLD}) as old_client:
        stranded = [
            (await old_client.submit("only-full", {"n": f"old-{i}", "seconds": 0.2})).run_id
            for i in range(6)
        ]
    async with Daemons(database_url) as pool:
        # M1 takes up to 8 runs at once; M2 only 2, so M1 is offered most of them.
        m1 = pool.start(MIXED, name="M1", app="mixed_apps:lean")
        m2 = pool.start(MIXED, name="M2", app="mixed_apps:full", LANE_WORKER_CONCURRENCY="2")
        await m1.ready()
        await m2.ready()
        m1_id, m2_id = m1.worker_id, m2.worker_id
        workers = {
            row["worker_id"]: sorted(row["plays"])
            for row in await fetch(
                database_url,
                f"select worker_id, plays from {SCHEMA}.workers"
                " where queue = $1 and stopped_at is null",
                mixed_q,
            )
        }
        assert workers == {m1_id: ["common"], m2_id: ["common", "only-full"]}, workers

        retired = await lane_worker_json(database_url, "lanes", "retire", OLD)
        assert (retired["queue"], retired["status"]) == (old_q, "retired"), retired
        moved = await lane_worker_json(database_url, "lanes", "move", OLD, "--to", MIXED)
        assert sorted(moved["moved"]) == sorted(stranded), moved
        assert moved["refused"] == [], moved

        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": MIXED}) as client:
            direct = [
                (await client.submit("only-full", {"n": i, "seconds": 0.2})).run_id
                for i in range(20)
            ]
            commons = [(await client.submit("common", {"n": i})).run_id for i in range(4)]
            unknown = (await client.submit("never-registered", {"n": 0})).run_id
        runs = [*stranded, *direct]

        await all_ended(database_url, [*runs, *commons, unknown], timeout_s=60)
        found = await statuses(database_url, runs)
        not_completed = {r: s for r, s in found.items() if s != "completed"}
        assert not_completed == {}, (
            f"{len(not_completed)} of {len(runs)} runs of only-full did not complete: "
            f"{not_completed}\n{await unknown_play_failures(database_url)}"
        )
        assert set((await statuses(database_url, commons)).values()) == {"completed"}

        # No attempt anywhere failed for a play the lane has; every one that took a
        # run of only-full over (own or adopt) ran on M2.
        failures = await unknown_play_failures(database_url)
        assert [f["run_id"] for f in failures] == [unknown], failures
        every = await fetch(
            database_url,
            f"select a.run_id::text, a.worker_id, a.disposition, a.outcome"
            f"  from {SCHEMA}.attempts a join {SCHEMA}.runs r using (run_id)"
            "  where r.play = 'only-full' order by a.attempt_id",
        )
        executed = [a for a in every if a["disposition"] in ("own", "adopt")]
        elsewhere = [dict(a) for a in executed if not a["worker_id"].startswith(m2_id)]
        assert elsewhere == [], elsewhere
        assert {a["run_id"] for a in executed} == set(runs)
        assert {a["outcome"] for a in executed} == {"completed"}, [dict(a) for a in executed]
        # M1 was offered such runs (else this test proved nothing) and left each to M2.
        by_m1 = [
            (a["disposition"], a["outcome"]) for a in every if a["worker_id"].startswith(m1_id)
        ]
        assert by_m1, "M1 never claimed a run of only-full: the mixed lane was not exercised"
        assert set(by_m1) == {("defer", "deferred")}, by_m1
        # `status` counts the attempts that ran the play, not M1's put-backs.
        deferred_run = next(a["run_id"] for a in every if a["worker_id"].startswith(m1_id))
        ran = sum(1 for a in executed if a["run_id"] == deferred_run)
        shown = await lane_worker(database_url, "status", deferred_run)
        [line] = [x for x in shown.stdout.splitlines() if x.startswith("attempts")]
        assert line.split()[1] == str(ran), line
        assert "put back without an attempt" in line, line
        moved_rows = await fetch(
            database_url,
            f"select distinct queue, release_id from {SCHEMA}.runs where run_id = any($1::uuid[])",
            stranded,
        )
        assert [tuple(r) for r in moved_rows] == [(mixed_q, mixed_id)]

        # The play nobody registered fails visibly, once, for good.
        async with open_client(database_url, {}) as client:
            gone = await client.status(unknown)
        assert gone.status == "failed"
        assert gone.error["name"] == "UnknownPlayError", gone.error
        assert "never-registered" in gone.error["message"], gone.error
        assert [(a.disposition, a.outcome) for a in gone.attempts][-1] == ("own", "failed")
        for daemon in (m1, m2):
            assert daemon.malformed_lines() == [], daemon.name


async def unknown_play_failures(database_url: str) -> list[dict[str, Any]]:
    """Return the attempts that failed with UnknownPlayError (run, play, worker)."""
    rows = await fetch(
        database_url,
        f"select a.run_id::text, r.play, a.worker_id from {SCHEMA}.attempts a"
        f"  join {SCHEMA}.runs r using (run_id)"
        " where a.outcome = 'failed' and a.error::text like '%UnknownPlayError%'"
        " order by a.attempt_id",
    )
    return [dict(r) for r in rows]


# -- B: a SIGKILLed worker's attempt is closed ---------------------------------------------------

KILLED = "rs3-kill"
SHORT_LEASE = {"LANE_WORKER_CLAIM_TIMEOUT": "5"}


async def start_mid_step(pool: Daemons, database_url: str, tmp_path: Path) -> tuple[Daemon, str]:
    """Start K (5 s lease) and a run whose step `two` holds 60 s there; return both mid-step."""
    k = pool.start(KILLED, name="K", **SHORT_LEASE)
    await k.ready()
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": KILLED}) as client:
        # apps:slow: step `two` sleeps 60 s on its first execution, 0 s on a re-run.
        run_id = (
            await client.submit("slow", {"dir": str(tmp_path), "seconds": 60, "rerun_seconds": 0})
        ).run_id
    await k.wait_for("run.started", run_id=run_id)

    async def in_step_two() -> bool:
        return (tmp_path / "two.log").exists()

    await eventually(in_step_two, what="K executing step two")
    return k, run_id


async def open_attempts(database_url: str, run_id: str) -> list[dict[str, Any]]:
    """Return a run's attempts that recorded no end."""
    return [
        dict(a)
        for a in await attempts_of(database_url, run_id)
        if a["outcome"] is None or a["finished_at"] is None
    ]


@pytest.mark.timeout(120)
async def test_a_sigkilled_workers_attempt_is_closed_when_the_run_is_taken_over(
    database_url: str, tmp_path: Path
) -> None:
    """K dies mid-step; K2 takes the run over after the lease: K's attempt ends lease_lost.

    Before the fix K's attempt stayed open (no outcome, no finished_at) for good.
    """
    async with Daemons(database_url) as pool:
        k, run_id = await start_mid_step(pool, database_url, tmp_path)
        k.kill()
        assert await k.wait_exit(timeout_s=15) == -9
        k2 = pool.start(KILLED, name="K2", **SHORT_LEASE)
        await k2.ready()
        await k2.wait_for("run.completed", run_id=run_id, timeout_s=45)

        assert await open_attempts(database_url, run_id) == []
        rows = await attempts_of(database_url, run_id)
        by_k = [r for r in rows if r["worker_id"].startswith(k.worker_id)]
        assert [(r["disposition"], r["outcome"]) for r in by_k] == [("own", "lease_lost")], [
            dict(r) for r in rows
        ]
        assert rows[-1]["worker_id"].startswith(k2.worker_id)
        assert (rows[-1]["disposition"], rows[-1]["outcome"]) == ("own", "completed")
        status = await lane_worker_json(database_url, "status", run_id)
        assert status["status"] == "completed"
        assert [a for a in status["attempts"] if a["outcome"] is None] == [], status["attempts"]
        assert (tmp_path / "two.log").read_text().count("\n") == 2  # K's, then K2's re-run


@pytest.mark.timeout(120)
async def test_a_sigkilled_workers_attempt_is_closed_by_maintenance_after_a_cancel(
    database_url: str, tmp_path: Path
) -> None:
    """K dies mid-step and the run is cancelled; once K's heartbeat is old, maintenance closes it.

    The cancel leaves K's attempt open while K's heartbeat is younger than 60 s (K
    might still be executing the step); the maintenance pass of a daemon booted
    after that closes it as lease_lost. Before the fix it stayed open for good.
    """
    async with Daemons(database_url) as pool:
        k, run_id = await start_mid_step(pool, database_url, tmp_path)
        k.kill()
        assert await k.wait_exit(timeout_s=15) == -9
        cancelled = await lane_worker_json(database_url, "cancel", run_id)
        assert cancelled["cancelled"] is True, cancelled
        # K's heartbeat is young: it could still be executing the step, so it stays open.
        assert [a["worker_id"] for a in await open_attempts(database_url, run_id)] == [k.worker_id]

        conn = await connect(database_url)
        try:
            aged = await conn.execute(
                f"update {SCHEMA}.workers set heartbeat_at = now() - interval '2 minutes'"
                " where worker_id = $1",
                k.worker_id,
            )
        finally:
            await conn.close()
        assert aged == "UPDATE 1", aged
        k3 = pool.start(KILLED, name="K3", **SHORT_LEASE)
        await k3.ready()  # its first maintenance pass starts as it serves

        async def closed() -> bool:
            return not await open_attempts(database_url, run_id)

        await eventually(closed, timeout_s=20, what="K's attempt to be closed by maintenance")
        rows = await attempts_of(database_url, run_id)
        assert [(r["worker_id"], r["disposition"], r["outcome"]) for r in rows] == [
            (k.worker_id, "own", "lease_lost")
        ], [dict(r) for r in rows]
        status = await lane_worker_json(database_url, "status", run_id)
        assert status["status"] == "cancelled"
        assert [a["outcome"] for a in status["attempts"]] == ["lease_lost"]


# -- C: retried once -----------------------------------------------------------------------------

RETRY = "rs3-retry"


@pytest.mark.timeout(120)
async def test_runs_retry_from_four_processes_at_once_makes_one_retry(
    database_url: str, tmp_path: Path
) -> None:
    """Four concurrent `runs retry` of one failed run: one retry, run once; all name it.

    Before the fix each process created a retry of its own (four runs, the work
    executed four times), and a completed run was retried without --completed.
    """
    client_env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RETRY, "LANE_WORKER_MAX_ATTEMPTS": "1"}
    async with Daemons(database_url) as pool:
        d = pool.start(RETRY, name="D", app="mixed_apps:safety")
        await d.ready()
        async with open_client(database_url, client_env) as client:
            failed = (await client.submit("counted", {"dir": str(tmp_path)})).run_id
            await all_ended(database_url, [failed])
            assert (await client.status(failed)).status == "failed"
        assert executions(tmp_path, failed) == 1
        (tmp_path / "pass").touch()  # the retry's step succeeds

        outs = await asyncio.gather(
            *(lane_worker(database_url, "runs", "retry", failed, "--json") for _ in range(4))
        )
        for out in outs:
            assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
        reports = [json.loads(out.stdout) for out in outs]
        retry_ids = {r["runId"] for r in reports}
        assert len(retry_ids) == 1, reports
        assert sorted(r.get("created") for r in reports) == [False, False, False, True], reports
        assert {r["retryOf"] for r in reports} == {failed}
        (retry_id,) = retry_ids
        rows = await fetch(
            database_url, f"select run_id::text from {SCHEMA}.runs where retry_of = $1", failed
        )
        assert [r["run_id"] for r in rows] == [retry_id]

        await d.wait_for("run.completed", run_id=retry_id)
        assert executions(tmp_path, retry_id) == 1
        # Nothing else ran: one log per run executed (the failed run and its retry).
        assert logged_runs(tmp_path) == sorted([failed, retry_id])
        assert executions(tmp_path, failed) == 1

        # -- a completed run is retried only when asked for with --completed ------------------
        refused = await lane_worker(database_url, "runs", "retry", retry_id)
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert "--completed" in refused.stderr, refused.stderr
        assert refused.stdout == ""
        again = await lane_worker_json(database_url, "runs", "retry", retry_id, "--completed")
        assert (again["retryOf"], again["created"]) == (retry_id, True), again
        await d.wait_for("run.completed", run_id=again["runId"])
        assert executions(tmp_path, again["runId"]) == 1
        total = await fetch(database_url, f"select count(*) as n from {SCHEMA}.runs")
        assert total[0]["n"] == 3  # the failed run, its retry, the retry of that
        # Asked for the first run again: the chain's latest retry is named, nothing made.
        latest = await lane_worker(database_url, "runs", "retry", failed)
        assert latest.returncode == 0, (latest.stdout, latest.stderr)
        assert latest.stdout.strip() == again["runId"]
        assert f"its latest retry is run {again['runId']}" in latest.stderr, latest.stderr
        assert f"To run it again, retry {again['runId']}." in latest.stderr, latest.stderr
        total = await fetch(database_url, f"select count(*) as n from {SCHEMA}.runs")
        assert total[0]["n"] == 3


# -- D: signals follow the retry -----------------------------------------------------------------

SIGNALLED = "rs3-signal"


@pytest.mark.timeout(120)
async def test_a_signal_follows_the_run_to_its_retry(database_url: str) -> None:
    """A signal to a failed run is kept for its retry; one to a retried run reaches the retry.

    Before the fix the first was ignored (the run had ended) and the retry waited
    for an event that had been sent; the second was ignored too and never woke it.
    """
    async with Daemons(database_url) as pool:
        d = pool.start(SIGNALLED, name="D", app="mixed_apps:safety")
        await d.ready()
        env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": SIGNALLED}
        async with open_client(database_url, env) as client:
            first = (await client.submit("approval", {})).run_id
            second = (await client.submit("approval", {})).run_id
        for run_id in (first, second):
            await d.wait_for("run.parked", run_id=run_id)
            ended = await lane_worker_json(database_url, "runs", "fail", run_id, "--reason", "x")
            assert ended == {"runId": run_id, "failed": True}

        # -- signalled after the failure, retried after the signal -------------------------------
        kept = await lane_worker_json(
            database_url, "signal", first, "approved", "--data", '{"ok": true, "n": 1}'
        )
        assert kept["keptForRetry"] is True, kept
        assert (kept["runEnded"], kept["deliveredTo"]) == ("failed", first), kept
        retry = await lane_worker_json(database_url, "runs", "retry", first)
        await d.wait_for("run.completed", run_id=retry["runId"])
        done = await lane_worker_json(database_url, "status", retry["runId"])
        assert (done["status"], done["retryOf"]) == ("completed", first), done
        assert done["output"] == {"ok": True, "n": 1, "timed_out": False, "run": retry["runId"]}

        # -- retried first, then signalled under the old run's id -------------------------------
        retry2 = (await lane_worker_json(database_url, "runs", "retry", second))["runId"]
        await d.wait_for("run.parked", run_id=retry2)
        sent = await lane_worker_json(
            database_url, "signal", second, "approved", "--data", '{"ok": true, "n": 2}'
        )
        assert sent["deliveredTo"] == retry2, sent
        assert (sent["duplicate"], sent["runEnded"], sent["keptForRetry"]) == (
            False,
            None,
            False,
        ), sent
        await d.wait_for("run.completed", run_id=retry2)
        done2 = await lane_worker_json(database_url, "status", retry2)
        assert done2["output"] == {"ok": True, "n": 2, "timed_out": False, "run": retry2}
        # The failed runs stay failed.
        assert set((await statuses(database_url, [first, second])).values()) == {"failed"}
