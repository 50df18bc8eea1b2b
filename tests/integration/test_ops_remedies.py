"""Remedies for stranded work (worker/ops/remedies.py), on real Postgres with in-process workers.

`lanes move`, `runs fail`, `runs retry`, `runs`, step provenance in `status` and
`lanes prune`, each driven through ``LaneClient`` (the CLI is a thin shell over
it; the e2e suite runs the commands). Runs are put in known states with the
runtime harness (real claims, real plays), lanes registered in release order:
A first, then B, the newer release. The remedies must not hurt the runs they serve:
a run is retried once however many operators retry it, a retry receives the events
its run had, a signal racing `lanes move` wakes the run on its new lane, and what the
report names after a rollback or a prune is a remedy that works.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from support.db import age_worker, make_sleepers_due, run_row, sql
from support.plays import SHORT_NAP_S, RemedyPlays, narrow_app, remedies_app, two_lanes
from support.runtime import (
    SCHEMA,
    claim_one,
    claim_one_undecided,
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
from worker import lanes
from worker.client import LaneClient
from worker.daemon.maintenance import maintain, reconcile_lanes
from worker.db import engine
from worker.db.store.rows import MaintainedLane
from worker.errors import (
    InvalidRequestError,
    NoClaimingLaneError,
    RetryRefusedError,
    RunNotFoundError,
    RunStillOpenError,
    UnknownLaneError,
)
from worker.metrics import Metrics
from worker.ops.remedies import OPERATOR_FAILED, RetriedRun
from worker.run.claim import Capacity, LoopShared, Poller
from worker.run.execute import Runtime

A, B, C, D = "rel-a", "rel-b", "rel-c", "rel-d"
QA, QB, QC, QD = queue_of(A), queue_of(B), queue_of(C), queue_of(D)
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "5"}
ENV_B = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": B, "LANE_WORKER_MAX_ATTEMPTS": "5"}
STARTED_REASON = "its steps ran on that release's code"


@pytest.fixture
def plays(remedy_plays: RemedyPlays) -> RemedyPlays:
    """The remedies app's state (every test of this module stages its runs with it)."""
    return remedy_plays


# -- reading the database -----------------------------------------------------------------


async def task_state(database_url: str, queue: str, task_id: uuid.UUID) -> str | None:
    """Return the engine task's state on ``queue`` (None: no such task there)."""
    conn = await connect(database_url)
    try:
        return await engine.task_state(conn, queue, task_id)
    finally:
        await conn.close()


async def engine_tasks(database_url: str, queue: str) -> dict[uuid.UUID, str]:
    """Return every engine task of ``queue`` with its state."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(f"select task_id, state from absurd.t_{queue}")
    finally:
        await conn.close()
    return {row["task_id"]: row["state"] for row in rows}


async def engine_runs(database_url: str, queue: str) -> list[dict[str, Any]]:
    """Return every engine run of ``queue`` (state, due time, claim), ordered."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            f"select run_id, task_id, state, available_at, claimed_by, attempt"
            f" from absurd.r_{queue} order by run_id"
        )
    finally:
        await conn.close()
    return [dict(row) for row in rows]


async def run_facts(database_url: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Return a run's ledger facts as (type, fact), oldest first."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            f"select type, fact from {SCHEMA}.ledger where run_id = $1::uuid order by fact_id",
            run_id,
        )
    finally:
        await conn.close()
    return [(row["type"], row["fact"]) for row in rows]


async def checkpoints_of(database_url: str, queue: str, task_id: uuid.UUID) -> list[str]:
    """Return the names of the engine checkpoints a task committed on ``queue``."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            f"select checkpoint_name from absurd.c_{queue} where task_id = $1 order by 1", task_id
        )
    finally:
        await conn.close()
    return [row["checkpoint_name"] for row in rows]


async def engine_queue_exists(database_url: str, queue: str) -> bool:
    """Tell whether the engine has ``queue`` (listed, with its task table)."""
    listed = await sql(
        database_url, "select count(*) from absurd.queues where queue_name = $1", queue
    )
    table = await sql(database_url, "select to_regclass($1) is not null", f"absurd.t_{queue}")
    assert bool(listed) == table, (queue, listed, table)
    return bool(listed)


async def postpone(database_url: str, queue: str, run_id: str) -> None:
    """Move a run's sleeping or pending engine run an hour ahead (staging only the timer).

    A retry's 1 s backoff or a hand-back due now must not decide what a later
    claim in the test is handed.
    """
    moved = await sql(
        database_url,
        f"with moved as (update absurd.r_{queue} r set available_at = now() + interval '1 hour'"
        f" from {SCHEMA}.runs s where s.run_id = $1::uuid and r.task_id = s.task_id"
        " and r.state in ('sleeping', 'pending') returning 1) select count(*) from moved",
        run_id,
    )
    assert moved == 1, f"run {run_id} has no waiting engine run on {queue}"


def attempts_of(status: Any) -> list[tuple[str, str, str | None]]:
    """Return a status's attempts as (release, disposition, outcome)."""
    return [(a.release_id, a.disposition, a.outcome) for a in status.attempts]


async def hand_back(rt: Runtime, plays: RemedyPlays, name: str) -> None:
    """Hold run ``name`` mid-step, then cut it off as a drain does: the claim is handed back."""
    cut = await hold_in_flight(rt, plays, name)
    cut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut


# -- lanes move ------------------------------------------------------------------------------


