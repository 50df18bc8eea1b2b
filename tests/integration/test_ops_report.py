"""The drain report (worker/ops/report.py), on real Postgres with in-process workers.

Every test puts runs in known states with the runtime harness (real claims, real
plays), then checks that ``LaneClient.lanes()`` reports exactly that: the six
buckets, deferrals, adopters, live workers and their plays, the verdict and what
blocks it. The deferral itself is tested in ``test_run_deferral.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from support.db import LIVENESS_S, backdate_heartbeats, engine_runs_due, run_row
from support.plays import ReportPlays, report_app
from support.report import (
    blockers,
    claiming_blockers,
    counts,
    expected,
    lanes_json,
    remedies,
)
from support.runtime import (
    connect,
    eventually,
    hold_in_flight,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    set_policy,
    work_once,
)

A, B, C = "rel-a", "rel-b", "rel-c"
QA, QB, QC = queue_of(A), queue_of(B), queue_of(C)
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "5"}


def seen(worker_id: str, plays: list[str]) -> dict[str, Any]:
    """A live worker as the report lists it, recorded as a build before 0.2.0 records it.

    Such a build reports no claim health: it reads as unknown, never as claiming.
    """
    return {"workerId": worker_id, "plays": plays, "machineId": None, "version": None,
            "claiming": None, "claimHealth": "unknown", "notClaiming": []}  # fmt: skip


@pytest.fixture
def plays(report_plays: ReportPlays) -> ReportPlays:
    """The report app's state (every test of this module stages its runs with it)."""
    return report_plays


# -- the buckets, the verdict and the blockers -----------------------------------------------


