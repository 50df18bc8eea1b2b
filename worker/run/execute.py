"""Executing claimed runs: decide, begin an attempt, run the play under its lease, end it.

``Runtime.handle`` takes one claimed engine run to its next durable point:
read the run's lane facts, decide its disposition (``worker/run/decide.py``),
begin an attempt (``worker/run/begin.py``), then run the play (own / adopt) or
put the run back without spending an attempt (defer / refuse); every end is a
transition given to ``Attempt.end`` (``worker/run/attempt.py``). Whatever cuts
handling short gives the claim back (``worker/run/handback.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import asyncpg
import structlog

from worker import checkpoint, lanes
from worker.app import App
from worker.db import engine
from worker.db.pool import Database, is_transient
from worker.db.store import Store
from worker.db.tasks import PLAY_RUN_TASK
from worker.errors import (
    FatalRunError,
    LeaseLostError,
    RunCancelledError,
    UnknownBoundaryError,
    UnknownPlayError,
)
from worker.jsonvalue import require_json, unreadable_in
from worker.metrics import Metrics
from worker.run import decide
from worker.run.attempt import Attempt
from worker.run.begin import Attempts, DeferLimits
from worker.run.context import Suspended, TaskContext
from worker.run.decide import Cause, Decision, LaneFacts, PlayRegistration
from worker.run.foreign import ForeignTasks
from worker.run.handback import Claim, give_back_after, give_back_leftovers, really_cancelled
from worker.run.handle import STEP_KEYS_CURRENT, WorkerSeat
from worker.run.lease import with_lease
from worker.run.policy import ClaimPolicy, CurrentPolicy
from worker.run.reconcile import reconcile_queue
from worker.run.sandbox import SANDBOX_CLEANUP_TASK, SandboxCleanups, SandboxDeleter
from worker.run.transition import (
    CancelObserved,
    Complete,
    FailForGood,
    HandBack,
    Lost,
    PutBack,
    failure,
)
from worker.states import Disposition, Outcome

log = structlog.get_logger("lane_worker.runtime")
Log = structlog.typing.FilteringBoundLogger

T = TypeVar("T")


@dataclass(frozen=True)
class Handled:
    """What one claim came to: the lane disposition and the attempt's outcome."""

    disposition: Disposition
    outcome: Outcome
    # A task this store did not create, put back for its owner: not counted as a run's.
    foreign: bool = False


