"""`runs retry` and the signals that follow a retry, with a real daemon and the real CLI.

`runs retry` from four processes at once makes one retry; a completed run is
retried only with --completed. A signal follows a run's retry: kept on a failed
run for its retry, and sent to a retried run, delivered to (and waking) the retry.
Apps: ``support.apps.mixed`` (``safety``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from support.apps.mixed import executions
from support.cli import lane_worker, lane_worker_json, one_error_line
from support.daemon import Daemons
from support.db import all_ended, execute, fetch, statuses
from support.runtime import SCHEMA, open_client


def logged_runs(directory: Path) -> list[str]:
    """Return the runs that executed a step at all (a log of their own), sorted."""
    return sorted(path.stem for path in directory.glob("*.log"))


# -- retried once -----------------------------------------------------------------------------


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
        d = pool.start(RETRY, name="D", app="support.apps.mixed:safety")
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
        # As text, a new retry says where it went (stderr), the id alone on stdout.
        text = await lane_worker(database_url, "runs", "retry", again["runId"], "--completed")
        assert text.returncode == 0, text.stderr
        [new_id] = text.stdout.split()
        assert f"as run {new_id} on release {again['releaseId']} (queue " in text.stderr


# -- signals follow the retry -----------------------------------------------------------------


SIGNALLED = "rs3-signal"


@pytest.mark.timeout(120)
async def test_a_signal_follows_the_run_to_its_retry(database_url: str) -> None:
    """A signal to a failed run is kept for its retry; one to a retried run reaches the retry.

    Before the fix the first was ignored (the run had ended) and the retry waited
    for an event that had been sent; the second was ignored too and never woke it.
    """
    async with Daemons(database_url) as pool:
        d = pool.start(SIGNALLED, name="D", app="support.apps.mixed:safety")
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


# -- a signal payload no worker can read ------------------------------------------------------


UNREADABLE = "rs3-unreadable"
DEEP = "[" * 3000 + "]" * 3000
DIGITS = "1" * 5001


@pytest.mark.timeout(180)
async def test_a_retry_refuses_a_signal_it_cannot_read_unless_told_to_drop_it(
    database_url: str,
) -> None:
    """Runs parked for `approved` whose stored payload Python cannot decode (written straight
    to the table, as an older store let in): status, runs, runs fail and cancel work on them;
    `runs retry` refuses in one sentence naming the event and the flag, writing nothing; with
    --drop-unreadable-signals the retry keeps the readable events, waits for `approved`
    again, and a new signal under the old id completes it.

    Before, the retry copied the payload and failed for good on its first attempt.
    """
    async with Daemons(database_url) as pool:
        d = pool.start(UNREADABLE, name="D", app="support.apps.mixed:safety")
        await d.ready()
        env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": UNREADABLE}
        async with open_client(database_url, env) as client:
            deep = (await client.submit("approval", {})).run_id
            digits = (await client.submit("approval", {})).run_id
        for run_id in (deep, digits):
            await d.wait_for("run.parked", run_id=run_id)
        for run_id, text in ((deep, DEEP), (digits, '{"n": ' + DIGITS + "}")):
            await execute(
                database_url,
                f"insert into {SCHEMA}.signals (run_id, event_key, payload)"
                " values ($1::uuid, 'approved', $2::text::jsonb),"
                " ($1::uuid, 'noted', '{\"kept\": true}')",
                run_id,
                text,
            )

        # The operator's views and the two ways to end an open run work on such runs.
        for run_id in (deep, digits):
            shown = await lane_worker(database_url, "status", run_id)
            assert shown.returncode == 0, shown.stderr
            assert (await lane_worker_json(database_url, "status", run_id))["runId"] == run_id
        listed = await lane_worker_json(database_url, "runs")
        assert {deep, digits} <= {r["runId"] for r in listed["runs"]}
        failed = await lane_worker_json(database_url, "runs", "fail", deep, "--reason", "x")
        assert failed == {"runId": deep, "failed": True}
        cancelled = await lane_worker(database_url, "cancel", digits)
        assert cancelled.returncode == 0, cancelled.stderr
        await all_ended(database_url, [deep, digits])
        assert await statuses(database_url, [deep, digits]) == {
            deep: "failed",
            digits: "cancelled",
        }

        # A retry is refused in one sentence, and writes nothing.
        runs_before = await fetch(database_url, f"select run_id from {SCHEMA}.runs")
        for run_id, why in ((deep, "nested too deeply"), (digits, "more than 4300 digits")):
            refused = await lane_worker(database_url, "runs", "retry", run_id)
            assert refused.returncode == 1, (refused.stdout, refused.stderr)
            line = one_error_line(refused)
            assert f"run {run_id} cannot be retried" in line
            assert "the payload of its event 'approved' cannot be read back" in line
            assert why in line
            assert "--drop-unreadable-signals" in line
        assert await fetch(database_url, f"select run_id from {SCHEMA}.runs") == runs_before
        retried_by = await fetch(
            database_url,
            f"select retried_by from {SCHEMA}.runs where run_id = any($1::uuid[])",
            [deep, digits],
        )
        assert [r["retried_by"] for r in retried_by] == [None, None]

        # Told to, the retry leaves the unreadable event out and keeps the other.
        retry = await lane_worker_json(
            database_url, "runs", "retry", deep, "--drop-unreadable-signals"
        )
        assert (retry["retryOf"], retry["created"], retry["droppedSignals"]) == (
            deep,
            True,
            ["approved"],
        ), retry
        copied = await fetch(
            database_url,
            f"select event_key, payload from {SCHEMA}.signals where run_id = $1::uuid",
            retry["runId"],
        )
        assert [(r["event_key"], r["payload"]) for r in copied] == [("noted", {"kept": True})]
        await d.wait_for("run.parked", run_id=retry["runId"])
        sent = await lane_worker_json(
            database_url, "signal", deep, "approved", "--data", '{"ok": true, "n": 3}'
        )
        assert sent["deliveredTo"] == retry["runId"], sent
        await d.wait_for("run.completed", run_id=retry["runId"])
        done = await lane_worker_json(database_url, "status", retry["runId"])
        assert done["output"] == {"ok": True, "n": 3, "timed_out": False, "run": retry["runId"]}
