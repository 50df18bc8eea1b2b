"""An attempt: begun once, ended once, each end one fenced transaction.

``Attempts.begin`` records a claim as an attempt row; for own and adopt it also
moves the run's fence to that row. The ``Attempt`` it returns is the only code
that ends an attempt: complete, fail (retrying or for good), observe a cancel,
park, put back (defer, refuse), hand back what it did not take over, or lose
it to a newer claim. Every end commits the engine transition with the store's
in one transaction that ends with the attempt row (``_end``), fenced by that
row, so a stale attempt never settles, parks or cancels a run a newer claim
owns. The writes while a play runs (its envelope, a consumed signal) are
fenced by the same row.

A claim that ends before or outside its attempt (a drain, an error, a claim
left over at shutdown) is given back by ``worker/run/handback.py``.

(About 430 lines, on purpose: every way an attempt ends is in this one file.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
import structlog

from worker.config.dburl import mask_secrets, url_secrets
from worker.db import engine
from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store
from worker.db.store.attempts import CheckpointWrite, CompletionWrite
from worker.db.store.rows import Begun
from worker.db.tasks import notify
from worker.errors import LeaseLostError
from worker.jsonvalue import encode_checked
from worker.metrics import Metrics
from worker.run import facts
from worker.run.deferral import Streak, count_deferral, report_streak
from worker.run.group_commit import GroupCommit
from worker.run.handback import give_back
from worker.run.handle import STEP_KEYS_CURRENT, DbClock, RunHandle, WorkerSeat
from worker.states import TERMINAL_STATUSES, Disposition, Outcome, RunStatus

T = TypeVar("T")
Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True)
class DeferLimits:
    """LANE_WORKER_DEFER_ALERT_AFTER and LANE_WORKER_DEFER_FAIL_AFTER (0: never fail)."""

    alert_after_s: float
    fail_after_s: float = 0.0


class Attempts:
    """Begins the attempts of one worker (the ``Attempt`` objects end them)."""

    def __init__(
        self,
        db: Database,
        store: Store,
        seat: WorkerSeat,
        *,
        defer: DeferLimits,
        metrics: Metrics | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.seat = seat
        self.defer = defer
        self.metrics = metrics
        # The step checkpoints and completions of this worker's runs in flight.
        self.group_commit = GroupCommit(db, store)
        # A play's error text may quote the database URL (a driver message):
        # stored errors are shown by `status`, so mask its passwords first.
        self.secrets = url_secrets(db.options.url)

    async def begin(
        self,
        claimed: engine.ClaimedRun,
        run_id: uuid.UUID,
        disposition: Disposition,
        log: Log,
    ) -> Attempt:
        """Record the claim as an attempt; for own and adopt also take the run over.

        The returned attempt's ``taken_over`` is False when own or adopt found
        the run settled or moved between the claim and the fence move: it must
        then end with ``hand_back_untaken``.
        """
        seat = self.seat
        adopt = disposition == Disposition.ADOPT

        async def begin(conn: Connection) -> tuple[Begun, float]:
            # Read just before the statement is sent (a retry reads it again): the
            # database reads its clock later, so this clock runs at most a round
            # trip ahead, never behind.
            sent_s = time.monotonic()
            row = await self.store.attempts.begin(
                conn,
                run_id=run_id,
                engine_run_id=claimed.run_id,
                attempt=claimed.attempt,
                worker_id=seat.worker_id_for(claimed.queue),
                release_id=seat.release_id,
                disposition=str(disposition),
                adopted_release_id=seat.release_id if adopt else None,
                adopted_queue=seat.own_queue if adopt else None,
                step_keys=STEP_KEYS_CURRENT,
                task_id=claimed.task_id,
                queue=claimed.queue,
            )
            return row, sent_s

        if claimed.begun is not None:
            # The claim began it already as 'own' (its store row alone decided
            # that); the pure decision must agree, or the rules have drifted apart.
            if disposition != Disposition.OWN:
                raise RuntimeError(
                    f"the claim began run {run_id} as own, but it was decided {disposition}"
                )
            row, sent_s = claimed.begun, claimed.sent_s
        else:
            row, sent_s = await self.db.run(begin)
        handle = RunHandle(
            run_id=run_id,
            queue=claimed.queue,
            task_id=claimed.task_id,
            engine_run_id=claimed.run_id,
            attempt=claimed.attempt,
            attempt_id=row.attempt_id,
            lease_s=seat.lease_s,
            clock=DbClock(row.db_now_ms, sent_s),
            step_keys=row.step_keys,
        )
        return Attempt(self, claimed, handle, disposition, row.checkpoint, row.current_wait,
                       row.engine_checkpoints, log)  # fmt: skip


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
        write = CheckpointWrite(h.queue, h.task_id, key, state, h.engine_run_id, h.lease_s)
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

    # -- ends ------------------------------------------------------------------

    async def park(
        self,
        engine_park: Callable[[Connection], Awaitable[tuple[bool, T]]],
        wait: dict[str, Any],
        envelope: dict[str, Any],
    ) -> tuple[bool, T]:
        """Park in ``wait`` if ``engine_park`` suspends the engine run; return what it said.

        The engine's park, the store's wait and envelope, and the attempt's end
        commit together; when the engine does not suspend, nothing ends.
        """

        async def park(conn: Connection) -> tuple[bool, T]:
            suspended, value = await engine_park(conn)
            if suspended:
                h = self.handle
                if not await self.store.attempts.park(
                    conn, run_id=h.run_id, attempt_id=h.attempt_id, wait=wait, envelope=envelope
                ):
                    raise self._lost()
                await self._close(conn, Outcome.PARKED)
            return suspended, value

        suspended, value = await self.db.transaction(park)
        if suspended:
            self.ended = True
        return suspended, value

    async def complete(self, output: Any) -> Outcome:
        """Complete the run with ``output``; a newer claim that owns it wins (lease lost)."""
        h = self.handle
        # The output was checked by json_problem (execute); the fact holds it and our
        # own strings and numbers.
        fact = facts.completed(h.run_id, output).as_json()
        encoded = None if output is None else encode_checked(output)
        write = CompletionWrite(
            h.queue, h.engine_run_id, encoded, h.run_id, self.attempt_id, encode_checked(fact)
        )
        try:
            await self._owner.group_commit.write(write)
        except LeaseLostError as lost:
            return await self.lose(lost)
        self.ended = True
        return Outcome.COMPLETED

    async def fail(self, exc: BaseException, max_attempts: int | None) -> Outcome:
        """Fail this attempt: the engine retries the run, or it was the last and fails."""
        h = self.handle
        reason = self.reason(exc)
        final = max_attempts is not None and h.attempt >= max_attempts
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
                    await self._settle(conn, facts.failed(h.run_id, reason), error=reason)
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
                    : facts.MAX_ERROR_MESSAGE_CHARS
                ],
            }
            ended = await self._unless_lost(outcome, reason, failing(reason))
        if ended == outcome:
            event = "run.failed" if final else "run.attempt_failed"
            self.log.warning(event, attempt=h.attempt, max_attempts=max_attempts, error=reason)
        return ended

    async def fail_for_good(self, exc: Exception) -> Outcome:
        """Fail the run for good (no retry): a fatal error, a wait this build cannot resume."""
        h = self.handle
        reason = {**self.reason(exc), "fatal": True}

        async def fail(conn: Connection) -> None:
            # The fenced store write first: a stale attempt must not cancel the
            # task that a newer claim now owns.
            if not await self._settle(conn, facts.failed(h.run_id, reason), error=reason):
                raise LeaseLostError(
                    "run settled or taken by a newer claim", engine_run_id=h.engine_run_id
                )
            await engine.cancel(conn, h.queue, h.task_id)

        ended = await self._unless_lost(Outcome.FAILED, reason, fail)
        if ended == Outcome.FAILED:
            self.log.error("run.failed_for_good", error=reason)
        return ended

    async def observe_cancel(self) -> Outcome:
        """The engine cancelled the run while it ran: settle it cancelled (if still ours)."""
        h = self.handle

        async def settle(conn: Connection) -> None:
            # Fenced: only while this attempt is the run's (a cancel command, `runs
            # fail` or a move settled or restamped it already, and wrote its fact).
            await self._settle(conn, facts.cancelled(h.run_id, "worker"))

        await self._end(Outcome.CANCELLED, transition=settle)
        self.log.info("run.cancelled")
        return Outcome.CANCELLED

    async def lose(self, reason: dict[str, Any] | BaseException) -> Outcome:
        """End as a lost lease: a newer claim, a move, an operator took the run."""
        if isinstance(reason, BaseException):
            self.log.warning("run.lease_lost", detail=str(reason))
            reason = facts.error_reason(reason)
        await self._end(Outcome.LEASE_LOST, reason)
        return Outcome.LEASE_LOST

    async def end_as_settled_elsewhere(self, status: str) -> Outcome:
        """End an attempt whose run was settled by someone else before it was taken over."""
        outcome = Outcome.CANCELLED if status == RunStatus.CANCELLED else Outcome.LEASE_LOST
        await self._end(outcome, {"reason": f"the run is {status}"})
        return outcome

    async def put_back(
        self, outcome: Outcome, *, delay_s: float, note: dict[str, Any] | None = None
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
                streak = await count_deferral(
                    conn, self.store, claimed, run_id,
                    alert_after_s=limits.alert_after_s, fail_after_s=limits.fail_after_s,
                    attempt_id=self.attempt_id,
                )  # fmt: skip
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

    async def hand_back_untaken(self) -> Outcome:
        """End an attempt whose begin did not take the run over, as the run's row now reads.

        Read afresh: ``begin_attempt``'s own snapshot predates the lock it waited
        for. Nothing is settled here: whoever ended or moved the run wrote its state.
        """
        h = self.handle
        row = await self.db.run(lambda c: self.store.runs.get(c, h.run_id))
        if row is not None and row.task_id != self.claimed.task_id:
            self.log.info("run.moved_away", to_queue=row.queue)
            return await self.lose({"reason": f"moved to {row.queue}"})
        if row is None or row.status in TERMINAL_STATUSES:
            status = row.status if row is not None else "gone"
            self.log.info("run.ended_elsewhere", status=status)
            return await self.end_as_settled_elsewhere(status)
        # Open and still this task's: nothing took it, so give the claim back.
        await self._end(Outcome.HANDED_BACK, {"reason": "not taken over"})
        await give_back(self._owner, self.claimed, None)
        return Outcome.HANDED_BACK

    # -- helpers -------------------------------------------------------------

    def reason(self, exc: BaseException) -> dict[str, Any]:
        """Return how ``exc`` is stored, with the database URL's secrets masked."""
        reason = facts.error_reason(exc)
        reason["message"] = mask_secrets(reason["message"], self._owner.secrets)
        return reason

    async def _settle(
        self, conn: Connection, fact: facts.TerminalFact, *, output: Any = None, error: Any = None
    ) -> bool:
        return await self.store.runs.settle(
            conn, fact.run_id, status=str(fact.status), fact=fact.as_json(),
            attempt_id=self.attempt_id, output=output, error=error,
        )  # fmt: skip

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
            return await self.lose(lost)
        return outcome
