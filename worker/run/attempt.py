"""An attempt: ended once, each end one fenced transaction.

The ``Attempt`` that ``Attempts.begin`` (``worker/run/begin.py``) returns is
the only code that ends an attempt, through ``Attempt.end`` and one
transition value per way (``worker/run/transition.py``): complete, fail
(retrying or for good), observe a cancel, park, put back (defer, refuse), hand
back what it did not take over, or lose it to a newer claim. Every end commits
the engine transition with the store's in one transaction that ends with the
attempt row (``_end``), fenced by that row, so a stale attempt never settles,
parks or cancels a run a newer claim owns. The writes while a play runs (its
envelope, a step, a consumed signal) are fenced by the same row.

A claim that ends before or outside its attempt (a drain, an error, a claim
left over at shutdown) is given back by ``worker/run/handback.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, assert_never, overload

import asyncpg
import structlog

from worker.config.dburl import mask_secrets
from worker.db import engine
from worker.db.pool import Connection, is_transient
from worker.db.store.attempts import CheckpointWrite, CompletionWrite
from worker.db.tasks import notify
from worker.errors import LeaseLostError, UnknownPlayError
from worker.jsonvalue import encode_checked
from worker.run import reasons
from worker.run.deferral import Streak, count_deferral, report_streak
from worker.run.handback import give_back
from worker.run.handle import RunHandle
from worker.run.tracebacks import bounded_traceback
from worker.run.transition import (
    CancelObserved,
    Complete,
    Ends,
    Fail,
    FailForGood,
    HandBack,
    Lost,
    Park,
    Parked,
    PutBack,
    Retry,
    Transition,
)
from worker.states import TERMINAL_STATUSES, Disposition, Outcome, RunStatus

if TYPE_CHECKING:  # begin.py makes attempts
    from worker.run.begin import Attempts

Log = structlog.typing.FilteringBoundLogger


class Attempt:
    """One attempt of one run: the fenced writes while it runs, and every way it ends."""

    def __init__(
        self,
        owner: Attempts,
        claimed: engine.ClaimedRun,
        handle: RunHandle,
        disposition: Disposition,
        envelope: dict[str, Any] | None,
        current_wait: dict[str, Any] | None,
        checkpoints: dict[str, Any] | None,
        log: Log,
    ) -> None:
        self._owner = owner
        self.db = owner.db
        self.store = owner.store
        self.claimed = claimed
        self.handle = handle
        self.disposition = disposition
        # Own/adopt: the envelope as of the fence move; None when the run was
        # not taken over (settled or moved meanwhile). Defer/refuse: None.
        self.envelope = envelope
        self.current_wait = current_wait
        # The engine checkpoints it resumes from, read with the fence move.
        self.checkpoints = checkpoints
        self.log = log
        self.ended = False

    @property
    def attempt_id(self) -> int:
        return self.handle.attempt_id

    @property
    def taken_over(self) -> bool:
        return self.envelope is not None

    # -- the shared ending ---------------------------------------------------

    async def _close(self, conn: Connection, outcome: Outcome, error: Any = None) -> None:
        await self.store.attempts.finish(
            conn, attempt_id=self.attempt_id, outcome=str(outcome), error=error
        )

    async def _end(
        self,
        outcome: Outcome,
        error: Any = None,
        *,
        transition: Callable[[Connection], Awaitable[None]] | None = None,
    ) -> None:
        """End this attempt: ``transition`` (engine and store writes), then its row, one commit.

        ``transition`` raises ``LeaseLostError`` when the fence shows a newer
        claim owns the run: nothing of it commits then.
        """

        async def end(conn: Connection) -> None:
            if transition is not None:
                await transition(conn)
            await self._close(conn, outcome, error)

        await self.db.transaction(end)
        self.ended = True

    def _lost(self) -> LeaseLostError:
        """The error of a fenced write that found a newer claim owns the run."""
        h = self.handle
        return LeaseLostError(
            f"run {h.run_id} was taken over by a newer claim; attempt {h.attempt_id} stops",
            engine_run_id=h.engine_run_id,
        )

    # -- writes while the play runs ------------------------------------------

    async def write_step(self, key: str, result: Any) -> None:
        """Commit step ``key``'s result as an engine checkpoint, extending the lease."""
        h = self.handle
        # Checked by json_problem when the step returned (context._step_at).
        state = None if result is None else encode_checked(result)
        write = CheckpointWrite(
            queue=h.queue,
            task_id=h.task_id,
            name=key,
            state=state,
            engine_run_id=h.engine_run_id,
            extend_s=h.lease_s,
        )
        await self._owner.group_commit.write(write)

    async def save_envelope(self, conn: Connection, envelope: dict[str, Any]) -> None:
        """Write the run's envelope, fenced: a newer claim makes it raise ``LeaseLostError``."""
        h = self.handle
        if not await self.store.attempts.save_checkpoint(
            conn, run_id=h.run_id, attempt_id=h.attempt_id, envelope=envelope
        ):
            raise self._lost()

    async def consume_signal(self, conn: Connection, event_key: str) -> tuple[bool, Any]:
        """Mark the run's signal for ``event_key`` consumed by this attempt: (found, payload)."""
        h = self.handle
        return await self.store.attempts.consume_signal(
            conn, run_id=h.run_id, event_key=event_key, attempt_id=h.attempt_id
        )

    # -- the one way an attempt ends -------------------------------------------

    @overload
    async def end(self, transition: Park) -> Parked: ...
    @overload
    async def end(self, transition: Ends) -> Outcome: ...
    async def end(self, transition: Transition) -> Outcome | Parked:
        """End this attempt as ``transition`` says; return the outcome (a park: what it came to).

        Each kind is one fenced transaction that ends with the attempt row.
        When the fence shows a newer claim owns the run, nothing of it commits:
        the attempt ends as a lost lease instead (a park raises
        ``LeaseLostError`` through the play, whose end is then ``Lost``).
        """
        match transition:
            case Complete(output):
                return await self._complete(output)
            case Retry(error) | Fail(error):
                return await self._fail(error, final=isinstance(transition, Fail))
            case FailForGood(error):
                return await self._fail_for_good(error)
            case Park():
                return await self._park(transition)
            case PutBack(outcome, delay_s, note):
                return await self._put_back(outcome, delay_s, note)
            case HandBack():
                return await self._hand_back_untaken()
            case CancelObserved():
                return await self._observe_cancel()
            case Lost(reason):
                return await self._lose(reason)
        assert_never(transition)

    async def _complete(self, output: Any) -> Outcome:
        h = self.handle
        # The output was checked by json_problem (execute). It is sent once: the
        # store builds the run.completed fact that holds it (migration 0032).
        encoded = None if output is None else encode_checked(output)
        write = CompletionWrite(
            queue=h.queue,
            engine_run_id=h.engine_run_id,
            output=encoded,
            run_id=h.run_id,
            attempt_id=self.attempt_id,
        )
        try:
            await self._owner.group_commit.write(write)
        except LeaseLostError as lost:
            return await self._lose(lost)
        self.ended = True
        return Outcome.COMPLETED

    async def _fail(self, exc: BaseException, *, final: bool) -> Outcome:
        """Fail the engine run: it retries, or (``final``) the run settles failed."""
        h = self.handle
        reason = self.reason(exc)
        outcome = Outcome.FAILED if final else Outcome.RETRYING

        def failing(reason: dict[str, Any]) -> Callable[[Connection], Awaitable[None]]:
            async def fail(conn: Connection) -> None:
                await engine.fail(conn, h.queue, h.engine_run_id, reason)
                if not await self.store.attempts.lock_running(
                    conn, run_id=h.run_id, attempt_id=h.attempt_id
                ):
                    raise LeaseLostError(
                        "the run parked or was taken by a newer claim",
                        engine_run_id=h.engine_run_id,
                    )
                if final:
                    await self._settle(conn, RunStatus.FAILED, error=reason)
                else:
                    await self.store.attempts.retrying(
                        conn, run_id=h.run_id, attempt_id=h.attempt_id, error=reason
                    )

            return fail

        try:
            ended = await self._unless_lost(outcome, reason, failing(reason))
        except (asyncpg.PostgresError, ValueError) as unstorable:
            if is_transient(unstorable):
                raise
            # The error itself cannot be stored: record that instead, so the
            # attempt still fails rather than coming back for ever.
            reason = {
                "name": type(exc).__name__,
                "message": f"(the error's details could not be stored: {unstorable!r})"[
                    : reasons.MAX_ERROR_MESSAGE_CHARS
                ],
            }
            ended = await self._unless_lost(outcome, reason, failing(reason))
        if ended == outcome:
            event = "run.failed" if final else "run.attempt_failed"
            max_attempts = self.claimed.max_attempts
            self.log.warning(event, attempt=h.attempt, max_attempts=max_attempts, error=reason)
        return ended

    async def _fail_for_good(self, exc: Exception) -> Outcome:
        h = self.handle
        reason = {**self.reason(exc), "fatal": True}

        async def fail(conn: Connection) -> None:
            # Locks in the one order (engine's rows, then the store's): DESIGN "Lock order".
            await self.store.runs.get(conn, h.run_id, lock="engine_first")
            # The fenced store write first: a stale attempt must not cancel the
            # task that a newer claim now owns.
            if not await self._settle(conn, RunStatus.FAILED, error=reason):
                raise LeaseLostError(
                    "run settled or taken by a newer claim", engine_run_id=h.engine_run_id
                )
            await engine.cancel(conn, h.queue, h.task_id)

        ended = await self._unless_lost(Outcome.FAILED, reason, fail)
        if ended == Outcome.FAILED:
            self.log.error("run.failed_for_good", error=reason)
        return ended

    async def _park(self, park: Park) -> Parked:
        """Park in ``park.wait`` if the engine suspends the run: where every park ends its attempt.

        The engine's park, the store's wait and envelope, and the attempt's end
        commit together; when the engine does not suspend (the event is there,
        or it took a stale wake-up for a timeout), nothing ends.
        """
        h = self.handle

        async def park_run(conn: Connection) -> Parked:
            if park.kind == "sleep":
                assert park.wake_at is not None  # a sleep always has its wake time
                await engine.schedule(conn, h.queue, h.engine_run_id, park.wake_at)
                parked = Parked(suspended=True)
            else:
                got = await engine.await_event(
                    conn,
                    h.queue,
                    h.task_id,
                    h.engine_run_id,
                    step_name=f"wait:{park.boundary_id}",
                    event_name=park.event_name,
                    timeout_s=park.timeout_s,
                )
                parked = Parked(got.suspended, got.delivered, got.payload)
            if parked.suspended:
                if not await self.store.attempts.park(
                    conn,
                    run_id=h.run_id,
                    attempt_id=h.attempt_id,
                    wait=park.wait,
                    envelope=park.envelope,
                ):
                    raise self._lost()
                await self._close(conn, Outcome.PARKED)
            return parked

        parked = await self.db.transaction(park_run)
        if parked.suspended:
            self.ended = True
        return parked

    async def _observe_cancel(self) -> Outcome:
        async def settle(conn: Connection) -> None:
            # Fenced: only while this attempt is the run's (a cancel command, `runs
            # fail` or a move settled or restamped it already, and wrote its fact).
            await self._settle(conn, RunStatus.CANCELLED)

        await self._end(Outcome.CANCELLED, transition=settle)
        self.log.info("run.cancelled")
        return Outcome.CANCELLED

    async def _lose(self, reason: dict[str, Any] | BaseException) -> Outcome:
        if isinstance(reason, BaseException):
            self.log.warning("run.lease_lost", detail=str(reason))
            reason = reasons.error_reason(reason)
        await self._end(Outcome.LEASE_LOST, reason)
        return Outcome.LEASE_LOST

    async def _put_back(
        self, outcome: Outcome, delay_s: float, note: dict[str, Any] | None
    ) -> Outcome:
        """Reschedule the engine run ``delay_s`` from now without spending an attempt.

        A deferral with a delay (not a race handed straight back) counts in the
        run's streak, which may fail it for good past LANE_WORKER_DEFER_FAIL_AFTER.
        """
        claimed, run_id = self.claimed, self.handle.run_id
        limits = self._owner.defer
        streaks: list[Streak] = []

        async def put_back(conn: Connection) -> Outcome:
            streaks.clear()  # a retried transaction counts again
            if outcome == Outcome.DEFERRED and delay_s > 0:
                # It may cancel the task: the engine's rows first (DESIGN "Lock order").
                await self.store.runs.get(conn, run_id, lock="engine_first")
                streak = await count_deferral(
                    conn,
                    self.store,
                    claimed,
                    run_id,
                    alert_after_s=limits.alert_after_s,
                    fail_after_s=limits.fail_after_s,
                    attempt_id=self.attempt_id,
                )
                streaks.append(streak)
                if streak.failed is not None:
                    await self._close(conn, Outcome.FAILED, streak.failed)
                    return Outcome.FAILED
            await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
            await self._close(conn, outcome, note)
            if delay_s <= 0:  # due now: wake the lane's workers
                await notify(conn, claimed.queue, run_id)
            return outcome

        ended = await self.db.transaction(put_back)
        self.ended = True
        if streaks:
            report_streak(streaks[0], self.log, self._owner.metrics, self.claimed.queue)
        return ended

    async def _hand_back_untaken(self) -> Outcome:
        """End an attempt whose begin did not take the run over, as the run's row now reads.

        Read afresh: ``begin_attempt``'s own snapshot predates the lock it waited
        for. Nothing is settled here: whoever ended or moved the run wrote its state.
        """
        h = self.handle
        row = await self.db.run(lambda c: self.store.runs.get(c, h.run_id))
        if row is not None and row.task_id != self.claimed.task_id:
            self.log.info("run.moved_away", to_queue=row.queue)
            return await self._lose({"reason": f"moved to {row.queue}"})
        if row is None or row.status in TERMINAL_STATUSES:
            status = row.status if row is not None else "gone"
            self.log.info("run.ended_elsewhere", status=status)
            # Settled by someone else before it was taken over.
            ended = Outcome.CANCELLED if status == RunStatus.CANCELLED else Outcome.LEASE_LOST
            await self._end(ended, {"reason": f"the run is {status}"})
            return ended
        # Open and still this task's: nothing took it, so give the claim back.
        await self._end(Outcome.HANDED_BACK, {"reason": "not taken over"})
        await give_back(self._owner, self.claimed, None)
        return Outcome.HANDED_BACK

    # -- helpers -------------------------------------------------------------

    def reason(self, exc: BaseException) -> dict[str, Any]:
        """Return how ``exc`` is stored, with the database URL's secrets masked: its name,
        message and (bounded) traceback."""
        reason = reasons.error_reason(exc)
        reason["message"] = mask_secrets(reason["message"], self._owner.secrets)
        # A play this release does not register: raised before any of the app's code
        # ran, so its frames are only lane-worker's (issue 31); the message says it all.
        if not isinstance(exc, UnknownPlayError):
            reason["traceback"] = bounded_traceback(exc, self._owner.secrets)
        return reason

    async def _settle(self, conn: Connection, status: RunStatus, *, error: Any = None) -> bool:
        """Settle the run fenced by this attempt; the store writes its terminal fact."""
        return await self.store.runs.settle(
            conn,
            self.handle.run_id,
            status=str(status),
            source="worker",
            attempt_id=self.attempt_id,
            error=error,
        )

    async def _unless_lost(
        self,
        outcome: Outcome,
        error: Any,
        transition: Callable[[Connection], Awaitable[None]],
    ) -> Outcome:
        """End with ``outcome``, or as a lost lease when the fence says a newer claim owns it."""
        try:
            await self._end(outcome, error, transition=transition)
        except LeaseLostError as lost:
            return await self._lose(lost)
        return outcome
