"""Deploy day with two real daemons, judged by the drain report and `lanes wait`.

Release A's daemon runs with one slot (LANE_WORKER_CONCURRENCY=1), so a run held
mid-step keeps every later run of A fresh and its retry pending for as long as the
test wants: the report's counts are then exactly what the test put there. The
report is read the operator's two ways, `lane-worker lanes --json` and a daemon's
/lanes, which must agree. The daemons run ``support.apps.drain:app``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from support import REPO
from support.apps import drain
from support.cli import cli_argv, cli_env, lane_worker, lane_worker_json, operator_env
from support.daemon import Daemon, Daemons, queue_of
from support.db import LIVENESS_S, wake_nap
from support.page import assert_page_matches
from support.report import AGES, blockers, claiming_blockers, counts, expected
from support.runtime import SCHEMA, connect, eventually, open_client
from worker.daemon.report_cache import REPORT_FRESH_S
from worker.version import VERSION

A, B = "lw-a", "lw-b"  # as deployed (launch stamps)
# How the workers name their release: as deployed (issue 31 §1), not rel_a.
A_ID = A
B_ID = B
QA, QB = queue_of(A), queue_of(B)
APP = "support.apps.drain:app"
# Many attempts: the run that fails until told otherwise stays in retry backoff.
CLIENT_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "20"}
# An hour: the nap stays parked until A is drained and the reports that check it agree,
# however slow the machine (15 s, then 40 s, were naps raced against the test: on a
# loaded CI machine B adopted it before the report was read). The test then makes it
# due itself (support.db.wake_nap) for B to adopt.
NAP_S = 3600.0


# -- the operator's views --------------------------------------------------------------------


async def http_lanes(daemon: Daemon, *, text: bool = False) -> Any:
    """Return a daemon's /lanes page: JSON, or with ``text`` the table (`?format=text`)."""
    timeout = aiohttp.ClientTimeout(total=10)
    url = f"http://127.0.0.1:{daemon.health_port}/lanes" + ("?format=text" if text else "")
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.text() if text else await response.json()


def without_ages(report: Any) -> Any:
    """Return a report without its ages, which move with the moment it was read."""
    stripped = copy.deepcopy(report)
    for lane in stripped.get("lanes", [stripped]):
        for age in AGES:
            value = lane["counts"].pop(age)
            assert value is None or value >= 0, (age, value)
        assert lane.pop("asOf")  # when it was read
        lane.pop("lastSeen")  # the lane's latest heartbeat, which live workers keep moving
        draining_s = lane.pop("drainingSeconds")  # since `lanes retire`, while draining
        assert draining_s >= 0 if lane["status"] == "draining" else draining_s == 0, lane
    return stripped


async def report(database_url: str, *daemons: Daemon) -> dict[str, dict[str, Any]]:
    """Read `lanes --json` and each daemon's /lanes and page, check that they agree; by queue.

    Each is its own read, so a run that moves between them (a sleeper waking on a loaded
    machine) makes them differ for a moment: they are read again, together, until they
    agree, and the last disagreement is raised if they never do.
    """
    deadline = time.monotonic() + REPORT_FRESH_S + 30
    while True:
        printed = await lane_worker_json(database_url, "lanes")
        try:
            await _agrees(printed, daemons)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        return {lane["queue"]: lane for lane in printed["lanes"]}


async def _agrees(printed: dict[str, Any], daemons: tuple[Daemon, ...]) -> None:
    for daemon in daemons:
        # A daemon serves one shared read for up to REPORT_FRESH_S: a newer one follows.
        deadline = time.monotonic() + REPORT_FRESH_S + 5
        while True:
            served = await http_lanes(daemon)
            if without_ages(served) == without_ages(printed) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert without_ages(served) == without_ages(printed), f"/lanes of {daemon.name}"
    if daemons:  # and the lanes page, as headless Chromium renders it
        await asyncio.to_thread(assert_page_matches, daemons[0].health_port, printed["lanes"])


async def served_agrees(daemon: Daemon, queue: str, shown: dict[str, Any]) -> None:
    """``daemon``'s /lanes shows lane ``queue`` as ``shown``, once its shared read is fresh."""
    deadline = time.monotonic() + REPORT_FRESH_S + 5
    while True:
        served = {lane["queue"]: lane for lane in (await http_lanes(daemon))["lanes"]}
        if without_ages(served[queue]) == without_ages(shown) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert without_ages(served[queue]) == without_ages(shown)