async def test_moving_fresh_runs_stamps_b_and_b_runs_them_while_a_finds_nothing(
    database_url: str, plays: RemedyPlays
) -> None:
    """Runs that never started move to B: B's stamp, a task on B's queue, A's task cancelled."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        first = await client.submit("plain", {"n": 1})
        second = await client.submit("plain", {"n": 2})
        before = {r.run_id: await run_row(database_url, r.run_id) for r in (first, second)}
        old_tasks = {run_id: row["task_id"] for run_id, row in before.items()}
        for task_id in old_tasks.values():
            assert await task_state(database_url, QA, task_id) == "pending"

        report = await client.move_lane(A, B)

        assert (report.from_queue, report.to_queue, report.to_release_id) == (QA, QB, B)
        assert report.moved == (first.run_id, second.run_id)  # oldest first
        assert report.refused == ()
        b_tasks = await engine_tasks(database_url, QB)
        for run_id, old in before.items():
            row = await run_row(database_url, run_id)
            assert (row["release_id"], row["queue"], row["status"]) == (B, QB, "queued")
            assert row["launch"] == {**old["launch"], "absurdReleaseId": B}
            assert row["launch"]["runId"] == run_id
            assert row["task_id"] != old_tasks[run_id]
            assert b_tasks.get(row["task_id"]) == "pending"  # a new engine task on B
            assert await task_state(database_url, QA, old_tasks[run_id]) == "cancelled"
            assert (row["attempts"], row["current_attempt_id"]) == (0, None)
            status = await client.status(run_id)
            assert (status.release_id, status.queue, status.adopted_release_id) == (B, QB, None)
        assert len(b_tasks) == 2
        lane_a = (await client.lane(A)).as_json()
        assert lane_a["counts"]["fresh"] == 0
        assert (await client.lane(B)).as_json()["counts"]["fresh"] == 2

        assert await work_once(rt_a) == []  # nothing left on A's queue
        assert await work_once(rt_b) == ["completed", "completed"]
        for run in (first, second):
            status = await client.status(run.run_id)
            assert (status.status, status.output) == ("completed", B)
            assert attempts_of(status) == [(B, "own", "completed")]
            assert [(s.name, s.release_id) for s in status.steps] == [("step:s", B)]
    assert plays.by(A) == []
    assert sorted(plays.by(B)) == ["play", "play", "s", "s"]


async def test_started_runs_are_refused_with_the_reason_and_left_untouched(
    database_url: str, plays: RemedyPlays
) -> None:
    """Retrying, handed back, parked and in-flight runs stay on A; only the fresh one moves."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        flaky = await client.submit("flaky")
        napper = await client.submit("napper")
        waiter = await client.submit("waiter")
        assert sorted(await work_once(rt_a)) == ["parked", "parked", "retrying"]
        await postpone(database_url, QA, flaky.run_id)
        handed_back = await client.submit("gated", {"name": "handed-back"})
        await hand_back(rt_a, plays, "handed-back")
        await postpone(database_url, QA, handed_back.run_id)
        in_flight = await client.submit("gated", {"name": "in-flight"})
        held = await hold_in_flight(rt_a, plays, "in-flight")
        try:
            fresh = await client.submit("plain")
            fresh_task = (await run_row(database_url, fresh.run_id))["task_id"]
            started = {
                flaky.run_id: "retrying",
                napper.run_id: "waiting",
                waiter.run_id: "waiting",
                handed_back.run_id: "queued",
                in_flight.run_id: "running",
            }
            rows_before = {r: await run_row(database_url, r) for r in started}
            for run_id, status in started.items():
                assert rows_before[run_id]["status"] == status, run_id
            engine_before = await engine_runs(database_url, QA)

            report = await client.move_lane(A, B)

            assert report.moved == (fresh.run_id,)
            refused = dict(report.refused)
            assert list(refused) == [
                flaky.run_id,
                napper.run_id,
                waiter.run_id,
                handed_back.run_id,
                in_flight.run_id,
            ]  # oldest first, each once
            for run_id, status in started.items():
                reason = refused[run_id]
                assert f"started on {A} ({status}, 1 attempt(s))" in reason, reason
                assert STARTED_REASON in reason, reason
                assert "runs fail" in reason, reason
                assert "runs retry" in reason, reason
                assert await run_row(database_url, run_id) == rows_before[run_id]
            # Only the fresh run's engine task changed on A; B got exactly one task.
            engine_after = {r["run_id"]: r for r in await engine_runs(database_url, QA)}
            changed = [
                old["task_id"] for old in engine_before if engine_after[old["run_id"]] != old
            ]
            assert changed == [fresh_task]
            assert await task_state(database_url, QA, fresh_task) == "cancelled"
            assert len(await engine_tasks(database_url, QB)) == 1
            lane_a = (await client.lane(A)).as_json()
            assert lane_a["counts"]["fresh"] == 0
            assert lane_a["counts"]["inFlight"] == 1
            assert lane_a["counts"]["retrying"] == 1
            assert lane_a["counts"]["handedBack"] == 1

            # A moving again finds the same runs refused and nothing to move.
            again = await client.move_lane(A, B)
            assert (again.moved, dict(again.refused).keys()) == ((), refused.keys())
        finally:
            plays.gate("in-flight").set()
            handled = await held
        # The in-flight run went on on A, as if nothing had happened.
        assert (handled.disposition, handled.outcome) == ("own", "completed")
        went_on = await client.status(in_flight.run_id)
        assert (went_on.status, went_on.release_id, went_on.output) == ("completed", A, [A, A])
        assert await work_once(rt_b) == ["completed"]  # the moved fresh run, on B
    assert plays.by(B) == ["play", "s"]


async def test_a_run_the_lane_adopted_is_refused_too(database_url: str, plays: RemedyPlays) -> None:
    """`lanes move B --to C`: a run of A that B adopted (parked again on B) started: refused."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("nap-then-wait")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        set_policy(rt_a, draining=True)

        async def b_adopted() -> bool:
            return "parked" in await work_once(rt_b, QA)

        await eventually(b_adopted, what="B to adopt the run after its nap")
        await client.activate_release(C, force=True)
        before = await run_row(database_url, run.run_id)
        assert (before["status"], before["adopted_queue"], before["queue"]) == ("waiting", QB, QA)

        report = await client.move_lane(B, C)

        assert report.moved == ()
        assert [run_id for run_id, _ in report.refused] == [run.run_id]
        assert STARTED_REASON in report.refused[0][1]
        assert await run_row(database_url, run.run_id) == before
        assert await engine_tasks(database_url, QC) == {}


@pytest.mark.parametrize("target", ["retired", "unknown", "the same lane"])
async def test_a_move_only_goes_to_a_claiming_lane(
    database_url: str, plays: RemedyPlays, target: str
) -> None:
    """A retired, unregistered or identical target lane is refused; nothing moves."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        await client.activate_release(C, force=True)
        await client.retire_release(C)
        fresh = await client.submit("plain")
        before = await run_row(database_url, fresh.run_id)
        to, said = {
            "retired": (C, "is retired"),
            "unknown": ("rel-nowhere", "is not a registered lane"),
            "the same lane": (" REL-A ", "name one lane"),
        }[target]

        with pytest.raises(InvalidRequestError, match=said):
            await client.move_lane(A, to)

        assert await run_row(database_url, fresh.run_id) == before
        assert await task_state(database_url, QA, before["task_id"]) == "pending"
        for queue in (QB, QC):
            assert await engine_tasks(database_url, queue) == {}
        assert (
            await sql(
                database_url,
                "select count(*) from absurd.queues where queue_name = $1",
                "runs_rel_nowhere",
            )
            == 0
        )
        assert await work_once(rt_a) == ["completed"]  # still A's
    assert plays.by(A) == ["play", "s"]


async def waiting_for_a_lock(database_url: str) -> bool:
    """Tell whether some session of this test's database waits for a lock."""
    waiting = await sql(
        database_url,
        "select count(*) from pg_stat_activity"
        " where datname = current_database() and wait_event_type = 'Lock'",
    )
    return bool(waiting)


