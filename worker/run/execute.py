"""Executing claimed runs: lane dispositions, attempts, plays, put-backs.

``Runtime.handle`` takes one claimed engine run from start to its next durable
point: decide the lane disposition, record the attempt, then execute the play
(own / adopt) or put the run back without spending an attempt (defer /
refuse). Every engine transition commits in one transaction with the store
writes that go with it, fenced by the attempt row. How an attempt ends lives
in ``worker/settle.py``, how a claim is given back in ``worker/handback.py``;
both are mixed into ``Runtime``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import asyncpg
import structlog

from worker import checkpoint, lanes
from worker.app import App
from worker.config.dburl import url_secrets
from worker.config.settings import Tuning
from worker.db import engine
from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store
from worker.db.tasks import PLAY_RUN_TASK as PLAY_RUN_TASK  # re-exported, as before
from worker.db.tasks import notify
from worker.errors import (
    FatalRunError,
    LaneMismatchError,
    LeaseLostError,
    RunCancelledError,
    UnknownBoundaryError,
    UnknownPlayError,
)
from worker.jsonvalue import require_json
from worker.metrics import Metrics
from worker.run.attempt import Settlement, error_reason
from worker.run.context import STEP_KEYS_CURRENT, DbClock, RunHandle, Suspended, TaskContext
from worker.run.deferral import Streak, count_deferral
from worker.run.handback import Claim, HandBack, really_cancelled
from worker.run.reconcile import reconcile_queue
from worker.states import TERMINAL_STATUSES

log = structlog.get_logger("lane_worker.runtime")

T = TypeVar("T")


@dataclass(frozen=True)
class _Begun:
    """What ``begin_attempt`` returned."""

    attempt_id: int
    checkpoint: dict[str, Any] | None
    current_wait: dict[str, Any] | None
    step_keys: int | None
    clock: DbClock


@dataclass(frozen=True)
class Handled:
    """What one claim came to: the lane disposition and the attempt's outcome."""

    disposition: str
    outcome: str


class _PlayExit(Exception):
    """Carries a play's SystemExit or KeyboardInterrupt out of its task.

    asyncio re-raises those two from a task into the event loop, which would
    stop the daemon; carried, they fail the attempt like any other error.
    """

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


async def _contain_exits(work: Awaitable[T]) -> T:
    try:
        return await work
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _PlayExit(exc) from None


