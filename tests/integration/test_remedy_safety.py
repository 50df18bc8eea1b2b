"""The remedies and the report must not hurt the runs they serve (run safety, round 3).

Each test pins one defect a review reproduced against real daemons: a run
retried twice, events lost across `runs fail` + `runs retry`, a signal racing
`lanes move`, a rollback whose blocker named the wrong cause, a pruned lane
unknown to `lanes show`, attempts left open after a takeover, and an own loop
failing a run whose play another machine of its lane has. In process, with
real claims on a real Postgres; the e2e suite repeats the cross-process ones
with real daemons.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import structlog
from test_remedies import (
    ENV_A,
    QA,
    QB,
    Plays,
    claim_one,
    hold_in_flight,
    make_sleepers_due,
    plays,
    remedies_app,
    run_row,
    sql,
    two_lanes,
)

from support.runtime import (
    SCHEMA,
    connect,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    work_once,
)
from worker import App, TaskContext
from worker.client import LaneClient
from worker.daemon.maintenance import maintain, reconcile_lanes
from worker.db.store.rows import MaintainedLane
from worker.errors import RetryRefusedError, RunStillOpenError, UnknownLaneError
from worker.metrics import Metrics
from worker.ops.remedies import RetriedRun
from worker.run.claim import Capacity, LoopShared, Poller
from worker.run.execute import Runtime

__all__ = ["plays"]  # the fixture, imported for this module's tests

A, B, C = "rel-a", "rel-b", "rel-c"
QC = queue_of(C)


async def attempt_rows(database_url: str, run_id: str) -> list[dict[str, Any]]:
    """Return a run's attempt rows, oldest first."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            f"select attempt_id, worker_id, disposition, outcome, error, finished_at"
            f" from {SCHEMA}.attempts where run_id = $1::uuid order by attempt_id",
            run_id,
        )
    finally:
        await conn.close()
    return [dict(r) for r in rows]


async def age_worker(database_url: str, worker_id: str) -> None:
    """Make a worker's heartbeat two minutes old: it reads as gone (killed)."""
    await sql(
        database_url,
        f"update {SCHEMA}.workers set heartbeat_at = now() - interval '2 minutes'"
        " where worker_id = $1",
        worker_id,
    )


# -- runs retry: once per run ---------------------------------------------------------------


async def test_concurrent_retries_of_one_run_make_one_retry(
    database_url: str, plays: Plays
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
    database_url: str, plays: Plays
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
    database_url: str, plays: Plays
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
    database_url: str, plays: Plays
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
    database_url: str, plays: Plays
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
    database_url: str, plays: Plays
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
        rt_a.draining = True
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
    database_url: str, plays: Plays
) -> None:
    """The rollback remedy's other way: keep B's machines running, and B resumes the run."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, rt_b):
        run = await client.submit("nap-then-wait")
        assert await work_once(rt_a) == ["parked"]
        await client.retire_release(A)
        rt_a.draining = True
        await make_sleepers_due(database_url, QA)
        assert await work_once(rt_b, QA) == ["parked"]  # adopted, parked again
        await client.activate_release(A)  # the rollback
        await client.retire_release(B)
        rt_a.draining = False
        rt_b.draining = True
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
    database_url: str, plays: Plays
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
    database_url: str, plays: Plays
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


# -- attempts closed once the run moved on ----------------------------------------------------


async def test_a_takeover_closes_the_older_attempt_at_once(database_url: str, plays: Plays) -> None:
    """A worker stalls past its lease (as a killed one would); the next claim closes its attempt."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, app, A, worker_base="test-rel-a-2") as rt_a2,
    ):
        run = await client.submit("gated", {"name": "stuck"})
        stuck = await hold_in_flight(rt_a, plays, "stuck")
        try:
            # Its lease runs out: the engine fails that attempt and schedules a retry.
            await sql(
                database_url, f"update absurd.r_{QA} set claim_expires_at = now() - interval '1 s'"
                " where state = 'running'",
            )  # fmt: skip
            await rt_a2.claim(QA, 5)  # sweeps the expired lease
            await make_sleepers_due(database_url, QA)
            plays.entered.pop("stuck")
            taker = asyncio.create_task(rt_a2.handle(await claim_one(rt_a2, QA)))
            await asyncio.wait_for(plays.entered_event("stuck").wait(), 20)
            rows = await attempt_rows(database_url, run.run_id)
            assert [(r["worker_id"], r["outcome"]) for r in rows] == [
                ("test-rel-a", "lease_lost"), ("test-rel-a-2", None),
            ]  # fmt: skip
            assert rows[0]["finished_at"] is not None
            assert rows[0]["error"] == {"reason": "a newer attempt took the run over"}
        finally:
            plays.gate("stuck").set()
        assert (await asyncio.wait_for(taker, 20)).outcome == "completed"
        await asyncio.wait_for(stuck, 20)
        assert all(r["outcome"] for r in await attempt_rows(database_url, run.run_id))