@pytest.mark.parametrize(
    "moment",
    ["after the claim", "between the lane read and the fence", "while A records its attempt"],
)
async def test_a_claim_of_the_old_task_executes_nothing_and_b_runs_the_moved_run_once(
    database_url: str, plays: RemedyPlays, moment: str
) -> None:
    """A claims a fresh run's task, the move lands, then A handles its claim: lease_lost, no work.

    ``after the claim``: the operator's move commits between A's claim and A's
    handling of it. ``between the lane read and the fence``: it commits after A
    read the run's lane state, just before A records its attempt. ``while A
    records its attempt``: the move holds the run's row (restamped, not yet
    committed) when A's attempt statement starts, and commits while it waits.
    """
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("plain")
        # Claimed without the store facts and the begun attempt: the own loop's
        # claim begins this run's attempt in its own statement (next test).
        claimed = await claim_one_undecided(rt_a, QA)
        moves: list[tuple[str, ...]] = []
        if moment == "after the claim":
            moves.append((await client.move_lane(A, B)).moved)
        elif moment == "between the lane read and the fence":
            begin = rt_a.attempts.begin

            async def move_then_begin(*args: Any, **kwargs: Any) -> Any:
                moves.append((await client.move_lane(A, B)).moved)
                return await begin(*args, **kwargs)

            rt_a.attempts.begin = move_then_begin  # type: ignore[method-assign]

        with capture_logs() as lines:
            if moment != "while A records its attempt":
                handled = await rt_a.handle(claimed)
            else:
                async with client.db.pool.acquire() as conn:
                    tx = conn.transaction()
                    await tx.start()
                    try:
                        # `lanes move`'s transaction for this run, up to its commit.
                        why = await client.remedies._move_one(
                            conn, run_id=uuid.UUID(run.run_id), from_queue=QA, to_queue=QB,
                            stamp=B,
                        )  # fmt: skip
                        assert why is None
                        handling = asyncio.create_task(rt_a.handle(claimed))
                        await eventually(
                            lambda: waiting_for_a_lock(database_url),
                            what="A's attempt to wait for the run's row",
                        )
                        assert not handling.done()
                    except BaseException:
                        await tx.rollback()
                        raise
                    await tx.commit()
                moves.append((run.run_id,))
                handled = await asyncio.wait_for(handling, 20)

        assert moves == [(run.run_id,)]
        assert plays.by(A) == []  # A executed nothing of the run
        moved = await client.status(run.run_id)
        assert (moved.status, moved.release_id, moved.queue) == ("queued", B, QB)
        assert await work_once(rt_a) == []
        assert await work_once(rt_b) == ["completed"]
        assert await work_once(rt_b) == []
        status = await client.status(run.run_id)
        assert (status.status, status.output, status.facts) == ("completed", B, ("run.completed",))
        assert plays.by(B) == ["play", "s"]  # exactly once
        # A's claim ended as a lost lease, recorded and logged as a move (not an orphan).
        events = [line["event"] for line in lines if line["event"].startswith("run.")]
        assert (handled.disposition, handled.outcome, events) == (
            "own",
            "lease_lost",
            ["run.moved_away"],
        )
        assert attempts_of(status) == [(A, "own", "lease_lost"), (B, "own", "completed")]
    assert plays.by(A) == []
    assert plays.by(B) == ["play", "s"]  # exactly once


async def test_the_own_loops_claim_begins_the_attempt_so_a_move_after_it_finds_it_running(
    database_url: str, plays: RemedyPlays
) -> None:
    """The own loop's claim records the attempt and moves the fence in its own statement.

    No window is left between A's claim and its fence for `lanes move` to slip
    into: the move finds the run running on A and refuses it, and A runs it once.
    """
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("plain")
        claimed = await claim_one(rt_a, QA)
        assert claimed.begun is not None
        report = await client.move_lane(A, B)
        handled = await rt_a.handle(claimed)
        assert await work_once(rt_b) == []
        status = await client.status(run.run_id)
    assert report.moved == ()
    assert [r for r, _ in report.refused] == [run.run_id]
    assert (handled.disposition, handled.outcome) == ("own", "completed")
    assert (status.status, status.release_id, status.facts) == ("completed", A, ("run.completed",))
    assert attempts_of(status) == [(A, "own", "completed")]
    assert plays.by(A) == ["play", "s"]  # exactly once
    assert plays.by(B) == []


# -- runs fail ------------------------------------------------------------------------------


async def assert_failed_by_operator(
    client: LaneClient, database_url: str, run_id: str, reason: str
) -> None:
    """Assert the run failed for good by the operator: one run.failed fact, its task cancelled."""
    status = await client.status(run_id)
    assert status.status == "failed"
    assert status.error == {"name": OPERATOR_FAILED, "message": reason, "fatal": True}
    assert status.facts == ("run.failed",)
    [(kind, fact)] = await run_facts(database_url, run_id)
    assert kind == "run.failed"
    assert (fact["source"], fact["runId"], fact["error"]["name"]) == (
        "operator",
        run_id,
        OPERATOR_FAILED,
    )
    row = await run_row(database_url, run_id)
    assert row["finished_at"] is not None
    assert await task_state(database_url, row["queue"], row["task_id"]) == "cancelled"


@pytest.mark.parametrize(
    "state", ["queued", "retrying", "parked in a sleep", "parked for an event"]
)
async def test_failing_a_run_that_is_not_running_ends_it_and_cancels_its_task(
    database_url: str, plays: RemedyPlays, state: str
) -> None:
    """`runs fail` on a queued, retrying or parked run: failed, one fact, nothing claims it."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        play = {"queued": "plain", "retrying": "flaky", "parked in a sleep": "napper",
                "parked for an event": "waiter"}[state]  # fmt: skip
        run = await client.submit(play)
        if state != "queued":
            assert await work_once(rt_a) == ["retrying" if play == "flaky" else "parked"]
        reason = f"stranded on {A} ({state}); retried on {B}"

        assert await client.fail_run(run.run_id, f"  {reason}\n") is True

        await assert_failed_by_operator(client, database_url, run.run_id, reason)
        if play == "waiter":
            said = await client.signal(run.run_id, "go", {"late": True})
            assert said.run_ended == "failed"
        await make_sleepers_due(database_url, QA)
        assert await work_once(rt_a) == []
        assert (await client.status(run.run_id)).status == "failed"
        # A second fail changes nothing: it had ended.
        assert await client.fail_run(run.run_id, "again") is False
        await assert_failed_by_operator(client, database_url, run.run_id, reason)
    effects = plays.by(A, run.run_id)
    assert effects == ([] if play != "napper" else ["first"])


async def test_failing_a_running_run_stops_its_attempt_at_the_next_step(
    database_url: str, plays: RemedyPlays
) -> None:
    """A run blocked in a step is failed: the step's result is never written, the attempt ends."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        run = await client.submit("gated", {"name": "busy"})
        held = await hold_in_flight(rt_a, plays, "busy")
        try:
            assert (await client.status(run.run_id)).status == "running"
            assert await client.fail_run(run.run_id, "stuck on a dead upstream") is True
            await assert_failed_by_operator(
                client, database_url, run.run_id, "stuck on a dead upstream"
            )
        finally:
            plays.gate("busy").set()  # the step's body ends; its result must not be stored
            handled = await asyncio.wait_for(held, 20)
        assert handled.outcome == "cancelled", handled
        row = await run_row(database_url, run.run_id)
        assert await checkpoints_of(database_url, QA, row["task_id"]) == []
        status = await client.status(run.run_id)
        assert status.steps == ()
        assert attempts_of(status) == [(A, "own", "cancelled")]
        finished = await sql(
            database_url,
            f"select bool_and(finished_at is not null) from {SCHEMA}.attempts"
            " where run_id = $1::uuid",
            run.run_id,
        )
        assert finished is True
        await assert_failed_by_operator(
            client, database_url, run.run_id, "stuck on a dead upstream"
        )
        assert await work_once(rt_a) == []
    # The held step's body ran to its end, but neither its result nor the next step followed.
    assert plays.by(A, run.run_id) == ["held"]