class Runtime(HandBack, Settlement):
    """Executes claimed runs for one worker of one release."""

    def __init__(
        self,
        db: Database,
        store: Store,
        app: App,
        *,
        worker_base: str,
        release_id: str,
        lease_s: int,
        metrics: Metrics | None = None,
        defer_alert_after_s: float = Tuning.defer_alert_after_s,
        defer_fail_after_s: float = 0.0,
    ) -> None:
        self.metrics = metrics
        self.defer_alert_after_s = defer_alert_after_s
        self.defer_fail_after_s = defer_fail_after_s
        self.db = db
        self.store = store
        self.app = app
        self.worker_base = worker_base
        self.release_id = release_id
        self.queue = lanes.queue_name_for_release(release_id)
        self.lease_s = lease_s
        # What the registry says, kept current by the supervisor: this release's
        # lane is retired (draining); other lanes that claim; and whether runs on
        # this lane's queue were adopted by another lane (the own loop skips them).
        self.draining = False
        self.claiming_queues: frozenset[str] = frozenset()
        self.foreign_adoptees = False
        # A live machine of this lane registers a play this app lacks (a rollout
        # of mixed apps): the own loop claims past such runs from then on.
        self.lane_plays_differ = False
        self.plays = sorted(app.plays)
        # A play's error text may quote the database URL (a driver message):
        # stored errors are shown by `status`, so mask its passwords first.
        self.secrets = url_secrets(db.options.url)

    def worker_id_for(self, queue: str) -> str:
        """Return the engine worker id this worker claims ``queue`` with."""
        if lanes.loop_kind(queue, self.queue) == "own":
            return self.worker_base
        return lanes.continuation_worker_id(self.worker_base, queue)

    def claim_mode(self, queue: str) -> str | None:
        """Return how this worker claims ``queue`` now (None: the engine's own claim).

        A claiming release drains its own queue with the engine's claim (or,
        when another lane adopted runs there, one that skips those), adopts from
        retired queues and, on a lane that claims too, takes only its own
        adoptees; a retired (draining) one claims, on every queue, only what no
        other release may run.
        """
        if self.draining:
            return engine.CLAIM_DRAIN
        if lanes.loop_kind(queue, self.queue) == "own":
            own_filter = self.foreign_adoptees or self.lane_plays_differ
            return engine.CLAIM_OWN if own_filter else None
        return engine.CLAIM_MINE if queue in self.claiming_queues else engine.CLAIM_ADOPT

    async def claim(self, queue: str, qty: int) -> engine.ClaimBatch:
        """Claim up to ``qty`` runs from ``queue``; settle what an expired-lease sweep ended."""
        worker_id = self.worker_id_for(queue)
        mode = self.claim_mode(queue)
        batch = await self.db.run(
            lambda conn: engine.claim(
                conn,
                queue,
                worker_id,
                lease_s=self.lease_s,
                qty=qty,
                mode=mode,
                store_schema=self.store.schema,
                own_queue=self.queue,
                plays=self.plays,
            )
        )
        if batch.swept:
            # One batch inline, so the claimed runs start promptly; maintenance settles
            # the rest. A failure here must not abandon the runs just claimed.
            try:
                await reconcile_queue(
                    self.db, self.store, queue, worker_id=worker_id, max_batches=1
                )
            except Exception as exc:
                log.warning("reconcile.failed", queue=queue, worker_id=worker_id, error=repr(exc))
        return batch

    async def handle(
        self, claimed: engine.ClaimedRun, *, on_refuse: Callable[[], None] | None = None
    ) -> Handled:
        """Decide what to do with one claimed run and do it; return the disposition and outcome.

        Whatever ends this call early (a drain's cancel at any await, a database
        that stays away, a bug) the claim is given back without spending an
        attempt, unless it already ended (settled, parked or put back).

        Raises ``LaneMismatchError`` after handing the run back when this worker's
        own loop claimed a run of another lane (misconfiguration: stop that loop).
        ``on_refuse`` runs as soon as a refusal is decided, before the run is
        handed back, so the loop stops before it could claim the run again.
        """
        claim = Claim()
        try:
            handled = await self._handle(claimed, claim, on_refuse)
        except BaseException as exc:
            if not claim.ended:
                await self._give_back_after(claimed, claim, exc)
            raise
        return handled

    async def _handle(
        self, claimed: engine.ClaimedRun, claim: Claim, on_refuse: Callable[[], None] | None
    ) -> Handled:
        row = await self.db.run(lambda c: self.store.fetchrow(c, "lane_state", claimed.task_id))
        bound = log.bind(
            queue=claimed.queue, release_id=self.release_id, task_id=str(claimed.task_id)
        )
        if row is None:
            moved = await self._moved_to(claimed)
            if moved is not None:
                # `lanes move` gave the run a new task on another lane and cancelled
                # this one after it was claimed: record the claim (the task fence
                # takes nothing over), end it as a lost lease, run nothing.
                moved_run, to_queue = moved
                claim.run_id = moved_run
                attempt_id = (await self._begin(claimed, claim, moved_run, "own")).attempt_id
                reason = {"reason": f"moved to {to_queue}"}
                await self.db.run(
                    lambda c: self.store.execute(
                        c, "finish_attempt", attempt_id, "lease_lost", reason
                    )
                )
                claim.ended = True
                bound.bind(run_id=str(moved_run)).info("run.moved_away", to_queue=to_queue)
                return Handled("own", "lease_lost")
            # An engine task without a launch row cannot be executed by anyone.
            await self.db.run(lambda c: engine.cancel(c, claimed.queue, claimed.task_id))
            claim.ended = True
            bound.error("run.orphan_cancelled", task_name=claimed.task_name)
            return Handled("own", "cancelled")
        run_id: uuid.UUID = row["run_id"]
        claim.run_id = run_id
        adopter: str | None = row["adopted_release_id"]
        effective = adopter or row["release_id"]
        bound = bound.bind(run_id=str(run_id), worker_id=self.worker_id_for(claimed.queue))
        own_loop = lanes.loop_kind(claimed.queue, self.queue) == "own"
        disposition: lanes.LaneDisposition
        if own_loop:
            try:
                # The stamped release: this queue is that release's lane.
                lanes.assert_release_lane_matches(str(run_id), row["release_id"], self.release_id)
                disposition = lanes.Own()
            except LaneMismatchError:
                await self._put_back(claimed, claim, "refuse", "refused", delay_s=0)
                bound.error("lane.guard_failed", run_release_id=row["release_id"])
                raise
        if (
            adopter is not None
            and row["adopted_queue"] != self.queue
            and (own_loop or row["adopter_claiming"])
        ):
            # Another lane adopted it and may still run it: newer code than the
            # stamped lane's ran it already, and a third release must not take it.
            # The claim statement skips such runs (an own loop that meets one
            # switches to the claim that does), so this is a race: give it back
            # to its adopter at once, quietly.
            if own_loop:
                self.foreign_adoptees = True
            bound.info("run.left_to_adopter", adopter_release_id=adopter)
            outcome = await self._put_back(
                claimed, claim, "defer", "deferred", delay_s=0,
                note={"reason": f"adopted by {adopter}"},
            )  # fmt: skip
            return Handled("defer", outcome)
        if own_loop and row["play"] not in self.app.plays:
            # Another machine of this release may register it (a rollout of mixed
            # apps): failing it here (UnknownPlayError) would fail it for good.
            disposition = await self._play_elsewhere(row["play"], run_id) or disposition
        if not own_loop:
            disposition = lanes.resolve_lane_disposition(
                run_id=str(run_id),
                run_release_id=effective,
                worker_release_id=self.release_id,
                # The effective release's lane: an adopted run belongs to its adopter.
                lane_claiming=row["adopter_claiming"] if adopter else row["lane_claiming"],
                parked_in_adoptable_wait=row["status"] == "waiting"
                and (row["current_wait"] or {}).get("kind") in checkpoint.KNOWN_BOUNDARY_KINDS,
            )
        if (
            not own_loop
            and isinstance(disposition, lanes.Adopt | lanes.Own)
            and row["play"] not in self.app.plays
        ):
            # Running it would fail it for good here (UnknownPlayError), though its
            # own release, another machine of this one or a release that registers
            # the play can still run it. The claim skips such runs: this is a race.
            disposition = lanes.Defer(
                reason=f"play {row['play']!r} of run {run_id} (release {effective}) is not "
                f"registered in this app of release {self.release_id}, which cannot run it",
                delay_seconds=lanes.LANE_ADOPTION_DEFER_SECONDS,
            )
            if self.metrics is not None:
                self.metrics.incompatible_defers.inc()
        if isinstance(disposition, lanes.Defer):
            bound.info("run.deferred", delay_s=disposition.delay_seconds, reason=disposition.reason)
            outcome = await self._put_back(
                claimed, claim, "defer", "deferred", delay_s=disposition.delay_seconds,
                note={"reason": disposition.reason},
            )  # fmt: skip
            return Handled("defer", outcome)
        if isinstance(disposition, lanes.Refuse):
            if on_refuse is not None:
                on_refuse()
            bound.error(
                "lane.refused",
                run_release_id=effective,
                remedy=f"this lane still claims; let a worker of {effective!r} take it, or run "
                f"`lane-worker lanes retire {effective}` if that release is gone",
            )
            outcome = await self._put_back(claimed, claim, "refuse", "refused", delay_s=0)
            return Handled("refuse", outcome)
        adopted = disposition.adopted_release_id if isinstance(disposition, lanes.Adopt) else None
        begun = await self._begin(claimed, claim, run_id, disposition.kind)
        if adopted is not None:
            bound.info("run.adopted", from_release_id=adopted)
        handle = RunHandle(
            run_id=run_id,
            queue=claimed.queue,
            task_id=claimed.task_id,
            engine_run_id=claimed.run_id,
            attempt=claimed.attempt,
            attempt_id=begun.attempt_id,
            lease_s=self.lease_s,
            clock=begun.clock,
            step_keys=begun.step_keys,
        )
        if begun.checkpoint is None:
            # Not taken over: settled, or moved to another lane, between the claim
            # and the fence move (possibly while this statement waited on the row).
            outcome = await self._not_taken(handle, claimed, bound)
        else:
            outcome = await self._execute(handle, claimed, row, begun, bound)
        claim.ended = True
        return Handled(disposition.kind, outcome)

    async def _play_elsewhere(self, play: str, run_id: uuid.UUID) -> lanes.Defer | None:
        """Decide on an own-lane run whose play this app lacks; None: fail it for good.

        A live machine of this lane registers the play: leave it to that machine
        at once, and claim from now on past such runs (``claim_lane`` mode ``own``
        skips them). Only machines that have stopped ever registered it: put it
        back in 30 s, counted as a deferral, so the report names it and an
        operator hears of it. No machine of this lane ever did: the play is
        unknown to the release (a typo), and the run fails visibly.
        """
        found = await self.db.run(
            lambda c: self.store.fetchrow(c, "lane_play_registered", self.queue, play)
        )
        live, ever = (found["live"], found["ever"]) if found is not None else (False, False)
        here = f"play {play!r} of run {run_id} is not registered in this app of release "
        if live:
            self.lane_plays_differ = True
            return lanes.Defer(
                reason=f"{here}{self.release_id}, but a live machine of it registers it",
                delay_seconds=0,
            )
        if ever:
            return lanes.Defer(
                reason=f"{here}{self.release_id}, and no live machine of it registers it now "
                "(one that stopped did): start one",
            )
        return None

    async def _moved_to(self, claimed: engine.ClaimedRun) -> tuple[uuid.UUID, str] | None:
        """Return the run and the queue a claimed task's run was moved to, or None."""
        params = claimed.params if isinstance(claimed.params, dict) else {}
        try:
            run_id = uuid.UUID(str(params.get("runId")))
        except ValueError:
            return None
        row = await self.db.run(lambda c: self.store.fetchrow(c, "get_run", run_id))
        if row is None or row["task_id"] == claimed.task_id:
            return None
        return run_id, str(row["queue"])

    async def _not_taken(
        self, h: RunHandle, claimed: engine.ClaimedRun, bound: structlog.typing.FilteringBoundLogger
    ) -> str:
        """End an attempt whose begin did not take the run over, as its row now reads.

        Read afresh: ``begin_attempt``'s own snapshot predates the lock it waited for.
        Nothing is settled here: whoever ended or moved the run wrote its state.
        """
        row = await self.db.run(lambda c: self.store.fetchrow(c, "get_run", h.run_id))
        if row is not None and row["task_id"] != claimed.task_id:
            bound.info("run.moved_away", to_queue=row["queue"])
            await self._finish(h, "lease_lost", {"reason": f"moved to {row['queue']}"})
            return "lease_lost"
        if row is None or row["status"] in TERMINAL_STATUSES:
            status = row["status"] if row is not None else "gone"
            bound.info("run.ended_elsewhere", status=status)
            outcome = "cancelled" if status == "cancelled" else "lease_lost"
            await self._finish(h, outcome, {"reason": f"the run is {status}"})
            return outcome
        # Open and still this task's: nothing took it, so give the claim back.
        await self._finish(h, "handed_back", {"reason": "not taken over"})
        await self.give_back(claimed, None)
        return "handed_back"

    async def _begin(
        self, claimed: engine.ClaimedRun, claim: Claim, run_id: uuid.UUID, kind: str
    ) -> _Begun:
        """Record the claim; for own/adopt also move the fence and return the envelope."""

        async def begin(conn: Connection) -> tuple[asyncpg.Record | None, float]:
            # Read just before the statement is sent (a retry reads it again): the
            # database reads its clock later, so this clock runs at most a round
            # trip ahead, never behind.
            sent_s = time.monotonic()
            row = await self.store.fetchrow(
                conn,
                "begin_attempt",
                run_id,
                claimed.run_id,
                claimed.attempt,
                self.worker_id_for(claimed.queue),
                self.release_id,
                kind,
                self.release_id if kind == "adopt" else None,
                self.queue if kind == "adopt" else None,
                STEP_KEYS_CURRENT,
                claimed.task_id,
            )
            return row, sent_s

        row, sent_s = await self.db.run(begin)
        assert row is not None  # the insert always returns its row
        claim.attempt_id = row["attempt_id"]
        return _Begun(
            attempt_id=row["attempt_id"],
            checkpoint=row["checkpoint"],
            current_wait=row["current_wait"],
            step_keys=row["step_keys"],
            clock=DbClock(row["db_now_ms"], sent_s),
        )

    async def _put_back(
        self,
        claimed: engine.ClaimedRun,
        claim: Claim,
        kind: str,
        outcome: str,
        *,
        delay_s: float,
        note: dict[str, Any] | None = None,
    ) -> str:
        """Record the claim and reschedule the engine run; no attempt is spent.

        A deferral with a delay (not a race handed straight back) counts in the
        run's streak, which may fail it for good past LANE_WORKER_DEFER_FAIL_AFTER.
        """
        assert claim.run_id is not None
        run_id = claim.run_id
        attempt_id = (await self._begin(claimed, claim, run_id, kind)).attempt_id

        async def put_back(conn: Connection) -> Streak | None:
            streak = None
            if kind == "defer" and delay_s > 0:
                streak = await count_deferral(
                    conn, self.store, claimed, run_id,
                    alert_after_s=self.defer_alert_after_s, fail_after_s=self.defer_fail_after_s,
                    attempt_id=attempt_id,
                )  # fmt: skip
                if streak.failed is not None:
                    await self.store.execute(
                        conn, "finish_attempt", attempt_id, "failed", streak.failed
                    )
                    return streak
            await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
            await self.store.execute(conn, "finish_attempt", attempt_id, outcome, note)
            if delay_s <= 0:  # due now: wake the lane's workers
                await notify(conn, claimed.queue, run_id)
            return streak

        streak = await self.db.transaction(put_back)
        claim.ended = True
        if streak is not None:
            self._report_streak(streak, claimed, run_id)
            if streak.failed is not None:
                return "failed"
        return outcome

    def _report_streak(self, streak: Streak, claimed: engine.ClaimedRun, run_id: uuid.UUID) -> None:
        queue = claimed.queue
        bound = log.bind(
            queue=queue, release_id=self.release_id, task_id=str(claimed.task_id),
            run_id=str(run_id), worker_id=self.worker_id_for(queue),
        )  # fmt: skip
        if streak.alert:
            bound.warning(
                "run.deferred_too_long", defer_count=streak.count, deferred_s=round(streak.age_s),
                remedy="no release that may run it takes it: see `lane-worker lanes show` for "
                "its lane's blockers",
            )  # fmt: skip
            if self.metrics is not None:
                self.metrics.long_deferrals.labels(queue=queue).inc()
        if streak.failed is not None:
            bound.error("run.failed_for_good", error=streak.failed)

    async def _execute(
        self,
        h: RunHandle,
        claimed: engine.ClaimedRun,
        run: asyncpg.Record,
        begun: _Begun,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> str:
        """Run the play of ``run`` (``lane_state``) from the envelope ``begun`` returned."""
        play = self.app.plays.get(run["play"])
        try:
            if play is None:
                known = ", ".join(sorted(self.app.plays)) or "none"
                raise UnknownPlayError(
                    f"play {run['play']!r} is not registered in release {self.release_id} "
                    f"(it has: {known}); the run cannot be executed here."
                )
            wait_kind = (begun.current_wait or {}).get("kind")
            if wait_kind is not None and wait_kind not in checkpoint.KNOWN_BOUNDARY_KINDS:
                raise FatalRunError(
                    f"run {h.run_id} is parked in a {wait_kind!r} wait, which release "
                    f"{self.release_id} cannot resume."
                )
            checkpoints = await self.db.run(
                lambda c: engine.get_checkpoints(c, h.queue, h.task_id, h.engine_run_id)
            )
            ctx = TaskContext(
                db=self.db,
                store=self.store,
                handle=h,
                release_id=self.release_id,
                envelope=begun.checkpoint or {},
                checkpoints=checkpoints,
                log=bound,
            )
            bound.info("run.started", attempt=h.attempt, play=run["play"])
            started = time.monotonic()
            output = await self._with_lease(h, ctx, play(ctx, run["input"]), bound)
            require_json(output, f"the output of play {run['play']!r}")
        except Suspended:
            bound.info("run.parked", wait=ctx.envelope.get("armedWaits"))
            return "parked"
        except BaseExceptionGroup as group:
            # A play that waits inside a task group: its park committed, whatever
            # else the group carries (a sibling step cannot write after it).
            if group.subgroup(Suspended) is not None:
                bound.info("run.parked", wait=ctx.envelope.get("armedWaits"))
                return "parked"
            if really_cancelled():
                raise  # shutdown: `handle` gives the run back
            return await self._fail_attempt(h, claimed.max_attempts, group, bound)
        except anyio.get_cancelled_exc_class() as exc:
            if really_cancelled():
                raise  # shutdown: `handle` gives the run back
            # The play raised CancelledError itself (it awaited a task it cancelled).
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        except RunCancelledError:
            return await self._observe_cancel(h, bound)
        except LeaseLostError as exc:
            bound.warning("run.lease_lost", detail=str(exc))
            await self._finish(h, "lease_lost", error_reason(exc))
            return "lease_lost"
        except (FatalRunError, UnknownBoundaryError) as exc:
            return await self._fail_for_good(h, exc, bound)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the play's, not ours
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        try:
            await self._complete(h, output)
        except LeaseLostError as exc:
            # Cancelled, failed by an operator or taken by a newer claim as it
            # completed: the attempt still records its end (never "in progress").
            bound.warning("run.lease_lost", detail=str(exc))
            await self._finish(h, "lease_lost", error_reason(exc))
            return "lease_lost"
        except (asyncpg.PostgresError, ValueError) as exc:  # jsonb refused the output
            if is_transient(exc):
                raise
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        bound.info("run.completed", duration_s=round(time.monotonic() - started, 3))
        return "completed"

    async def _with_lease(
        self,
        h: RunHandle,
        ctx: TaskContext,
        work: Awaitable[T],
        bound: structlog.typing.FilteringBoundLogger,
    ) -> T:
        """Run ``work`` while extending the lease; cancel it if the lease is lost.

        The attempt ends only once every sync step body it started has
        returned: a thread cannot be stopped, and an attempt recorded as ended
        while its step still executes would let a retry or a newer claim run
        that step beside it. A drain does not wait (the process exits).
        """
        host = asyncio.current_task()
        assert host is not None
        lost: list[LeaseLostError] = []
        cancelled_host: list[bool] = []

        async def keep() -> None:
            while True:
                await asyncio.sleep(max(1.0, h.lease_s / 3))
                try:
                    await self.db.run(
                        lambda c: engine.extend_claim(c, h.queue, h.engine_run_id, h.lease_s)
                    )
                    if self.metrics is not None:
                        self.metrics.lease_extensions.inc()
                except LeaseLostError as exc:
                    lost.append(exc)
                    if ctx.sync_steps_running():
                        # Its next checkpoint fails on the lost lease by itself.
                        bound.warning("run.step_still_running", detail=str(exc))
                        await ctx.sync_steps_returned()
                    cancelled_host.append(True)
                    host.cancel()
                    return
                except Exception as exc:  # the database is away: keep trying while the lease lasts
                    bound.warning("lease.extend_failed", error=repr(exc))

        keeper = asyncio.create_task(keep())
        # The play runs in a task of its own: what it does to its task's cancel
        # count (Python 3.11's TaskGroup leaves one behind when a child fails
        # while the group exits) must not make this run look like a drain. A
        # cancel of this task (a drain, a lost lease) reaches the play's task.
        runner = asyncio.ensure_future(_contain_exits(work))
        try:
            try:
                return await runner
            except _PlayExit as carried:
                raise carried.exc from None
            finally:
                if not really_cancelled() and ctx.sync_steps_running():
                    # The play ended (a task group gave up a step's await) while
                    # a step body still runs: the lease stays held until it returns.
                    bound.warning("run.step_still_running")
                    await ctx.sync_steps_returned()
        except asyncio.CancelledError:
            if cancelled_host:
                host.uncancel()
                cancelled_host.clear()
                raise lost[0] from None
            raise
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            if cancelled_host:
                # The keeper cancelled the host just as the work returned: take
                # that cancel back, or the run would later look like a drain.
                host.uncancel()