async def test_the_report_counts_every_bucket_and_follows_a_lane_from_claiming_to_drained(
    database_url: str, plays: ReportPlays
) -> None:
    """One run in each bucket: the report counts exactly those, then follows A's drain."""
    app = report_app(plays)
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
        open_runtime(database_url, app, B) as rt_b,
    ):
        await client.activate_release(A, force=True)  # lanes register in release order
        await client.activate_release(B, force=True)
        await register_worker(rt_a)
        await register_worker(rt_b)  # B is live and registers every play: it can adopt

        napper = await client.submit("napper")
        waiter = await client.submit("waiter")
        flaky = await client.submit("flaky")
        assert sorted(await work_once(rt_a)) == ["parked", "parked", "retrying"]
        # The retry stays pending whatever the test's pace (its backoff is 1 s).
        await engine_runs_due(database_url, QA, flaky.run_id, in_s=3600)
        in_flight = await client.submit("gated", {"name": "in-flight"})
        held = await hold_in_flight(rt_a, plays, "in-flight")
        try:
            handed_back = await client.submit("gated", {"name": "handed-back"})
            cut = await hold_in_flight(rt_a, plays, "handed-back")
            cut.cancel()  # a drain's cancel: Runtime.handle gives the claim back
            with pytest.raises(asyncio.CancelledError):
                await cut
            fresh = [await client.submit("plain", {"n": n}) for n in range(2)]
            handed_back_row = await run_row(database_url, handed_back.run_id)
            assert (handed_back_row["status"], handed_back_row["attempts"]) == ("queued", 1)
            handed_back_status = await client.status(handed_back.run_id)
            assert [(a.disposition, a.outcome) for a in handed_back_status.attempts] == [
                ("own", "handed_back")
            ]

            # -- A claiming ---------------------------------------------------------------
            report = await lanes_json(client)
            assert list(report) == [QA, QB]  # registration order
            lane_a, lane_b = report[QA], report[QB]
            assert lane_a["status"] == "claiming"
            assert counts(lane_a) == expected(
                inFlight=1, fresh=2, retrying=1, handedBack=1, parkedSleep=1, parkedEvent=1
            )
            assert (lane_a["queued"], lane_a["running"], lane_a["waiting"]) == (3, 2, 2)
            assert lane_a["adoptable"] == 0  # a claiming lane's parked runs are its own
            assert lane_a["counts"]["adoptedBy"] == {}
            assert lane_a["counts"]["oldestDeferralSeconds"] is None
            first_wait = lane_a["counts"]["oldestWaitSeconds"]
            assert first_wait is not None
            assert first_wait >= 0
            assert lane_a["liveWorkers"] == 1
            assert lane_a["workers"] == [seen(rt_a.worker_base, rt_a.plays)]
            assert lane_a["safeToStop"] is False
            claiming_blockers(
                lane_a,
                [
                    ("inFlight", 1, [in_flight.run_id]),
                    ("fresh", 2, [run.run_id for run in fresh]),
                    ("retrying", 1, [flaky.run_id]),
                    ("handedBack", 1, [handed_back.run_id]),
                ],
            )
            assert "lane-worker lanes retire rel-a" in remedies(lane_a)["claiming"]
            assert lane_b["status"] == "claiming"
            assert counts(lane_b) == expected()
            assert lane_b["counts"]["oldestWaitSeconds"] is None
            assert lane_b["workers"] == [seen(rt_b.worker_base, rt_b.plays)]
            claiming_blockers(lane_b, [])

            # -- A retired: draining, its own live worker runs the blockers -------------------
            await client.retire_release(A)
            set_policy(rt_a, draining=True)
            lane_a = (await lanes_json(client))[QA]
            assert lane_a["status"] == "draining"
            assert lane_a["safeToStop"] is False
            assert counts(lane_a) == expected(
                inFlight=1, fresh=2, retrying=1, handedBack=1, parkedSleep=1, parkedEvent=1
            )
            assert lane_a["adoptable"] == 2  # B is live and registers both parked plays
            assert blockers(lane_a) == [
                ("inFlight", 1, [in_flight.run_id]),
                ("fresh", 2, [run.run_id for run in fresh]),
                ("retrying", 1, [flaky.run_id]),
                ("handedBack", 1, [handed_back.run_id]),
            ]
            for reason, remedy in remedies(lane_a).items():
                assert "rel-a's 1 live worker(s)" in remedy, (reason, remedy)
                assert "lane-worker lanes wait rel-a" in remedy, (reason, remedy)
            assert "running them" in remedies(lane_a)["inFlight"]

            # The oldest wait's age grows with the database's clock.
            async def wait_grew() -> bool:
                now = (await lanes_json(client))[QA]["counts"]["oldestWaitSeconds"]
                return bool(now > first_wait)

            await eventually(wait_grew, what="the oldest wait's age to grow")

            # -- A's machine dies: no live worker, the remedy says how to get one ----------
            await backdate_heartbeats(database_url, QA, LIVENESS_S + 1)
            lane_a = (await lanes_json(client))[QA]
            assert (lane_a["liveWorkers"], lane_a["workers"]) == (0, [])
            assert lane_a["status"] == "draining"
            assert [reason for reason, _, _ in blockers(lane_a)] == [
                "inFlight",
                "fresh",
                "retrying",
                "handedBack",
            ]
            for reason, remedy in remedies(lane_a).items():
                assert remedy.startswith("no live worker of rel-a"), (reason, remedy)
                assert "live worker(s)" not in remedy, (reason, remedy)
            assert "lease expires" in remedies(lane_a)["inFlight"]
            await register_worker(rt_a, "test-rel-a-restarted")  # a machine of A is back
            lane_a = (await lanes_json(client))[QA]
            assert lane_a["workers"] == [seen("test-rel-a-restarted", rt_a.plays)]

            # -- A finishes its own runs on its own worker: drained ----------------------------
            plays.gate.set()
            assert (await held).outcome == "completed"
            await engine_runs_due(database_url, QA, flaky.run_id, in_s=-1)
            mine = [flaky, handed_back, *fresh]

            async def a_finished_its_own() -> bool:
                await work_once(rt_a)
                statuses = {(await client.status(run.run_id)).status for run in mine}
                return statuses == {"completed"}

            await eventually(
                a_finished_its_own, what="A to finish its retry, fresh and handed-back runs"
            )
            lane_a = (await lanes_json(client))[QA]
            assert lane_a["status"] == "drained"
            assert lane_a["safeToStop"] is True
            assert lane_a["blockedBy"] == []
            assert counts(lane_a) == expected(parkedSleep=1, parkedEvent=1)
            assert lane_a["adoptable"] == 2
            for run in (*mine, in_flight):
                assert {a.release_id for a in (await client.status(run.run_id)).attempts} == {A}

            # -- B adopts A's waiter, which parks again on B: A's adoptedBy names B -------------
            assert (await client.signal(waiter.run_id, "first")).delivered
            assert await work_once(rt_b, QA) == ["parked"]
            report = await lanes_json(client)
            lane_a, lane_b = report[QA], report[QB]
            assert lane_a["counts"]["adoptedBy"] == {QB: 1}
            assert counts(lane_a) == expected(parkedSleep=1)  # the waiter is B's work now
            assert lane_a["status"] == "drained"
            assert counts(lane_b) == expected(parkedEvent=1)
            assert lane_b["counts"]["adoptedBy"] == {}
            claiming_blockers(lane_b, [])  # a claiming lane resumes its parked runs itself
            status = await client.status(waiter.run_id)
            assert (status.status, status.adopted_release_id) == ("waiting", B)

            assert (await client.signal(waiter.run_id, "second")).delivered
            assert await work_once(rt_b, QA) == ["completed"]
            report = await lanes_json(client)
            assert report[QA]["counts"]["adoptedBy"] == {}
            assert counts(report[QB]) == expected()
            assert (await client.status(waiter.run_id)).output == [B, B]
            assert (await client.status(napper.run_id)).status == "waiting"

        finally:  # a failure must not leave the held run to a closed pool
            plays.gate.set()
            await asyncio.wait_for(asyncio.gather(held, return_exceptions=True), 20)