def worker_of(daemon: Daemon) -> dict[str, Any]:
    """Return a daemon's entry in its lane's `workers`."""
    return {"workerId": daemon.worker_id, "plays": sorted(drain.app.plays), "machineId": None,
            "version": VERSION, "claiming": True, "claimHealth": "claiming",
            "notClaiming": []}  # fmt: skip


async def store_rows(
    conn: asyncpg.Connection[Any], run_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Return the store rows of ``run_ids`` (status, finished_at), by run id."""
    rows = await conn.fetch(
        f"select run_id::text, status, finished_at from {SCHEMA}.runs"
        " where run_id = any($1::uuid[])",
        run_ids,
    )
    return {row["run_id"]: dict(row) for row in rows}


async def open_runs(conn: asyncpg.Connection[Any], run_ids: list[str]) -> int:
    """Return how many of ``run_ids`` have not finished."""
    rows = await store_rows(conn, run_ids)
    return sum(row["finished_at"] is None for row in rows.values())


async def report_read_by_new_client(conn: asyncpg.Connection[Any], known_pids: set[int]) -> bool:
    """Tell whether a client connection opened after ``known_pids`` has read a lanes report.

    The report is one repeatable-read, read-only transaction; a `lanes wait` that has
    read it at least once has decided on the lane at least once.
    """
    rows = await conn.fetch(
        "select pid, query from pg_stat_activity"
        " where datname = current_database() and application_name = 'lane-worker-client'"
    )
    return any(
        row["pid"] not in known_pids
        and (
            row["query"].startswith("BEGIN ISOLATION LEVEL REPEATABLE READ")
            or row["query"] == "COMMIT;"
        )
        for row in rows
    )


async def stage_a_with_every_kind_of_work(
    pool: Daemons, database_url: str, tmp_path: Path, *, nap_s: float = NAP_S, **a_env: str
) -> dict[str, Any]:
    """Start A (one slot) and B; leave A parked, retrying, in-flight and fresh runs.

    Returns the daemons, the run ids by kind and the files that release the held runs.
    """
    passed, gate = tmp_path / "pass", tmp_path / "gate"
    a = pool.start(A, name="A", app=APP, LANE_WORKER_CONCURRENCY="1", **a_env)
    await a.ready()  # A's lane registers first: B is the newer release
    async with open_client(database_url, CLIENT_ENV) as client:
        waiter_run = await client.submit("waiter")
        await a.wait_for("run.parked", run_id=waiter_run.run_id)
        b = pool.start(B, name="B", app=APP)
        await b.ready()

        lanes_now = await report(database_url, a, b)
        lane_a, lane_b = lanes_now[QA], lanes_now[QB]
        assert list(lanes_now) == [QA, QB]
        assert (lane_a["releaseId"], lane_a["status"]) == (A_ID, "claiming")
        assert counts(lane_a) == expected(parkedEvent=1)
        assert lane_a["counts"]["oldestWaitSeconds"] >= 0
        assert (lane_a["liveWorkers"], lane_a["workers"]) == (1, [worker_of(a)])
        claiming_blockers(lane_a, [])
        assert (lane_b["releaseId"], lane_b["status"]) == (B_ID, "claiming")
        assert counts(lane_b) == expected()
        assert (lane_b["liveWorkers"], lane_b["workers"]) == (1, [worker_of(b)])

        flaky = await client.submit("fail-until", {"pass": str(passed)})
        await a.wait_for("run.attempt_failed", run_id=flaky.run_id)
        nap_run = await client.submit("nap", {"seconds": nap_s})
        await a.wait_for("run.parked", run_id=nap_run.run_id)
        held = await client.submit("gated", {"gate": str(gate)})
        await a.wait_for("run.started", run_id=held.run_id)  # A's only slot is taken now

        async def flaky_retrying() -> bool:
            return (await client.status(flaky.run_id)).status == "retrying"

        await eventually(flaky_retrying, what="the flaky run waiting for its retry")
        fresh = [await client.submit("plain", {"n": n}) for n in range(2)]
    return {
        "a": a,
        "b": b,
        "waiter": waiter_run.run_id,
        "nap": nap_run.run_id,
        "flaky": flaky.run_id,
        "held": held.run_id,
        "fresh": [run.run_id for run in fresh],
        "pass": passed,
        "gate": gate,
    }


# -- the runbook ------------------------------------------------------------------------------


@pytest.mark.timeout(300)
async def test_lanes_wait_exits_when_a_has_finished_its_own_runs_then_b_adopts_the_parked(
    database_url: str, tmp_path: Path
) -> None:
    """Retire A with fresh runs and a retry: A finishes them, `lanes wait A` exits 0 then."""
    async with Daemons(database_url) as pool:
        staged = await stage_a_with_every_kind_of_work(pool, database_url, tmp_path)
        a, b = staged["a"], staged["b"]
        fresh, flaky, held = staged["fresh"], staged["flaky"], staged["held"]
        own = [held, flaky, *fresh]  # what only A may run

        lanes_now = await report(database_url, a, b)
        lane_a = lanes_now[QA]
        assert lane_a["status"] == "claiming"
        assert counts(lane_a) == expected(
            inFlight=1, fresh=2, retrying=1, parkedSleep=1, parkedEvent=1
        )
        claiming_blockers(
            lane_a, [("inFlight", 1, [held]), ("fresh", 2, fresh), ("retrying", 1, [flaky])]
        )
        assert counts(lanes_now[QB]) == expected()

        # Nothing would drain a lane that still claims: `lanes wait` says so at once. With
        # an hour's timeout, one that waited it out would outlast the command's own limit
        # (and say it timed out), however busy the machine.
        claiming = await lane_worker(database_url, "lanes", "wait", A, "--timeout", "3600")
        assert claiming.returncode == 1, (claiming.stdout, claiming.stderr)
        assert "still claims new runs" in claiming.stderr
        assert f"lane-worker lanes retire {A_ID}" in claiming.stderr

        retired = await lane_worker_json(database_url, "lanes", "retire", A)
        assert (retired["queue"], retired["status"], retired["known"]) == (QA, "retired", True)
        await a.wait_for("lane.draining")
        await b.wait_for("loop.attached", queue=QA)
        lane_a = (await report(database_url, a, b))[QA]
        assert lane_a["status"] == "draining"
        assert lane_a["safeToStop"] is False
        assert counts(lane_a) == expected(
            inFlight=1, fresh=2, retrying=1, parkedSleep=1, parkedEvent=1
        )
        assert lane_a["adoptable"] == 2  # B is live and registers both plays
        assert blockers(lane_a) == [
            ("inFlight", 1, [held]),
            ("fresh", 2, fresh),
            ("retrying", 1, [flaky]),
        ]
        for blocker in lane_a["blockedBy"]:
            assert f"{A_ID}'s 1 live worker(s)" in blocker["remedy"], blocker
        shown = await lane_worker_json(database_url, "lanes", "show", A)
        assert without_ages(shown) == without_ages(lane_a)

        # `lanes wait A` is running before A can finish anything.
        watcher = await connect(database_url)
        try:
            known_pids = {
                row["pid"]
                for row in await watcher.fetch(
                    "select pid from pg_stat_activity where datname = current_database()"
                )
            }
            waiting = await asyncio.to_thread(
                subprocess.Popen,
                # An hour: a wait that ended on its timeout, not on the drain, shows.
                cli_argv("lanes", "wait", A, "--timeout", "3600", "--json"),
                cwd=REPO,
                env=cli_env(operator_env(database_url)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:

                async def wait_has_read_the_report() -> bool:
                    if waiting.poll() is not None:
                        out, err = waiting.communicate()
                        raise AssertionError(
                            f"`lanes wait` exited {waiting.returncode} while A still held its "
                            f"own runs: {out} {err}"
                        )
                    return await report_read_by_new_client(watcher, known_pids)

                await eventually(
                    wait_has_read_the_report, what="`lanes wait` to read the report once"
                )
                # It has decided on the lane while all of A's own runs were held open.
                assert waiting.poll() is None
                assert await open_runs(watcher, own) == len(own)
                staged["pass"].touch()  # the retry will succeed
                staged["gate"].touch()  # the in-flight run ends, then A takes the rest

                deadline = time.monotonic() + 90
                while True:
                    # In this order: a run still open after wait was seen gone was open
                    # when it exited.
                    exited = waiting.poll() is not None
                    exit_seen_at = time.time()
                    still_open = await open_runs(watcher, own)
                    if exited:
                        assert still_open == 0, f"`lanes wait` exited with {still_open} open"
                        break
                    assert time.monotonic() < deadline, "`lanes wait` did not exit in 90 s"
                    await asyncio.sleep(0.05)
                rows = await store_rows(watcher, own)
            finally:
                if waiting.poll() is None:
                    waiting.kill()
                out, err = await asyncio.to_thread(waiting.communicate, timeout=30)
        finally:
            await watcher.close()
        assert waiting.returncode == 0, err
        assert err == ""
        said = json.loads(out)
        assert (said["queue"], said["status"], said["safeToStop"]) == (QA, "drained", True)
        assert said["blockedBy"] == []
        assert {row["status"] for row in rows.values()} == {"completed"}
        last_finished: datetime = max(row["finished_at"] for row in rows.values())
        assert last_finished.timestamp() <= exit_seen_at
        # It polls every 0.5 s: "as soon as", with room for a busy machine (60 polls); the
        # defect, a wait that ends on its timeout, would take an hour.
        assert exit_seen_at - last_finished.timestamp() < 30
        (nap_parked,) = a.events("run.parked", run_id=staged["nap"])
        print(
            f"`lanes wait` exited {exit_seen_at - last_finished.timestamp():.2f} s after A's "
            f"last run ended, {time.monotonic() - nap_parked['_mono']:.1f} s after the nap "
            f"parked ({NAP_S:g} s)"
        )

        async with open_client(database_url, CLIENT_ENV) as client:
            for run_id in own:
                status = await client.status(run_id)
                assert {x.release_id for x in status.attempts} == {A_ID}, run_id
                assert status.output["release"] == A_ID
            await a.wait_for("lane.drained")
            lanes_now = await report(database_url, a, b)
            lane_a = lanes_now[QA]
            assert (lane_a["status"], lane_a["safeToStop"], lane_a["blockedBy"]) == (
                "drained",
                True,
                [],
            )
            assert counts(lane_a) == expected(parkedSleep=1, parkedEvent=1)  # left to B
            assert lane_a["adoptable"] == 2
            assert lane_a["counts"]["oldestWaitSeconds"] > 0
            assert counts(lanes_now[QB]) == expected()

            # B adopts A's parked runs as they come due: a signal, the end of the nap.
            assert (await client.signal(staged["waiter"], "go", {"by": "test"})).delivered
            await wake_nap(database_url, QA, staged["nap"])
            for run_id in (staged["waiter"], staged["nap"]):
                adopted = await b.wait_for("run.adopted", run_id=run_id, timeout_s=60)
                assert adopted["queue"] == QA
                await b.wait_for("run.completed", run_id=run_id)
                status = await client.status(run_id)
                assert status.adopted_release_id == B_ID
                assert status.output["release"] == B_ID
                assert [(x.release_id, x.disposition, x.outcome) for x in status.attempts] == [
                    (A_ID, "own", "parked"),
                    (B_ID, "adopt", "completed"),
                ]
        lanes_now = await report(database_url, a, b)
        assert counts(lanes_now[QA]) == expected()
        assert lanes_now[QA]["counts"]["adoptedBy"] == {}
        assert lanes_now[QA]["status"] == "drained"
        assert counts(lanes_now[QB]) == expected()

        for daemon in (a, b):
            daemon.terminate()
        for daemon in (a, b):
            assert await daemon.wait_exit(timeout_s=30) == 0
            assert daemon.malformed_lines() == []


@pytest.mark.timeout(120)
async def test_a_machine_killed_before_its_lane_drained_leaves_named_stranded_runs(
    database_url: str, tmp_path: Path
) -> None:
    """SIGKILL A while draining: `lanes show A` names each stranded run; `lanes wait` exits 1."""
    async with Daemons(database_url) as pool:
        # A long lease: the killed machine's in-flight run stays in flight for this test;
        # a long nap: B adopts nothing while the test reads the report.
        staged = await stage_a_with_every_kind_of_work(
            pool, database_url, tmp_path, nap_s=600, LANE_WORKER_CLAIM_TIMEOUT="600"
        )
        a, b = staged["a"], staged["b"]
        fresh, flaky, held = staged["fresh"], staged["flaky"], staged["held"]
        stranded = [
            ("inFlight", 1, [held]),
            ("fresh", 2, fresh),
            ("retrying", 1, [flaky]),
        ]
        retired = await lane_worker(database_url, "lanes", "retire", A)
        assert retired.returncode == 0, retired.stderr
        await a.wait_for("lane.draining")
        a.kill()  # stopped before drained: the runbook's mistake
        assert await a.wait_exit(timeout_s=15) == -9

        # Its last heartbeat is seconds old: for up to a minute the report still
        # counts the dead machine as live, and says its worker will run them.
        shown = await lane_worker_json(database_url, "lanes", "show", A)
        assert (shown["status"], shown["safeToStop"], shown["liveWorkers"]) == (
            "draining",
            False,
            1,
        )
        assert blockers(shown) == stranded
        assert counts(shown) == expected(
            inFlight=1, fresh=2, retrying=1, parkedSleep=1, parkedEvent=1
        )

        # A minute later (aged in the store instead of waited for) no worker of A is live.
        conn = await connect(database_url)
        try:
            aged = await conn.execute(
                f"update {SCHEMA}.workers"
                " set heartbeat_at = now() - make_interval(secs => $2) where queue = $1",
                QA,
                LIVENESS_S + 1,
            )
        finally:
            await conn.close()
        assert aged == "UPDATE 1"
        shown = await lane_worker_json(database_url, "lanes", "show", A)
        assert (shown["status"], shown["liveWorkers"], shown["workers"]) == ("draining", 0, [])
        assert blockers(shown) == stranded
        for blocker in shown["blockedBy"]:
            assert blocker["remedy"].startswith(f"no live worker of {A_ID}: start one"), blocker
        remedy = {b["reason"]: b["remedy"] for b in shown["blockedBy"]}
        assert "lease expires" in remedy["inFlight"]
        # README: runs that never started can move to B; started ones are failed and retried.
        assert f"lane-worker lanes move {A_ID} --to" in remedy["fresh"]
        for reason in ("inFlight", "retrying"):
            assert "lane-worker runs fail RUN_ID" in remedy[reason], remedy[reason]
            assert "lane-worker runs retry RUN_ID" in remedy[reason], remedy[reason]
        await served_agrees(b, QA, shown)
        # The table: one row per lane, then what blocks each lane that is not claiming.
        table = await lane_worker(database_url, "lanes")
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()]
        assert rows[0] == [
            "RELEASE", "QUEUE", "STATUS", "LIVE", "IN-FLIGHT", "FRESH", "RETRYING",
            "HANDED-BACK", "PARKED", "DEFERRED", "SAFE-TO-STOP",
        ]  # fmt: skip
        assert rows[1] == [A_ID, QA, "draining", "0", "1", "2", "1", "0", "2", "0", "no"]
        assert rows[2] == [B_ID, QB, "claiming", "1", "0", "0", "0", "0", "0", "0", "no"]
        assert f"{A_ID}: blocked by inFlight (1): no live worker of {A_ID}" in table.stdout
        assert f"{A_ID}: blocked by retrying (1): no live worker of {A_ID}" in table.stdout
        served_text = await http_lanes(b, text=True)
        assert served_text == table.stdout
        text = await lane_worker(database_url, "lanes", "show", A)
        assert text.returncode == 0, text.stderr
        assert "blocked by fresh (2): no live worker of" in text.stdout
        for run_id in (held, flaky, *fresh):
            assert run_id in text.stdout

        waited = await lane_worker(database_url, "lanes", "wait", A, "--timeout", "2")
        assert waited.returncode == 1, (waited.stdout, waited.stderr)
        (line,) = waited.stderr.splitlines()
        assert line.startswith(f"lane-worker: lane {QA} (release {A_ID}) is still draining")
        assert "(inFlight 1; fresh 2; retrying 1)" in line
        waited = await lane_worker(database_url, "lanes", "wait", A, "--timeout", "1", "--json")
        assert waited.returncode == 1, (waited.stdout, waited.stderr)
        assert blockers(json.loads(waited.stdout)) == stranded

        unknown = await lane_worker(database_url, "lanes", "wait", "lw-typo", "--timeout", "1")
        assert unknown.returncode == 1, (unknown.stdout, unknown.stderr)
        assert "no lane has release 'lw-typo'" in unknown.stderr

        # B never ran any of them: they are A's.
        async with open_client(database_url, CLIENT_ENV) as client:
            for run_id in (held, flaky, *fresh):
                assert not b.events(run_id=run_id, event="run.started")
                status = await client.status(run_id)
                assert status.status != "completed"
                assert {x.release_id for x in status.attempts} <= {A_ID}
        b.terminate()
        assert await b.wait_exit(timeout_s=30) == 0
        assert b.malformed_lines() == []


async def test_lanes_wait_says_what_is_left_every_10_s_on_stderr(database_url: str) -> None:
    """A retired lane holding a fresh run and no worker: a progress line on stderr, JSON intact."""
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "lw-progress"}) as c:
        await c.activate_release("lw-progress", force=True)
        await c.submit("plain", {})
        await c.retire_release("lw-progress")
    waited = await lane_worker(database_url, "lanes", "wait", "lw-progress", "--timeout", "11",
                               "--json")  # fmt: skip
    assert waited.returncode == 1
    progress = [line for line in waited.stderr.splitlines() if line.startswith("lanes wait:")]
    assert progress == ["lanes wait: lw-progress still draining after 10 s; left: fresh 1"]
    assert json.loads(waited.stdout)["status"] == "draining"
