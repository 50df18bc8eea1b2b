"""A rolling deploy with real daemons: release A, then B, on one database."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from support.daemon import Daemons
from support.db import wake_nap
from support.runtime import eventually, open_client
from worker.client import LaneClient, SubmittedRun

A, B = "rel-a", "rel-b"  # as deployed (launch stamps)
# How the workers name their release: as deployed (issue 31 §1), not rel_a.
A_ID = A
B_ID = B
QUEUE_A, QUEUE_B = "runs_rel_a", "runs_rel_b"
# Many attempts, so the flaky run stays in retry backoff for the whole test.
CLIENT_A_ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "20"}


async def submit_many(client: LaneClient, play: str, count: int, params: Any) -> list[SubmittedRun]:
    """Submit ``count`` runs of ``play``."""
    return [await client.submit(play, params) for _ in range(count)]


async def retry_due(database_url: str, run_id: str) -> bool:
    """Tell whether a run's pending engine retry is due."""
    conn = await asyncpg.connect(database_url)
    try:
        due: bool = await conn.fetchval(
            f'select bool_or(r.available_at <= now()) from absurd."r_{QUEUE_A}" r'
            " join runtime_scheduler.runs s on s.task_id = r.task_id"
            " where s.run_id = $1 and r.state = 'sleeping'",
            run_id,
        )
    finally:
        await conn.close()
    return bool(due)


async def engine_runs_of(database_url: str, queue: str, run_id: str) -> list[int]:
    """Return the engine attempt numbers of a run's engine runs (one per spent attempt)."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            f'select r.attempt from absurd."r_{queue}" r'
            " join runtime_scheduler.runs s on s.task_id = r.task_id"
            " where s.run_id = $1 order by r.attempt",
            run_id,
        )
    finally:
        await conn.close()
    return [r["attempt"] for r in rows]


async def test_rolling_deploy_b_adopts_parked_runs_and_leaves_a_s_own_work_alone(
    database_url: str,
) -> None:
    """B adopts A's parked sleepers and waiters, never claims A's retry or A's fresh runs."""
    async with Daemons(database_url) as pool, open_client(database_url, CLIENT_A_ENV) as client:
        a = pool.start(A, name="A")
        await a.ready()
        # Naps of an hour, made due once A is stopped (below): 3 s ones raced A's stop,
        # and a busy machine let A take them itself.
        sleepers = await submit_many(client, "sleeper", 2, {"seconds": 3600})
        waiters = await submit_many(client, "waiter", 2, {})
        plains = await submit_many(client, "plain", 2, {"early": True})
        flaky = await client.submit("flaky", {})
        for run in sleepers + waiters:
            await a.wait_for("run.parked", run_id=run.run_id)
        for run in plains:
            await a.wait_for("run.completed", run_id=run.run_id)

        async def flaky_in_backoff() -> bool:
            return (await client.status(flaky.run_id)).status == "retrying"

        await eventually(flaky_in_backoff, what="the flaky run to be in retry backoff")

        # Stop A, then wake its sleepers: A must not take them.
        a.terminate()
        assert await a.wait_exit(timeout_s=15) == 0
        for run in sleepers:
            assert not a.events("run.completed", run_id=run.run_id), "A finished a sleeper"
            await wake_nap(database_url, QUEUE_A, run.run_id)
        fresh = await submit_many(client, "plain", 2, {"fresh": True})
        assert all(run.release_id == A and run.queue == QUEUE_A for run in fresh)
        assert await client.retire_release(A) == QUEUE_A

        b = pool.start(B, name="B")
        await b.ready()
        await b.wait_for("loop.attached", queue=QUEUE_A)
        for run in sleepers:
            adopted = await b.wait_for("run.adopted", run_id=run.run_id)
            assert adopted["release_id"] == B_ID
            assert adopted["queue"] == QUEUE_A
            await b.wait_for("run.completed", run_id=run.run_id)
        for run in waiters:
            assert not (await client.signal(run.run_id, "go", {"by": "deploy-test"})).duplicate
        for run in waiters:
            await b.wait_for("run.completed", run_id=run.run_id)
        # A's retry comes due while B runs: B's continuation claim never hands it out.
        await eventually(
            lambda: retry_due(database_url, flaky.run_id), timeout_s=40, what="the retry due"
        )
        await asyncio.sleep(3 * 0.5)  # a few of B's polls (0.5 s): what B must not do

        continuation_worker = f"{b.worker_id}:{QUEUE_A}:continuations"
        for run in sleepers:
            status = await client.status(run.run_id)
            assert status.status == "completed"
            assert status.adopted_release_id == B_ID
            assert status.output == {"before": A_ID, "after": B_ID}
            assert [(x.release_id, x.disposition, x.outcome) for x in status.attempts] == [
                (A_ID, "own", "parked"),
                (B_ID, "adopt", "completed"),
            ]
            assert status.attempts[1].worker_id == continuation_worker
            assert [x.attempt for x in status.attempts] == [1, 1]
            assert status.facts == ("run.completed",)
        for run in waiters:
            status = await client.status(run.run_id)
            assert status.status == "completed"
            assert status.adopted_release_id == B_ID
            assert status.output == {
                "resumed": True,
                "timed_out": False,
                "by": "deploy-test",
                "release": B_ID,
            }
            assert [x.attempt for x in status.attempts] == [1, 1]
        for run in plains:
            status = await client.status(run.run_id)
            assert status.status == "completed"
            assert status.adopted_release_id is None
            assert status.output["release"] == A_ID

        # A's fresh runs were never started: queued, no attempt rows, not in B's logs.
        for run in fresh:
            status = await client.status(run.run_id)
            assert status.status == "queued"
            assert status.attempts == ()
            assert not b.events(run_id=run.run_id)

        # The flaky run: only A may run its retry; B never claimed it (no defer).
        status = await client.status(flaky.run_id)
        assert status.status == "retrying"
        assert status.attempts
        assert all(
            (x.release_id, x.disposition, x.outcome) == (A_ID, "own", "retrying")
            for x in status.attempts
        )
        assert not b.events(run_id=flaky.run_id)
        last_own = max(x.attempt for x in status.attempts)
        engine_runs = await engine_runs_of(database_url, QUEUE_A, flaky.run_id)
        assert engine_runs == list(range(1, last_own + 2))

        by_queue = {lane.queue: lane for lane in await client.lanes()}
        lane_a, lane_b = by_queue[QUEUE_A], by_queue[QUEUE_B]
        assert lane_a.status == "draining"  # its fresh runs only A may run
        assert lane_a.release_id == A
        assert (lane_a.queued, lane_a.running, lane_a.waiting) == (len(fresh), 1, 0)
        assert lane_a.live_workers == 0
        assert (lane_b.status, lane_b.live_workers) == ("claiming", 1)
        assert lane_b.release_id == B

        b.terminate()
        assert await b.wait_exit(timeout_s=15) == 0
        assert a.malformed_lines() == []
        assert b.malformed_lines() == []