async def test_a_parked_run_no_newer_release_can_adopt_keeps_its_lane_draining(
    database_url: str, plays: ReportPlays
) -> None:
    """A parked run whose play no live newer claiming worker registers blocks A's drain."""
    app_a = report_app(plays)
    app_b = report_app(plays, without=("special",))  # B's app lacks the play
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app_a, A) as rt_a,
        open_runtime(database_url, app_b, B) as rt_b,
        open_runtime(database_url, app_a, C) as rt_c,
    ):
        for release in (A, B, C):  # lanes register in release order
            await client.activate_release(release, force=True)
        await register_worker(rt_b)
        special = await client.submit("special")
        napper = await client.submit("napper")
        assert await work_once(rt_a) == ["parked", "parked"]
        await client.retire_release(A)

        lane_a = (await lanes_json(client))[QA]
        assert lane_a["status"] == "draining"
        assert lane_a["safeToStop"] is False
        assert counts(lane_a) == expected(parkedSleep=1, parkedEvent=1)
        assert lane_a["adoptable"] == 1  # only the napper: B registers that play
        assert blockers(lane_a) == [("parkedNotAdoptable", 1, [special.run_id])]
        remedy = remedies(lane_a)["parkedNotAdoptable"]
        assert "no live worker of a newer claiming release registers play special" in remedy
        assert "keep rel-a's machines running, its workers resume them" in remedy

        # C registers the play, but its only worker is dead: still not adoptable.
        await register_worker(rt_c)
        await backdate_heartbeats(database_url, QC, LIVENESS_S + 1)
        lane_a = (await lanes_json(client))[QA]
        assert lane_a["status"] == "draining"
        assert blockers(lane_a) == [("parkedNotAdoptable", 1, [special.run_id])]

        # A live worker of C registers it: A is drained, both parked runs adoptable.
        await register_worker(rt_c, "test-rel-c-live")
        lane_a = (await lanes_json(client))[QA]
        assert lane_a["status"] == "drained"
        assert lane_a["safeToStop"] is True
        assert (lane_a["blockedBy"], lane_a["adoptable"]) == ([], 2)
        assert counts(lane_a) == expected(parkedSleep=1, parkedEvent=1)
        assert (await client.status(napper.run_id)).status == "waiting"


async def test_a_lane_with_open_runs_but_no_lane_row_is_unregistered(database_url: str) -> None:
    """Runs submitted to a release no worker ever registered: an `unregistered` lane, blocked."""
    env_c = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": C}
    async with open_client(database_url, env_c) as client:
        await client.activate_release(A, force=True)
        run = await client.submit("plain")
        report = await lanes_json(client)
        assert list(report) == [QA, QC]  # registered lanes first, then the others
        lane_c = report[QC]
        assert lane_c["status"] == "unregistered"
        assert lane_c["safeToStop"] is False
        assert (lane_c["liveWorkers"], lane_c["workers"]) == (0, [])
        assert counts(lane_c) == expected(fresh=1)
        assert blockers(lane_c) == [("fresh", 1, [run.run_id])]
        assert remedies(lane_c)["fresh"].startswith("no live worker of")
        shown = (await client.lane(C)).as_json()  # `lanes show rel-c`, read a moment later
        assert {**shown, "asOf": None} == {**lane_c, "asOf": None}
        assert report[QA]["status"] == "claiming"


async def test_blocker_run_ids_show_the_first_20_oldest_first_and_count_them_all(
    database_url: str,
) -> None:
    """25 fresh runs: the blocker counts 25 and names the 20 submitted first, in order."""
    async with open_client(database_url, ENV_A) as client:
        await client.activate_release(A, force=True)
        runs = [await client.submit("plain", {"n": n}) for n in range(25)]
        await client.retire_release(A)
        lane_a = (await client.lane(A)).as_json()
    assert lane_a["status"] == "draining"
    assert counts(lane_a) == expected(fresh=25)
    assert blockers(lane_a) == [("fresh", 25, [run.run_id for run in runs[:20]])]