async def test_an_ended_run_closes_a_dead_worker_s_attempt_and_maintenance_the_rest(
    database_url: str, plays: Plays
) -> None:
    """Cancelled with a dead worker's attempt open: closed in the cancel; a live one is left."""
    app = remedies_app(plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        dead = await client.submit("gated", {"name": "dead"})
        held = await hold_in_flight(rt_a, plays, "dead")
        try:
            await age_worker(database_url, rt_a.worker_base)  # as if SIGKILLed
            assert await client.cancel(dead.run_id)
            [row] = await attempt_rows(database_url, dead.run_id)
            assert (row["outcome"], row["error"]) == (
                "lease_lost", {"reason": "the run ended without this attempt"},
            )  # fmt: skip
        finally:
            plays.gate("dead").set()
        await asyncio.wait_for(held, 20)

        # A live worker's attempt stays open through the cancel (it may be in a step) ...
        await register_worker(rt_a, "test-rel-a-live")
        async with open_runtime(database_url, app, A, worker_base="test-rel-a-live") as live_rt:
            alive = await client.submit("gated", {"name": "alive"})
            held = await hold_in_flight(live_rt, plays, "alive")
            try:
                assert await client.fail_run(alive.run_id, "by hand")
                [row] = await attempt_rows(database_url, alive.run_id)
                assert row["outcome"] is None
                # ... until its worker dies; the maintenance pass closes it then.
                await age_worker(database_url, "test-rel-a-live")
                assert await maintain(live_rt.db, live_rt.store, worker_id="test-maint")
                [row] = await attempt_rows(database_url, alive.run_id)
                assert (row["outcome"], row["error"]) == (
                    "lease_lost", {"reason": "its worker stopped without recording its end"},
                )  # fmt: skip
            finally:
                plays.gate("alive").set()
            await asyncio.wait_for(held, 20)


# -- a play another machine of the lane has ---------------------------------------------------


def _narrow_app() -> App:
    """An app of release A without the remedies app's plays (a machine of another build)."""
    app = App()

    @app.play("other")
    async def other(ctx: TaskContext, params: Any) -> str:
        return "other"

    return app


async def test_a_machine_without_the_play_leaves_the_run_to_one_that_has_it(
    database_url: str, plays: Plays
) -> None:
    """Mixed apps in one release: the narrow machine never fails the run and then skips it."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, _narrow_app(), A, worker_base="test-rel-a-narrow") as narrow,
    ):
        await register_worker(narrow)
        runs = [await client.submit("plain", {"n": n}) for n in range(3)]
        outcomes = await work_once(narrow)
        assert outcomes == ["deferred"] * len(runs), outcomes
        assert narrow.lane_plays_differ
        assert await work_once(narrow) == []  # it claims past them now
        done: list[str] = []

        async def all_done() -> bool:
            done.extend(await work_once(rt_a))
            return len(done) == len(runs)

        await eventually(all_done, what="the full machine to run them")
        for run in runs:
            status = await client.status(run.run_id)
            assert status.status == "completed"
            owned = [(a.worker_id, a.outcome) for a in status.attempts if a.disposition == "own"]
            assert owned == [("test-rel-a", "completed")]


async def test_a_play_only_a_stopped_machine_had_is_deferred_then_failed_past_the_limit(
    database_url: str, plays: Plays
) -> None:
    """No live machine has the play, a stopped one did: deferred (counted), then fails at the limit.

    The path that still reaches LANE_WORKER_DEFER_FAIL_AFTER (docs/DESIGN.md).
    """
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(
            database_url, _narrow_app(), A, worker_base="test-rel-a-narrow",
            defer_fail_after_s=0.5,
        ) as narrow,
    ):  # fmt: skip
        await register_worker(narrow)
        await age_worker(database_url, rt_a.worker_base)  # the full machine stopped
        run = await client.submit("plain")
        assert await work_once(narrow) == ["deferred"]
        row = await run_row(database_url, run.run_id)
        assert (row["status"], row["defer_count"]) == ("queued", 1)
        assert (await client.lane(A)).counts["deferred"] == 1  # the report names it
        await sql(
            database_url,
            f"update {SCHEMA}.runs set first_deferred_at = now() - interval '1 minute'"
            " where run_id = $1::uuid",
            run.run_id,
        )
        await sql(database_url, f"update absurd.r_{QA} set available_at = now()")
        assert await work_once(narrow) == ["failed"]
        status = await client.status(run.run_id)
        assert (status.status, status.error["name"]) == ("failed", "DeferralLimitExceeded")
        assert status.facts == ("run.failed",)

        # A play no machine of the lane ever registered is unknown: it fails visibly.
        typo = await client.submit("plian")
        assert await work_once(narrow) == ["failed"]
        assert (await client.status(typo.run_id)).error["name"] == "UnknownPlayError"


# -- a sync step body that outlives its attempt's await ---------------------------------------


class Blocking:
    """A play whose sync step bodies block on a thread until ``release`` is set.

    ``one`` holds one step; ``group`` runs a failing async step beside a held
    sync one in a task group, so the group gives up the sync step's await.
    """

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()
        self.app = App()

        def body() -> str:
            self.entered.set()
            self.release.wait(60)
            self.returned.set()
            return "held"

        @self.app.play("one")
        async def one(ctx: TaskContext, params: Any) -> Any:
            return await ctx.step("hold", body)

        @self.app.play("group")
        async def group(ctx: TaskContext, params: Any) -> Any:
            async def fail() -> None:
                await asyncio.to_thread(self.entered.wait, 20)
                raise RuntimeError("the other branch failed")

            async with asyncio.TaskGroup() as tg:
                tg.create_task(ctx.step("hold", body))
                tg.create_task(ctx.step("fail", fail))


@asynccontextmanager
async def blocking_lane(
    database_url: str, blocking: Blocking
) -> AsyncIterator[tuple[LaneClient, Runtime]]:
    """A client and a live runtime of A with a 3 s lease (extended every second)."""
    async with (
        open_client(database_url, ENV_A) as client,
        open_runtime(database_url, blocking.app, A, lease_s=3) as rt,
    ):
        await client.activate_release(A, force=True)
        await register_worker(rt)
        yield client, rt


def logged(logs: list[dict[str, Any]], event: str) -> bool:
    return any(entry.get("event") == event for entry in logs)


async def test_a_cancelled_run_is_not_retried_while_its_sync_step_still_runs(
    database_url: str,
) -> None:
    """Cancelled mid sync step: the attempt stays open until the body returns; no retry before."""
    blocking = Blocking()
    async with blocking_lane(database_url, blocking) as (client, rt):
        run = await client.submit("one")
        claimed = await claim_one(rt, QA)
        try:
            with structlog.testing.capture_logs() as logs:
                task = asyncio.create_task(rt.handle(claimed))
                await eventually(lambda: asyncio.sleep(0, blocking.entered.is_set()))
                assert await client.cancel(run.run_id)
                # The lease keeper finds the cancel within a second or so.
                await eventually(
                    lambda: asyncio.sleep(0, task.done() or logged(logs, "run.step_still_running")),
                    what="the cancel observed",
                )
                assert not task.done(), "the attempt ended while its step body still ran"
                with pytest.raises(RunStillOpenError, match="may still be executing"):
                    await client.retry_run(run.run_id)
                rows = await attempt_rows(database_url, run.run_id)
                assert [r["outcome"] for r in rows] == [None]
        finally:
            blocking.release.set()
        assert (await asyncio.wait_for(task, 20)).outcome == "cancelled"
        assert [r["outcome"] for r in await attempt_rows(database_url, run.run_id)] == ["cancelled"]
        retried = await client.retry_run(run.run_id)
        assert retried.created


async def test_a_play_that_gives_up_a_sync_step_ends_its_attempt_only_once_it_returned(
    database_url: str,
) -> None:
    """A task group fails beside a held sync step: attempt and lease last until it returns."""
    blocking = Blocking()
    async with blocking_lane(database_url, blocking) as (client, rt):
        run = await client.submit("group")
        claimed = await claim_one(rt, QA)
        try:
            with structlog.testing.capture_logs() as logs:
                task = asyncio.create_task(rt.handle(claimed))
                await eventually(
                    lambda: asyncio.sleep(0, task.done() or logged(logs, "run.step_still_running")),
                    what="the play's failure",
                )
                assert not task.done(), "the attempt ended while its step body still ran"
                # Its lease is still extended: nobody else can claim the run meanwhile.
                await asyncio.sleep(4)  # longer than the lease: a lapsed one would show here
                assert not (await rt.claim(QA, 5)).runs
                rows = await attempt_rows(database_url, run.run_id)
                assert [r["outcome"] for r in rows] == [None]
        finally:
            blocking.release.set()
        assert (await asyncio.wait_for(task, 20)).outcome == "retrying"
        assert blocking.returned.is_set()


async def test_a_draining_lane_s_remedy_names_a_play_no_live_machine_registers(
    database_url: str, plays: Plays
) -> None:
    """Fresh runs of a play only a stopped machine had: the remedy says so, never "will run"."""
    app = remedies_app(plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, _narrow_app(), A, worker_base="test-rel-a-narrow") as narrow,
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
    database_url: str, plays: Plays
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