async def test_retry_waits_until_the_failed_run_s_attempt_has_stopped(
    database_url: str, plays: RemedyPlays
) -> None:
    """A failed run whose attempt is still inside a step on a live worker: retry is refused."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        run = await client.submit("gated", {"name": "busy"})
        held = await hold_in_flight(rt_a, plays, "busy")
        try:
            assert await client.fail_run(run.run_id, "operator gave up") is True
            # The engine task is cancelled (its claim cleared), but A's worker is live
            # and its attempt is still inside the step: the retry would overlap it.
            with pytest.raises(RunStillOpenError, match="may still be executing"):
                await client.retry_run(run.run_id)
        finally:
            plays.gate("busy").set()
            handled = await asyncio.wait_for(held, 20)
        assert handled.outcome == "cancelled", handled
        retried = await client.retry_run(run.run_id)
        new_id, release_id, _queue = retried.run_id, retried.release_id, retried.queue
        assert release_id == B
        assert (await client.status(new_id)).retry_of == run.run_id


async def test_failing_an_ended_run_writes_nothing(database_url: str, plays: RemedyPlays) -> None:
    """Completed and cancelled runs: fail returns False and changes neither row nor ledger."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        done = await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        cancelled = await client.submit("plain")
        assert await client.cancel(cancelled.run_id)
        for run in (done, cancelled):
            row = await run_row(database_url, run.run_id)
            facts = await run_facts(database_url, run.run_id)
            assert await client.fail_run(run.run_id, "too late") is False
            assert await run_row(database_url, run.run_id) == row
            assert await run_facts(database_url, run.run_id) == facts
        assert (await client.status(done.run_id)).facts == ("run.completed",)
        assert (await client.status(cancelled.run_id)).facts == ("run.cancelled",)

        with pytest.raises(RunNotFoundError):
            await client.fail_run(str(uuid.uuid4()), "no such run")
        with pytest.raises(RunNotFoundError):
            await client.fail_run("not-a-uuid", "no such run")
        for reason in ("", "   ", "x" * 2001, "nul\x00"):
            with pytest.raises(InvalidRequestError):
                await client.fail_run(done.run_id, reason)


# -- runs retry -----------------------------------------------------------------------------


async def test_retry_submits_the_same_play_and_input_on_the_newest_claiming_release(
    database_url: str, plays: RemedyPlays
) -> None:
    """An ended run is retried on B (the newest claiming lane), linked to the old run, and runs."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, rt_b),
        open_runtime(database_url, app, C) as rt_c,
    ):
        # C registers after B (a live worker, every play), then retires: the newest
        # *claiming* lane is B.
        await client.activate_release(C, force=True)
        await register_worker(rt_c)
        await client.retire_release(C)
        # A re-activated lane keeps its place: registration order, not the last change.
        await client.retire_release(A)
        await client.activate_release(A)
        params = {"name": "stuck", "nested": {"n": [1, 2.5, None, True]}}
        old = await client.submit("gated", params)
        held = await hold_in_flight(rt_a, plays, "stuck")

        with pytest.raises(RunStillOpenError, match="fail it"):
            await client.retry_run(old.run_id)
        assert len(await client.runs()) == 1

        assert await client.fail_run(old.run_id, "stranded")
        plays.gate("stuck").set()
        assert (await held).outcome == "cancelled"

        retried = await client.retry_run(old.run_id)
        new_id, release_id, queue = retried.run_id, retried.release_id, retried.queue

        assert (release_id, queue) == (B, QB)
        old_row = await run_row(database_url, old.run_id)
        new_row = await run_row(database_url, new_id)
        assert new_id != old.run_id
        assert (new_row["play"], new_row["input"]) == ("gated", params)
        assert new_row["input"] == old_row["input"]
        assert (new_row["release_id"], new_row["queue"], new_row["status"]) == (B, QB, "queued")
        assert new_row["retry_of"] == uuid.UUID(old.run_id)
        assert new_row["max_attempts"] == old_row["max_attempts"]
        assert new_row["launch"]["retryOf"] == old.run_id
        assert new_row["launch"]["absurdReleaseId"] == B
        assert new_row["launch"]["runId"] == new_id
        assert new_row["idempotency_key"] is None
        assert (await engine_tasks(database_url, QB)) == {new_row["task_id"]: "pending"}
        status = await client.status(new_id)
        assert (status.retry_of, status.as_json()["retryOf"]) == (old.run_id, old.run_id)
        assert (await client.status(old.run_id)).retry_of is None
        # The old run is untouched by its retry.
        assert await run_row(database_url, old.run_id) == old_row

        assert await work_once(rt_a) == []
        assert await work_once(rt_c) == []
        plays.gate("stuck").set()
        assert await work_once(rt_b) == ["completed"]
        status = await client.status(new_id)
        assert (status.status, status.output) == ("completed", [B, B])
        assert attempts_of(status) == [(B, "own", "completed")]
        # A retry of the retry goes to B again; each names the run it repeats.
        retried = await client.retry_run(new_id, completed=True)
        again, _, _ = retried.run_id, retried.release_id, retried.queue
        assert (await client.status(again)).retry_of == new_id
    assert plays.by(B, new_id) == ["held", "after"]


async def test_retry_is_refused_while_no_lane_claims(database_url: str, plays: RemedyPlays) -> None:
    """Every lane retired: retry raises NoClaimingLaneError and creates nothing; then it works."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, _rt_a, rt_b):
        old = await client.submit("plain", {"k": "v"})
        assert await client.fail_run(old.run_id, "stranded")
        await client.retire_release(A)
        await client.retire_release(B)

        with pytest.raises(NoClaimingLaneError):
            await client.retry_run(old.run_id)

        assert [r.run_id for r in await client.runs()] == [old.run_id]
        for queue in (QA, QB):
            assert len(await engine_tasks(database_url, queue)) == (1 if queue == QA else 0)
        await client.activate_release(B)
        retried = await client.retry_run(old.run_id)
        new_id, release_id, _ = retried.run_id, retried.release_id, retried.queue
        assert release_id == B
        assert await work_once(rt_b) == ["completed"]
        status = await client.status(new_id)
        assert (status.status, status.output, status.retry_of) == ("completed", B, old.run_id)
        with pytest.raises(RunNotFoundError):
            await client.retry_run(str(uuid.uuid4()))


# -- runs -----------------------------------------------------------------------------------