async def test_not_adoptable_run_ids_are_the_oldest_20_across_sleeps_and_waits(
    database_url: str, plays: ReportPlays
) -> None:
    """30 parked runs nothing can adopt, sleeps older than waits: the 20 oldest are named."""
    app = report_app(plays)
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, app, A) as rt_a,
    ):
        await client.activate_release(A, force=True)
        runs = [await client.submit("napper", {"n": n}) for n in range(15)]
        runs += [await client.submit("special", {"n": n}) for n in range(15)]

        async def all_parked() -> bool:
            await work_once(rt_a)
            return (await client.lane(A)).waiting == len(runs)

        await eventually(all_parked, what="30 runs parked")
        await client.retire_release(A)  # no newer release at all: nothing can adopt them
        lane_a = (await client.lane(A)).as_json()
    assert counts(lane_a) == expected(parkedSleep=15, parkedEvent=15)
    (blocker,) = lane_a["blockedBy"]
    assert (blocker["reason"], blocker["count"]) == ("parkedNotAdoptable", 30)
    submitted = {run.run_id: n for n, run in enumerate(runs)}  # 0-14 sleep, 15-29 wait
    assert [submitted[run_id] for run_id in blocker["runIds"]] == list(range(20))


# -- a store with a million finished runs ---------------------------------------------------

FINISHED_RUNS = 1_000_000
OPEN_RUNS = {"queued": 3, "waiting": 2, "retrying": 1}


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield every node of an EXPLAIN (FORMAT JSON) plan."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


@pytest.mark.timeout(300)
async def test_the_report_reads_only_open_runs_of_a_store_with_a_million_finished(
    database_url: str,
) -> None:
    """1,000,000 finished runs: no report query scans the runs table; the counts are exact."""
    token = uuid.uuid4().hex[:8]
    schema, suffix = f"report_scale_{token}", f"scale_{token}"
    env = {
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": schema,
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": suffix,
    }
    conn = await connect(database_url)
    try:
        async with open_client(database_url, env) as client:  # migrates the fresh schema
            assert client.store.schema == schema
            await client.activate_release(A, force=True)
            await client.activate_release(B, force=True)
            started = time.monotonic()
            await conn.execute(
                f"insert into {schema}.runs (run_id, play, input, launch, release_id, queue,"
                " status, max_attempts, attempts, created_at, updated_at, finished_at)"
                " select gen_random_uuid(), 'plain', '{}', '{}', $1, $2,"
                " (array['completed', 'failed', 'cancelled'])[1 + i % 3], 5, 1,"
                " now() - make_interval(secs => i), now(), now()"
                " from generate_series(1, $3::int) as i",
                A,
                QA,
                FINISHED_RUNS,
            )
            inserted_s = time.monotonic() - started
            for status, many in OPEN_RUNS.items():
                await conn.execute(
                    f"insert into {schema}.runs (run_id, play, input, launch, release_id, queue,"
                    " status, current_wait, max_attempts)"
                    " select gen_random_uuid(), 'plain', '{}', '{}', $1, $2, $3,"
                    " case when $3 = 'waiting' then '{\"kind\": \"sleep\"}'::jsonb end, 5"
                    " from generate_series(1, $4::int)",
                    A,
                    QA,
                    status,
                    many,
                )
            # Autovacuum analyzes a table this size within a minute of the load (the test
            # server may run without autovacuum, and a test must not race it): the test
            # does it now. Before any statistics exist the planner does not know that the
            # open runs are few, and reads the whole table.
            await conn.execute(f"analyze {schema}.runs")
            # Write the load's dirty buffers out now. Otherwise a checkpoint forced
            # meanwhile (any session's DROP DATABASE forces one) writes them while the
            # report is timed, and every page the report reads waits behind it: that
            # was measured here as 700-800 ms, with the same plan.
            with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
                await conn.execute("checkpoint")
            print(f"inserted {FINISHED_RUNS} finished runs in {inserted_s:.1f} s")

            # The plan is the real guard: every report query reaches runs through the
            # partial indexes of open runs, never by reading the whole table.
            for name in ("report_runs", "report_adopted", "report_lanes"):
                # The harness's connection decodes json: the plan comes back as a list.
                (explained,) = await conn.fetchval("explain (format json) " + client.store.q[name])
                scans = [
                    node
                    for node in plan_nodes(explained["Plan"])
                    if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "runs"
                ]
                assert scans == [], f"{name} scans the runs table: {json.dumps(explained)}"

            lane_a = (await lanes_json(client))[QA]
            assert counts(lane_a) == expected(fresh=3, parkedSleep=2, retrying=1)
            # How long the report takes at this size is measured in bench/report.py.
    finally:
        try:
            await conn.execute(f"drop schema if exists {schema} cascade")
        finally:
            await conn.close()