async def test_a_lane_activated_again_gets_its_runs_back_from_b(database_url: str) -> None:
    """After `lanes activate A`, B detaches from A's queue and never runs A's run; A finishes it."""
    async with Daemons(database_url) as pool, open_client(database_url, CLIENT_A_ENV) as client:
        a = pool.start(A, name="A")
        await a.ready()
        run = await client.submit("waiter", {})
        await a.wait_for("run.parked", run_id=run.run_id)
        a.terminate()
        assert await a.wait_exit(timeout_s=15) == 0
        await client.retire_release(A)

        b = pool.start(B, name="B")
        await b.ready()
        await b.wait_for("loop.attached", queue=QUEUE_A)
        assert await client.activate_release(A) == QUEUE_A
        detached = await b.wait_for("loop.detached", queue=QUEUE_A)
        assert detached["reason"] == "lane claims"
        await client.signal(run.run_id, "go", {"by": "activate-test"})

        a2 = pool.start(A, name="A2")
        await a2.ready()
        await a2.wait_for("run.completed", run_id=run.run_id)
        assert not b.events("run.started", run_id=run.run_id)
        assert not b.events("lane.refused")  # B was not handed the run: no refusal
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert status.adopted_release_id is None
        assert status.output["release"] == A_ID
        assert [(x.release_id, x.disposition, x.outcome) for x in status.attempts] == [
            (A_ID, "own", "parked"),
            (A_ID, "own", "completed"),
        ]
        assert status.facts == ("run.completed",)
        for daemon in (a2, b):
            daemon.terminate()
        for daemon in (a2, b):
            assert await daemon.wait_exit(timeout_s=15) == 0


async def test_a_retired_lane_drains_on_its_own_workers_then_refuses_boot(
    database_url: str, tmp_path: Any
) -> None:
    """Retired A finishes its own runs, B adopts A's sleeper, and a drained A will not boot."""
    async with Daemons(database_url) as pool, open_client(database_url, CLIENT_A_ENV) as client:
        a = pool.start(A, name="A")
        await a.ready()  # A's lane registers first: B is the newer release
        b = pool.start(B, name="B")
        await b.ready()
        # An hour's nap, made due once A is retired (below): a short one raced the
        # retirement, and a busy machine let A resume it itself.
        sleeper = await client.submit("sleeper", {"seconds": 3600})
        await a.wait_for("run.parked", run_id=sleeper.run_id)
        # Held until A2 has booted (a 3 s step raced A2's boot: once it ended, the lane
        # was drained and A2, on a busy machine, refused to boot).
        gate = tmp_path / "gate"
        slow = await client.submit("slow", {"dir": str(tmp_path), "seconds": 0, "gate": str(gate)})
        await a.wait_for("run.started", run_id=slow.run_id)
        await client.retire_release(A)
        await a.wait_for("lane.draining")
        await wake_nap(database_url, QUEUE_A, sleeper.run_id)
        # An orchestrator restarts a crashed A machine mid-drain: it boots.
        a2 = pool.start(A, name="A2")
        assert (await a2.ready())["lane"] == "draining"
        fresh = await client.submit("plain", {"fresh": True})  # new work on a draining lane
        gate.touch()

        async def a_finished() -> bool:
            statuses = [(await client.status(r.run_id)).status for r in (slow, fresh)]
            return statuses == ["completed", "completed"]

        await eventually(a_finished, timeout_s=30, what="A's workers to finish slow and fresh")
        adopted = await b.wait_for("run.adopted", run_id=sleeper.run_id)
        assert adopted["queue"] == QUEUE_A
        await b.wait_for("run.completed", run_id=sleeper.run_id)
        await a.wait_for("lane.drained", timeout_s=15)
        by_queue = {lane.queue: lane for lane in await client.lanes()}
        assert by_queue[QUEUE_A].status == "drained"
        for run, release in ((slow, A_ID), (fresh, A_ID)):
            status = await client.status(run.run_id)
            assert {x.release_id for x in status.attempts} == {release}
        assert (await client.status(sleeper.run_id)).output == {"before": A_ID, "after": B_ID}

        a3 = pool.start(A, name="A3")
        assert await a3.wait_exit(timeout_s=60) == 78
        assert "drained" in a3.stderr
        assert "lanes activate" in a3.stderr
        for daemon in (a, a2, b):
            daemon.terminate()
        for daemon in (a, a2, b):
            assert await daemon.wait_exit(timeout_s=15) == 0