async def test_runs_lists_newest_first_filtered_by_status_lane_and_play(
    database_url: str, plays: RemedyPlays
) -> None:
    """`runs` filters: a lane lists its own runs and those it adopted; limit keeps the newest."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, rt_b),
        open_client(database_url, ENV_B) as client_b,
    ):
        done = await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        nap = await client.submit("napper", {"seconds": SHORT_NAP_S})
        waiting = await client.submit("waiter")
        assert sorted(await work_once(rt_a)) == ["parked", "parked"]
        failed = await client.submit("plain")
        assert await client.fail_run(failed.run_id, "by hand")
        await client.retire_release(A)
        set_policy(rt_a, draining=True)

        async def b_adopted() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_adopted, what="B to adopt the nap")
        fresh_b = await client_b.submit("plain")
        retried = await client.retry_run(failed.run_id)
        retried, _, _ = retried.run_id, retried.release_id, retried.queue

        def ids(found: list[Any]) -> list[str]:
            return [r.run_id for r in found]

        newest_first = [retried, fresh_b.run_id, failed.run_id, waiting.run_id, nap.run_id,
                        done.run_id]  # fmt: skip
        assert ids(await client.runs()) == newest_first
        assert ids(await client.runs(limit=2)) == newest_first[:2]
        assert ids(await client.runs(limit=1)) == newest_first[:1]
        assert ids(await client.runs(status="completed")) == [nap.run_id, done.run_id]
        assert ids(await client.runs(status="waiting")) == [waiting.run_id]
        assert ids(await client.runs(status="failed")) == [failed.run_id]
        assert ids(await client.runs(status="queued")) == [retried, fresh_b.run_id]
        assert ids(await client.runs(status="cancelled")) == []
        assert ids(await client.runs(lane=A)) == [
            failed.run_id, waiting.run_id, nap.run_id, done.run_id,
        ]  # fmt: skip
        # B's own runs and the one it adopted from A.
        assert ids(await client.runs(lane=B)) == [retried, fresh_b.run_id, nap.run_id]
        assert ids(await client.runs(lane=" REL-B ")) == [retried, fresh_b.run_id, nap.run_id]
        assert ids(await client.runs(lane=C)) == []
        assert ids(await client.runs(play="napper")) == [nap.run_id]
        assert ids(await client.runs(play="plain", lane=B)) == [retried, fresh_b.run_id]
        assert ids(await client.runs(play="plain", lane=A, status="completed")) == [done.run_id]
        assert ids(await client.runs(play="no-such-play")) == []

        by_id = {r.run_id: r for r in await client.runs()}
        adopted = by_id[nap.run_id]
        assert (adopted.release_id, adopted.queue, adopted.adopted_release_id) == (A, QA, B)
        assert (adopted.status, adopted.play, adopted.retry_of) == ("completed", "napper", None)
        assert by_id[retried].retry_of == failed.run_id
        assert (by_id[retried].release_id, by_id[retried].queue) == (B, QB)
        assert by_id[fresh_b.run_id].attempts == 0
        assert by_id[done.run_id].attempts == 1
        assert by_id[done.run_id].as_json() == {
            "runId": done.run_id,
            "play": "plain",
            "status": "completed",
            "releaseId": A,
            "queue": QA,
            "adoptedReleaseId": None,
            "attempts": 1,
            "createdAt": by_id[done.run_id].created_at.isoformat(),
            "retryOf": None,
        }
        created = [r.created_at for r in await client.runs()]
        assert created == sorted(created, reverse=True)

        for bad in ({"status": "running-ish"}, {"limit": 0}, {"limit": 10_001}):
            with pytest.raises(InvalidRequestError):
                await client.runs(**bad)


# -- provenance -----------------------------------------------------------------------------


async def test_each_step_names_the_release_and_attempt_that_committed_it(
    database_url: str, plays: RemedyPlays
) -> None:
    """A step on A, a hand-back, a step on another A worker, a nap, B adopts: each step's writer."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, rt_b),
        open_runtime(database_url, app, A, worker_base="test-rel-a-2") as rt_a2,
    ):
        run = await client.submit("journey", {"name": "journey"})
        await hand_back(rt_a, plays, "journey")  # `first` committed, `held` cut off
        status = await client.status(run.run_id)
        assert [(s.name, s.release_id, s.worker_id) for s in status.steps] == [
            ("step:first", A, "test-rel-a"),
        ]
        plays.gate("journey").set()
        assert await work_once(rt_a2) == ["parked"]
        await client.retire_release(A)
        set_policy(rt_a, draining=True)
        set_policy(rt_a2, draining=True)

        async def b_adopted() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_adopted, what="B to adopt the journey after its nap")
        status = await client.status(run.run_id)

    b_worker = lanes.continuation_worker_id("test-rel-b", QA)
    assert (status.status, status.output) == ("completed", [A, A, B])
    assert [(a.release_id, a.worker_id, a.disposition, a.outcome) for a in status.attempts] == [
        (A, "test-rel-a", "own", "handed_back"),
        (A, "test-rel-a-2", "own", "parked"),
        (B, b_worker, "adopt", "completed"),
    ]
    steps = [(s.name, s.release_id, s.worker_id) for s in status.steps]
    # The finished nap is listed too, by the release that resumed the run after it; its
    # time is the worker's reading of the database clock, so only the steps' order is held.
    assert [s for s in steps if not s[0].startswith("sleep:")] == [
        ("step:first", A, "test-rel-a"),
        ("step:held", A, "test-rel-a-2"),
        ("step:second", B, b_worker),
    ]
    assert ("sleep:nap", B, b_worker) in steps
    attempt_numbers = {a.worker_id: a.attempt for a in status.attempts}
    assert [s.attempt for s in status.steps] == [
        attempt_numbers[str(s.worker_id)] for s in status.steps
    ]
    times = [s.committed_at for s in status.steps]
    assert times == sorted(times)
    shown = status.as_json()
    assert shown["steps"] == [
        {
            "name": s.name,
            "releaseId": s.release_id,
            "attempt": s.attempt,
            "workerId": s.worker_id,
            "committedAt": s.committed_at.isoformat(),
        }
        for s in status.steps
    ]
    assert [(a["releaseId"], a["disposition"]) for a in shown["claims"]] == [
        (A, "own"),
        (A, "own"),
        (B, "adopt"),
    ]
    assert plays.by(A, run.run_id) == ["first", "held"]
    assert plays.by(B, run.run_id) == ["second"]