class Runtime:
    """Executes claimed runs for one worker of one release."""

    def __init__(
        self,
        db: Database,
        store: Store,
        app: App,
        seat: WorkerSeat,
        *,
        defer: DeferLimits,
        metrics: Metrics | None = None,
        sandboxes: SandboxDeleter | None = None,
        sandboxes_why_not: str | None = "no Daytona client was configured",
        policy: CurrentPolicy | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.app = app
        self.seat = seat
        self.metrics = metrics
        self.attempts = Attempts(db, store, seat, defer=defer, metrics=metrics)
        self.release_id = seat.release_id
        self.worker_base = seat.worker_base
        self.queue = seat.own_queue
        self.lease_s = seat.lease_s
        self.plays = sorted(app.plays)
        # Who decides, on the own loop (True) and on a continuation loop (False).
        self._seats = {
            own_loop: decide.Seat(
                self.release_id,
                self.queue,
                frozenset(app.plays),
                own_loop,
                unknown_play_grace_s=defer.unknown_play_grace_s,
            )
            for own_loop in (True, False)
        }
        # What it may claim where: the lane follower's to publish; read at each claim.
        self.policy = policy if policy is not None else CurrentPolicy(ClaimPolicy(self.queue))
        self.foreign = ForeignTasks(db, store)
        self.cleanups = SandboxCleanups(
            db, store, deleter=sandboxes, why_not=sandboxes_why_not, lease_s=seat.lease_s
        )

    def worker_id_for(self, queue: str) -> str:
        """Return the engine worker id this worker claims ``queue`` with."""
        return self.seat.worker_id_for(queue)

    def claim_mode(self, queue: str) -> str | None:
        """Return how this worker claims ``queue`` now (``ClaimPolicy.mode``)."""
        return self.policy.value.mode(queue)

    async def claim(self, queue: str, qty: int) -> engine.ClaimBatch:
        """Claim up to ``qty`` runs from ``queue``; settle what an expired-lease sweep ended."""
        worker_id = self.worker_id_for(queue)
        mode = self.claim_mode(queue)
        own = lanes.loop_kind(queue, self.queue) == "own"
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
                # On its own queue a run's facts hold while the claim is held (no
                # other lane can adopt it meanwhile); elsewhere they may not (a lane
                # claims again), so `handle` reads them as late as it can. There
                # too, the attempts it will certainly own begin in the same trip.
                with_lanes=own,
                begin=engine.BeginOwn(self.release_id, worker_id, STEP_KEYS_CURRENT)
                if own
                else None,
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

    async def next_due_in_s(self, queue: str) -> float | None:
        """Return seconds until the next run this worker may claim on ``queue`` is due, if any."""
        mode = self.claim_mode(queue)
        return await self.db.run(
            lambda c: engine.next_due_in_s(
                c,
                queue,
                mode=mode,
                store_schema=self.store.schema,
                own_queue=self.queue,
                plays=self.plays,
            )
        )

    async def queue_exists(self, queue: str) -> bool:
        """Tell whether ``queue``'s engine tables exist (`lanes prune` drops a retired one's)."""
        return await self.db.run(lambda c: engine.queue_exists(c, queue))

    async def give_back_leftovers(self, queues: list[str]) -> int:
        """Give back every engine run this worker still holds on ``queues`` (at shutdown)."""
        return await give_back_leftovers(self.attempts, queues)

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
            return await self._handle(claimed, claim, on_refuse)
        except BaseException as exc:
            if claim.open:
                await give_back_after(self.attempts, claimed, claim, exc)
            raise

    async def _handle(
        self, claimed: engine.ClaimedRun, claim: Claim, on_refuse: Callable[[], None] | None
    ) -> Handled:
        if claimed.task_name == SANDBOX_CLEANUP_TASK:
            if not await self.foreign.owned(claimed.task_id):
                # The TypeScript system spawns cleanups of this name for its own runs.
                return await self._leave_foreign(claimed, claim)
            # No launch row and no play: any release's worker may do it.
            outcome = await self.cleanups.handle(claimed)
            claim.ended = True
            return Handled(Disposition.OWN, outcome)
        row = claimed.lane
        if row is None:
            # Not read with the claim (a retired lane's queue, or no store row then):
            # read now, so a lane that claims again or a store row written since counts.
            row = await self.db.run(
                lambda c: self.store.attempts.lane_state(c, task_id=claimed.task_id)
            )
        bound = log.bind(
            queue=claimed.queue, release_id=self.release_id, task_id=str(claimed.task_id)
        )
        if row is None:
            return await self._without_launch_row(claimed, claim, bound)
        facts = LaneFacts(
            run_id=row.run_id,
            release_id=row.release_id,
            status=row.status,
            play=row.play,
            current_wait=row.current_wait,
            adopted_release_id=row.adopted_release_id,
            adopted_queue=row.adopted_queue,
            lane_claiming=row.lane_claiming,
            adopter_claiming=row.adopter_claiming,
        )
        claim.run_id = facts.run_id
        bound = bound.bind(run_id=str(facts.run_id), worker_id=self.worker_id_for(claimed.queue))
        seat = self._seats[lanes.loop_kind(claimed.queue, self.queue) == "own"]
        decision = await self._decide(facts, seat)
        self._note(decision, facts, seat, bound, on_refuse)
        attempt = await self.attempts.begin(claimed, facts.run_id, decision.disposition, bound)
        claim.attempt = attempt
        if not decision.executes:
            outcome = await self._put_back(attempt, decision)
            if decision.cause == Cause.LANE_GUARD:
                # Put back; now raise the guard's own error: the loop must stop.
                lanes.assert_release_lane_matches(
                    str(facts.run_id), facts.release_id, self.release_id
                )
            return Handled(decision.disposition, outcome)
        if decision.adopted_from is not None:
            bound.info("run.adopted", from_release_id=decision.adopted_from)
        if not attempt.taken_over:
            # Settled, or moved to another lane, between the claim and the fence
            # move (possibly while its statement waited on the row).
            return Handled(decision.disposition, await attempt.end(HandBack()))
        return Handled(decision.disposition, await self._execute(attempt, row.play, row.input))

    async def _decide(self, facts: LaneFacts, seat: decide.Seat) -> Decision:
        registration = None
        if decide.needs_play_registration(facts, seat):
            found = await self.db.run(
                lambda c: self.store.lanes.play_on_lane(
                    c, queue=self.queue, play=facts.play, run_id=facts.run_id
                )
            )
            registration = PlayRegistration(found.live, found.ever, found.deferred_s)
        return decide.decide(facts, seat, registration)

    def _note(
        self,
        decision: Decision,
        facts: LaneFacts,
        seat: decide.Seat,
        bound: Log,
        on_refuse: Callable[[], None] | None,
    ) -> None:
        """Log a decision and keep what it teaches the loops (before anything is written)."""
        cause = decision.cause
        if cause == Cause.LANE_GUARD:
            bound.error("lane.guard_failed", run_release_id=facts.release_id)
        elif cause == Cause.ADOPTED_ELSEWHERE:
            # The claim statement skips such runs (an own loop that meets one
            # switches to the claim that does): this was a race.
            if seat.own_loop:
                self.policy.learned_foreign_adoptees()
            bound.info("run.left_to_adopter", adopter_release_id=facts.adopted_release_id)
        elif decision.disposition == Disposition.DEFER:
            if cause == Cause.PLAY_ON_LIVE_MACHINE:
                self.policy.learned_plays_differ()
            elif cause == Cause.PLAY_NOT_HERE and self.metrics is not None:
                self.metrics.incompatible_defers.inc()
            bound.info("run.deferred", delay_s=decision.delay_s, reason=decision.reason)
        elif cause == Cause.LANE_CLAIMS:
            if on_refuse is not None:
                on_refuse()
            run_release = facts.effective_release_id
            bound.error(
                "lane.refused",
                run_release_id=run_release,
                remedy=f"this lane still claims; let a worker of {run_release!r} take it, or run "
                f"`lane-worker lanes retire {run_release}` if that release is gone",
            )

    async def _put_back(self, attempt: Attempt, decision: Decision) -> Outcome:
        if decision.disposition == Disposition.REFUSE:
            return await attempt.end(PutBack(Outcome.REFUSED, delay_s=0))
        note = {"reason": decision.reason}
        return await attempt.end(PutBack(Outcome.DEFERRED, decision.delay_s, note))

    async def _without_launch_row(
        self, claimed: engine.ClaimedRun, claim: Claim, bound: Log
    ) -> Handled:
        moved = await self._moved_to(claimed)
        if moved is not None:
            # `lanes move` gave the run a new task on another lane and cancelled
            # this one after it was claimed: record the claim (the task fence
            # takes nothing over), end it as a lost lease, run nothing.
            moved_run, to_queue = moved
            claim.run_id = moved_run
            bound = bound.bind(run_id=str(moved_run))
            attempt = await self.attempts.begin(claimed, moved_run, Disposition.OWN, bound)
            claim.attempt = attempt
            await attempt.end(Lost({"reason": f"moved to {to_queue}"}))
            bound.info("run.moved_away", to_queue=to_queue)
            return Handled(Disposition.OWN, Outcome.LEASE_LOST)
        # No run of this store names the task: another system's (the TypeScript
        # app's, on a shared queue). Its owner runs it; lane-worker never touches it.
        return await self._leave_foreign(claimed, claim)

    async def _leave_foreign(self, claimed: engine.ClaimedRun, claim: Claim) -> Handled:
        """Put a task this store did not create back for its owner (no attempt spent)."""
        await self.foreign.leave(claimed, self.worker_id_for(claimed.queue))
        claim.ended = True
        return Handled(Disposition.DEFER, Outcome.DEFERRED, foreign=True)

    async def _moved_to(self, claimed: engine.ClaimedRun) -> tuple[uuid.UUID, str] | None:
        """Return the run and the queue a claimed task's run was moved to, or None."""
        params = claimed.params if isinstance(claimed.params, dict) else {}
        if claimed.task_name != PLAY_RUN_TASK:
            return None
        try:
            run_id = uuid.UUID(str(params.get("runId")))
        except ValueError:
            return None
        row = await self.db.run(lambda c: self.store.runs.get(c, run_id))
        if row is None or row.task_id == claimed.task_id:
            return None
        return run_id, row.queue

    async def _execute(self, attempt: Attempt, play_name: str, play_input: Any) -> Outcome:
        """Run the play from the envelope the attempt took over; end the attempt by how it ended."""
        ctx: TaskContext | None = None
        try:
            ctx, play = await self._prepare(attempt, play_name, play_input)
            attempt.log.info("run.started", attempt=attempt.handle.attempt, play=play_name)
            started = time.monotonic()
            output = await with_lease(self.db, self.metrics, attempt, ctx, play(ctx, play_input))
            require_json(output, f"the output of play {play_name!r}")
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the play's, not ours
            return await self._end_after(attempt, ctx, exc)
        try:
            outcome = await attempt.end(Complete(output))
        except (asyncpg.PostgresError, ValueError) as exc:  # jsonb refused the output
            if is_transient(exc):
                raise
            return await attempt.end(failure(exc, attempt.claimed))
        if outcome == Outcome.COMPLETED:
            attempt.log.info("run.completed", duration_s=round(time.monotonic() - started, 3))
        return outcome

    async def _prepare(
        self, attempt: Attempt, play_name: str, play_input: Any
    ) -> tuple[TaskContext, Any]:
        """Return the play's context and function; raise what makes the run unrunnable here."""
        for what, value in (
            ("its input", play_input),
            ("its checkpoint envelope", attempt.envelope),
            ("its checkpoints", attempt.checkpoints),
        ):
            # Written past the store's checks (an older store, a direct write):
            # no attempt can ever read it, so the run fails now, alone.
            problem = unreadable_in(what, value)
            if problem is not None:
                raise FatalRunError(f"run {attempt.handle.run_id} cannot be executed: {problem}.")
        play = self.app.plays.get(play_name)
        if play is None:
            known = ", ".join(sorted(self.app.plays)) or "none"
            raise UnknownPlayError(
                f"play {play_name!r} is not registered in release {self.release_id} "
                f"(it has: {known}); the run cannot be executed here."
            )
        wait_kind = (attempt.current_wait or {}).get("kind")
        if wait_kind is not None and wait_kind not in checkpoint.KNOWN_BOUNDARY_KINDS:
            raise FatalRunError(
                f"run {attempt.handle.run_id} is parked in a {wait_kind!r} wait, which release "
                f"{self.release_id} cannot resume."
            )
        checkpoints = attempt.checkpoints
        if checkpoints is None:  # read with the fence move, by every attempt that took over
            raise RuntimeError("an attempt that did not take its run over cannot execute it")
        return TaskContext(attempt, release_id=self.release_id, checkpoints=checkpoints), play

    async def _end_after(
        self, attempt: Attempt, ctx: TaskContext | None, exc: BaseException
    ) -> Outcome:
        """End the attempt by how its play stopped (``exc``); re-raise a drain's cancel."""
        armed = ctx.envelope.get("armedWaits") if ctx is not None else None
        if isinstance(exc, Suspended) or (
            # A play that waits inside a task group: its park committed, whatever
            # else the group carries (a sibling step cannot write after it).
            isinstance(exc, BaseExceptionGroup) and exc.subgroup(Suspended) is not None
        ):
            attempt.log.info("run.parked", wait=armed)
            return Outcome.PARKED
        if isinstance(exc, BaseExceptionGroup | anyio.get_cancelled_exc_class()):
            if really_cancelled():
                raise exc  # shutdown: `handle` gives the run back
            # Otherwise the play raised CancelledError itself (it awaited a task it
            # cancelled), or a task group of the play failed.
            return await attempt.end(failure(exc, attempt.claimed))
        if isinstance(exc, RunCancelledError):
            return await attempt.end(CancelObserved())
        if isinstance(exc, LeaseLostError):
            return await attempt.end(Lost(exc))
        if isinstance(exc, FatalRunError | UnknownBoundaryError):
            return await attempt.end(FailForGood(exc))
        return await attempt.end(failure(exc, attempt.claimed))