async def test_a_run_adopted_after_a_sleep_shows_its_steps_on_a_and_on_b(
    database_url: str, plays: RemedyPlays
) -> None:
    """The first step commits on A; B adopts the run after its nap and commits the rest."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("napper", {"seconds": SHORT_NAP_S})
        unclaimed = await client.status(run.run_id)
        assert (unclaimed.steps, unclaimed.as_json()["steps"]) == ((), [])
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        set_policy(rt_a, draining=True)

        async def b_adopted() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_adopted, what="B to adopt the nap")
        status = await client.status(run.run_id)
    shown = status.as_json()
    steps = [(s["name"], s["releaseId"]) for s in shown["steps"]]
    assert [s for s in steps if not s[0].startswith("sleep:")] == [
        ("step:first", A),
        ("step:second", B),
    ]
    assert ("sleep:nap", B) in steps  # ended by B, which resumed the run after it
    assert [(a["releaseId"], a["disposition"], a["outcome"]) for a in shown["claims"]] == [
        (A, "own", "parked"),
        (B, "adopt", "completed"),
    ]
    assert shown["adoptedReleaseId"] == B
    assert status.output == [A, B]


# -- lanes prune ----------------------------------------------------------------------------


async def backdate_retirement(database_url: str, queue: str, seconds: float) -> None:
    """Make a lane look retired ``seconds`` ago."""
    await sql(
        database_url,
        f"update {SCHEMA}.releases set retired_at = now() - make_interval(secs => $2::float8)"
        " where queue = $1",
        queue,
        seconds,
    )


async def pruned_at(database_url: str, queue: str) -> Any:
    """Return a lane row's pruned_at (the row must exist)."""
    conn = await connect(database_url)
    try:
        row = await conn.fetchrow(
            f"select pruned_at from {SCHEMA}.releases where queue = $1", queue
        )
    finally:
        await conn.close()
    assert row is not None, queue
    return row["pruned_at"]


async def machines_stopped(database_url: str, *runtimes: Runtime) -> None:
    """Mark the workers of ``runtimes`` stopped (their machines went away): prune may drop."""
    for rt in runtimes:
        await sql(
            database_url,
            f"update {SCHEMA}.workers set stopped_at = now() where worker_id = $1",
            rt.worker_base,
        )


async def queue_failures(client: LaneClient) -> list[Any]:
    """Run one maintenance pass; return its maintenance.queue_failed lines."""
    with capture_logs() as lines:
        assert await maintain(client.db, client.store, worker_id="test")
    return [line for line in lines if line["event"] == "maintenance.queue_failed"]


async def test_prune_drops_only_old_drained_lanes_keeping_their_history(
    database_url: str, plays: RemedyPlays
) -> None:
    """Retired long ago with only ended runs: pruned. Open work, claiming or recent: kept."""
    app = remedies_app(plays)
    env_c = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": C}
    env_d = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": D}
    async with (
        two_lanes(database_url, app) as (client, rt_a, rt_b),
        open_client(database_url, env_c) as client_c,
        open_client(database_url, env_d) as client_d,
        open_runtime(database_url, app, C) as rt_c,
    ):
        await client.activate_release(C, force=True)
        await client.activate_release(D, force=True)
        done = await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        gone = await client.submit("plain")
        assert await client.cancel(gone.run_id)
        done_c = await client_c.submit("plain")
        assert await work_once(rt_c) == ["completed"]
        open_d = await client_d.submit("plain")
        await client_b_done(database_url, rt_b)
        for release in (A, C, D):
            await client.retire_release(release)
        for queue in (QA, QD):
            await backdate_retirement(database_url, queue, 7200)
        before = await client.status(done.run_id)
        assert [(s.name, s.release_id) for s in before.steps] == [("step:s", A)]
        lanes_before = [v.queue for v in await client.lanes()]
        assert lanes_before == [QA, QB, QC, QD]

        await machines_stopped(database_url, rt_a)
        # --dry-run lists what would go and drops nothing.
        assert await client.prune_lanes(3600, dry_run=True) == [QA]
        assert await engine_queue_exists(database_url, QA)
        assert await pruned_at(database_url, QA) is None
        assert [v.queue for v in await client.lanes()] == lanes_before

        assert await client.prune_lanes(3600) == [QA]

        assert not await engine_queue_exists(database_url, QA)
        assert await pruned_at(database_url, QA) is not None
        for queue in (QB, QC, QD):  # claiming, too recent, an open run
            assert await engine_queue_exists(database_url, queue), queue
            assert await pruned_at(database_url, queue) is None
        lane_row = await sql(
            database_url, f"select status from {SCHEMA}.releases where queue = $1", QA
        )
        assert lane_row == "retired"  # the lane row stays
        # The runs stay, and status still reads them.
        after = await client.status(done.run_id)
        assert (after.status, after.output, after.release_id, after.queue) == (
            "completed", A, A, QA,
        )  # fmt: skip
        assert attempts_of(after) == attempts_of(before)
        assert after.facts == before.facts
        assert (await client.status(gone.run_id)).status == "cancelled"
        assert [r.run_id for r in await client.runs(lane=A)] == [gone.run_id, done.run_id]
        assert [v.queue for v in await client.lanes()] == [QB, QC, QD]
        assert await queue_failures(client) == []
        # Pruned once: the next prune has nothing of A to do.
        assert await client.prune_lanes(3600) == []

        # The threshold decides: C (retired just now) goes with 0 s, D never while open.
        assert await client.prune_lanes(0, dry_run=True) == [QC]
        assert await client.prune_lanes(0) == [QC]
        assert await client.fail_run(open_d.run_id, "never ran")
        assert await client.prune_lanes(0) == [QD]
        assert not await engine_queue_exists(database_url, QD)
        assert (await client.status(done_c.run_id)).status == "completed"
        assert [v.queue for v in await client.lanes()] == [QB]
        assert await queue_failures(client) == []

        with pytest.raises(InvalidRequestError):
            await client.prune_lanes(-1)


async def client_b_done(database_url: str, rt_b: Runtime) -> None:
    """Give claiming lane B an ended run of its own (B is never pruned, history or not)."""
    async with open_client(database_url, ENV_B) as client_b:
        run = await client_b.submit("plain")
        assert await work_once(rt_b) == ["completed"]
        assert (await client_b.status(run.run_id)).status == "completed"


async def test_activating_a_pruned_lane_recreates_its_queue(
    database_url: str, plays: RemedyPlays
) -> None:
    """`lanes activate` on a pruned lane: its queue exists again, it is reported and runs work."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        done = await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        await client.status(done.run_id)  # a prepared status read from before the prune
        await client.retire_release(A)
        await machines_stopped(database_url, rt_a)
        assert await client.prune_lanes(0) == [QA]
        assert QA not in [v.queue for v in await client.lanes()]
        assert (await client.status(done.run_id)).status == "completed"

        await client.activate_release(A)

        assert await engine_queue_exists(database_url, QA)
        assert await pruned_at(database_url, QA) is None
        lane_a = await client.lane(A)
        assert (lane_a.queue, lane_a.status) == (QA, "claiming")
        assert [v.queue for v in await client.lanes()] == [QA, QB]
        assert (await client.status(done.run_id)).status == "completed"
        again = await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        assert (await client.status(again.run_id)).output == A
        assert await queue_failures(client) == []
        # Retired again, it is prunable again (retired_at restarts).
        await client.retire_release(A)
        assert await client.prune_lanes(0) == [QA]
        assert not await engine_queue_exists(database_url, QA)


async def test_a_lane_holding_an_open_adopted_run_is_not_pruned(
    database_url: str, plays: RemedyPlays
) -> None:
    """An open run of A that B adopted still rides A's engine queue: A is not pruned."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("waiter")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        set_policy(rt_a, draining=True)
        lane_a = await client.lane(A)
        assert lane_a.status == "drained"  # nothing left that only A may run
        await machines_stopped(database_url, rt_a)
        assert await client.prune_lanes(0) == []
        assert (await client.signal(run.run_id, "go")).delivered

        async def b_finished() -> bool:
            return "completed" in await work_once(rt_b, QA)

        await eventually(b_finished, what="B to adopt the signalled run")
        assert (await client.status(run.run_id)).adopted_release_id == B
        assert await client.prune_lanes(0) == [QA]
        status = await client.status(run.run_id)
        assert (status.status, status.output) == ("completed", B)


# -- runs retry: once per run --------------------------------------------------------------


async def test_concurrent_retries_of_one_run_make_one_retry(
    database_url: str, plays: RemedyPlays
) -> None:
    """Five operators retry one failed run at once: one retry exists, all five name it."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, _rt_a, rt_b):
        old = await client.submit("plain", {"k": 1})
        assert await client.fail_run(old.run_id, "stranded")
        clients = [await _client(database_url) for _ in range(5)]
        try:
            results = await asyncio.gather(*(c.retry_run(old.run_id) for c in clients))
        finally:
            for c in clients:
                await c.close()
        assert all(isinstance(r, RetriedRun) for r in results)
        assert len({r.run_id for r in results}) == 1, results
        assert sorted(r.created for r in results) == [False] * 4 + [True]
        retries = await sql(
            database_url,
            f"select count(*) from {SCHEMA}.runs where retry_of = $1::uuid",
            old.run_id,
        )
        assert retries == 1
        assert await work_once(rt_b) == ["completed"]
        # Asked again later (a script run twice): the same retry, nothing new.
        again = await client.retry_run(old.run_id)
        assert (again.run_id, again.created) == (results[0].run_id, False)
        assert await work_once(rt_b) == []
    assert plays.by(B) == ["play", "s"]  # the work ran once


async def test_a_completed_run_is_retried_only_when_asked_for(
    database_url: str, plays: RemedyPlays
) -> None:
    """Retrying a completed run needs ``completed=True``; refused, it writes nothing."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        done = await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        with pytest.raises(RetryRefusedError, match="--completed"):
            await client.retry_run(done.run_id)
        assert (await run_row(database_url, done.run_id))["retried_by"] is None
        retried = await client.retry_run(done.run_id, completed=True)
        assert retried.created
        assert (await client.status(retried.run_id)).retry_of == done.run_id


async def _client(database_url: str) -> LaneClient:
    """A client of its own (its own pool): concurrent operators."""
    client = await LaneClient.connect(database_url, env=dict(ENV_A))
    await client.ensure_schemas()
    return client


# -- events across runs fail + runs retry ---------------------------------------------------


async def test_a_retry_receives_the_events_its_run_had_received(
    database_url: str, plays: RemedyPlays
) -> None:
    """Signalled while parked, failed before it resumed: the retry resumes without a new signal."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("waiter")
        assert await work_once(rt_a) == ["parked"]
        assert (await client.signal(run.run_id, "go", {"ok": 1})).delivered
        assert await client.fail_run(run.run_id, "stranded")
        retried = await client.retry_run(run.run_id, to_release=B)
        assert await work_once(rt_b) == ["completed"]  # no park: the event was there
        assert (await client.status(retried.run_id)).status == "completed"


async def test_a_signal_to_a_failed_run_is_kept_and_one_to_a_retried_run_reaches_the_retry(
    database_url: str, plays: RemedyPlays
) -> None:
    """Between fail and retry a signal is kept for the retry; after, it is the retry's."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        first = await client.submit("waiter")
        second = await client.submit("waiter", {"n": 2})
        assert await work_once(rt_a) == ["parked", "parked"]
        for run in (first, second):
            assert await client.fail_run(run.run_id, "stranded")

        kept = await client.signal(first.run_id, "go")
        assert (kept.kept_for_retry, kept.run_ended, kept.delivered) == (True, "failed", False)
        again = await client.signal(first.run_id, "go", {"second": True})  # first wins
        assert (again.duplicate, again.kept_for_retry, again.run_ended) == (True, False, "failed")
        retry_1 = await client.retry_run(first.run_id, to_release=B)
        retry_2 = await client.retry_run(second.run_id, to_release=B)
        # retry_1 had its event; retry_2 waits for "go".
        assert await work_once(rt_b) == ["completed", "parked"]

        # The app still knows only the first id: the event is for the retry.
        sent = await client.signal(second.run_id, "go", {"late": True})
        assert (sent.delivered, sent.delivered_to, sent.run_id) == (
            True, retry_2.run_id, second.run_id,
        )  # fmt: skip
        assert await work_once(rt_b) == ["completed"]
        assert (await client.status(retry_2.run_id)).status == "completed"
        assert (await client.status(retry_1.run_id)).status == "completed"
        again = await client.signal(second.run_id, "go")
        assert (again.duplicate, again.delivered_to) == (False, None)  # the retry ended
        assert again.run_ended == "completed"


# -- a signal racing lanes move -------------------------------------------------------------


async def test_a_signal_racing_a_move_wakes_the_run_on_its_new_lane(
    database_url: str, plays: RemedyPlays
) -> None:
    """A signal that starts while a move holds the run emits on the lane the move chose."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, _rt_a, _rt_b):
        run = await client.submit("waiter")
        await client.retire_release(A)
        mover = await connect(database_url)
        try:
            tx = mover.transaction()
            await tx.start()
            # `lanes move`'s own unit of work, held open at its commit.
            assert await client.remedies._move_one(mover, uuid.UUID(run.run_id), QA, QB, B) is None
            signal = asyncio.create_task(client.signal(run.run_id, "go", {"n": 1}))
            await eventually(lambda: _waits_on_lock(database_url), what="the signal to wait")
            await tx.commit()
            result = await asyncio.wait_for(signal, 20)
        finally:
            await mover.close()
        assert result.delivered
        events = {
            q: await sql(database_url, f"select count(*) from absurd.e_{q}") for q in (QA, QB)
        }
        assert events == {QA: 0, QB: 1}
        assert (await run_row(database_url, run.run_id))["queue"] == QB


async def _waits_on_lock(database_url: str) -> bool:
    waiting = await sql(
        database_url,
        "select count(*) from pg_stat_activity"
        " where wait_event_type = 'Lock' and datname = current_database()",
    )
    return bool(waiting)


# -- the report after a rollback, and after prune --------------------------------------------


async def test_a_rollback_strands_an_adopted_parked_run_and_the_blocker_says_why(
    database_url: str, plays: RemedyPlays
) -> None:
    """B adopted A's run, then A activated, B retired, C boots: the blocker names A's claim."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, rt_b),
        open_runtime(database_url, app, C) as rt_c,
    ):
        await client.activate_release(C, force=True)
        await register_worker(rt_c)
        run = await client.submit("nap-then-wait")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        set_policy(rt_a, draining=True)
        await make_sleepers_due(database_url, QA)
        assert await work_once(rt_b, QA) == ["parked"]  # adopted, now waiting for "go"
        assert (await run_row(database_url, run.run_id))["adopted_queue"] == QB

        await client.activate_release(A)  # the rollback
        await client.retire_release(B)
        lane_b = await client.lane(B)
        assert lane_b.status == "draining"
        [blocker] = lane_b.blocked_by
        assert (blocker.reason, blocker.count, blocker.run_ids) == (
            "parkedNotAdoptable", 1, (run.run_id,),
        )  # fmt: skip
        assert "claims again" in blocker.remedy, blocker.remedy
        assert A in blocker.remedy
        assert "no live worker of a newer claiming release" not in blocker.remedy
        # The remedy it names works: fail it and retry it on C.
        assert await client.fail_run(run.run_id, "stranded by the rollback")
        retried = await client.retry_run(run.run_id, to_release=C)
        assert retried.queue == QC
        assert (await client.lane(B)).status == "drained"


async def test_after_a_rollback_the_adopter_s_draining_workers_resume_its_runs(
    database_url: str, plays: RemedyPlays
) -> None:
    """The rollback remedy's other way: keep B's machines running, and B resumes the run."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("nap-then-wait")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        set_policy(rt_a, draining=True)
        await make_sleepers_due(database_url, QA)
        assert await work_once(rt_b, QA) == ["parked"]  # adopted, parked again
        await client.activate_release(A)  # the rollback
        await client.retire_release(B)
        set_policy(rt_a, draining=False)
        set_policy(rt_b, draining=True)
        [blocker] = (await client.lane(B)).blocked_by
        assert "keep rel-b's machines running" in blocker.remedy, blocker.remedy
        assert "lanes activate rel-b" not in blocker.remedy

        assert (await client.signal(run.run_id, "go", {"ok": True})).delivered
        seen: list[str] = []

        async def resumed_by_b() -> bool:
            await make_sleepers_due(database_url, QA)
            # A, claiming its own queue again, leaves the run to its adopter.
            assert set(await work_once(rt_a)) <= {"deferred"}
            seen.extend(await work_once(rt_b, QA))
            return "completed" in seen

        await eventually(resumed_by_b, what="B's draining worker to finish the run")
        assert set(seen) <= {"parked", "completed"}, seen
        assert (await client.lane(B)).status == "drained"


async def test_a_pruned_lane_is_drained_safe_to_stop_and_marked_pruned(
    database_url: str, plays: RemedyPlays
) -> None:
    """After `lanes prune`, `lanes show` and `lanes wait` still find the lane: drained."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        await client.retire_release(A)
        assert (await client.lane(A)).status == "drained"
        # Its machine still runs: its loops poll the queue, so it is kept.
        assert await client.prune_lanes(0) == []
        assert await client.prune_kept_live(0) == [QA]
        assert (await client.lane(A)).pruned is False
        await age_worker(database_url, rt_a.worker_base)  # its machine stopped
        assert await client.prune_kept_live(0) == []
        assert await client.prune_lanes(0) == [QA]
        view = await client.lane(A)
        assert (view.status, view.safe_to_stop, view.pruned) == ("drained", True, True)
        assert view.as_json()["pruned"] is True
        assert QA not in [v.queue for v in await client.lanes()]  # the list stays short
        with pytest.raises(UnknownLaneError):
            await client.lane("rel-never")
        # Work arrives on it again: its queue is made again, and it is no longer pruned.
        await client.submit("plain")
        view = await client.lane(A)
        assert (view.status, view.pruned) == ("draining", False)
        assert QA in [v.queue for v in await client.lanes()]


async def test_a_continuation_loop_on_a_pruned_queue_detaches_and_maintenance_skips_it(
    database_url: str, plays: RemedyPlays
) -> None:
    """A prune racing B's continuation loop and maintenance: no claim error, no queue failure.

    The loop was attached while A drained; `lanes prune` drops A's queue before B
    re-reads the registry. Its next claim meets no table: it detaches quietly.
    """
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        await client.submit("plain")
        assert await work_once(rt_a) == ["completed"]
        await client.retire_release(A)
        await age_worker(database_url, rt_a.worker_base)
        assert await client.prune_lanes(0) == [QA]
        metrics = Metrics()
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as runs:
                shared = LoopShared(Capacity(1), 0.05, metrics, runs, lambda _: None)
                poller = Poller(rt_b, QA, asyncio.Event(), shared)
                with anyio.fail_after(10):
                    await poller.run()
            # Maintenance read the registry just before the prune, then reconciles A.
            lane_a = MaintainedLane(QA, "retired", [A], engine_queue=True)
            await reconcile_lanes(rt_b.db, rt_b.store, [lane_a], worker_id="t", metrics=metrics)
        assert poller.detach_reason == "queue dropped"
        assert metrics.loop_errors.labels("continuation")._value.get() == 0
        assert metrics.maintenance_errors.labels(queue=QA)._value.get() == 0
        assert [
            e for e in logs if e["event"] in ("loop.claim_failed", "maintenance.queue_failed")
        ] == []


# -- what the remedies name for a draining lane -----------------------------------------------


async def test_a_draining_lane_s_remedy_names_a_play_no_live_machine_registers(
    database_url: str, plays: RemedyPlays
) -> None:
    """Fresh runs of a play only a stopped machine had: the remedy says so, never "will run"."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, narrow_app(), A, worker_base="test-rel-a-narrow") as narrow,
    ):
        await register_worker(narrow)
        await age_worker(database_url, rt_a.worker_base)  # the full machine stopped
        await client.submit("plain")
        await client.submit("other")
        await client.retire_release(A, force=True)
        view = await client.lane(A)
        assert view.status == "draining"
        (fresh,) = [b for b in view.blocked_by if b.reason == "fresh"]
        assert "runs of play plain: no live worker of rel-a registers it" in fresh.remedy
        assert "(they register: other)" in fresh.remedy
        assert "lanes move rel-a --to RELEASE" in fresh.remedy
        assert "the others: rel-a's 1 live worker(s) will run them" in fresh.remedy


async def test_a_lane_only_runs_named_is_drained_once_its_runs_moved_away(
    database_url: str, plays: RemedyPlays
) -> None:
    """No machine of X ever booted; its runs moved to B: `lanes show X` says drained."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, _rt_a, rt_b),
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-x"}) as client_x,
    ):
        run = await client_x.submit("plain")
        assert (await client.lane("rel-x")).status == "unregistered"
        report = await client.move_lane("rel-x", B)
        assert report.moved == (run.run_id,)
        view = await client.lane("rel-x")
        assert (view.release_id, view.queue, view.status) == ("rel-x", queue_of("rel-x"), "drained")
        assert view.safe_to_stop
        assert view.counts["fresh"] == 0
        assert await work_once(rt_b) == ["completed"]
        with pytest.raises(UnknownLaneError):
            await client.lane("rel-never")
