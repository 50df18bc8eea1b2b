"""Giving a claim back without spending an attempt: after a cancel, an error, or at shutdown.

Every give-back is fenced by the claim's attempt row and the engine lease: a
claim whose attempt already ended (parked, completed, failed, put back) is
never touched, and one whose lease is gone is left to its new holder. The
attempt rows it closes are closed by the one store statement that returns the
run to its lane (``hand_back_claim``).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import structlog

from worker.config.stopping import HAND_BACK_TIMEOUT_S
from worker.db import engine
from worker.db.pool import Connection
from worker.db.tasks import PLAY_RUN_TASK, notify
from worker.states import Outcome

if TYPE_CHECKING:  # attempt.py builds on this module
    from worker.run.attempt import Attempt
    from worker.run.begin import Attempts

log = structlog.get_logger("lane_worker.runtime")

# A claim given back after an unexpected error waits this long before it is due
# again: an error that repeats must not become a busy loop of claims.
ERROR_HAND_BACK_DELAY_S = 10.0


def really_cancelled() -> bool:
    """Tell whether this task is being cancelled (a drain), not handed a stray CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass
class Claim:
    """What is known so far of one claim being handled; decides its give-back."""

    run_id: uuid.UUID | None = None
    attempt: Attempt | None = None
    ended: bool = False  # ended without an attempt (an orphan task cancelled)

    @property
    def open(self) -> bool:
        return not self.ended and (self.attempt is None or not self.attempt.ended)


async def give_back(
    attempts: Attempts, claimed: engine.ClaimedRun, attempt_id: int | None, *, delay_s: float = 0.0
) -> bool:
    """Give an unfinished claim back, due in ``delay_s``: no attempt spent; say if it was.

    Fenced by the claim's attempt row: when the attempt already ended (the run
    parked, completed, failed or was put back, and the caller did not hear of
    it), nothing changes. A claim with no attempt row yet (it ended before
    recording one) is given back by its engine lease alone.
    """
    worker_id = attempts.seat.worker_id_for(claimed.queue)
    store = attempts.store

    async def give(conn: Connection) -> bool:
        # The engine row first: the same lock order as every other final write.
        held = await engine.lock_if_held(conn, claimed.queue, claimed.run_id, worker_id)
        outcome = Outcome.HANDED_BACK if held else Outcome.LEASE_LOST
        closed = await store.attempts.hand_back_claim(
            conn,
            task_id=claimed.task_id,
            engine_run_id=claimed.run_id,
            worker_id=worker_id,
            outcome=str(outcome),
        )
        if attempt_id is not None and attempt_id not in closed:
            return False
        if held:
            await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
            if delay_s <= 0:
                await notify(conn, claimed.queue, claimed.task_id)
        return held

    given: bool = await attempts.db.transaction(give)
    return given


async def give_back_leftovers(attempts: Attempts, queues: list[str]) -> int:
    """Give back every engine run this worker still holds on ``queues``; return how many.

    Called once claiming and handling have stopped: a claim that committed
    while its loop was being cancelled never reached a handler, and would
    otherwise wait for its lease to expire (spending an attempt).
    """
    given = 0
    for queue in queues:
        worker_id = attempts.seat.worker_id_for(queue)
        rows = await attempts.db.run(
            lambda c, q=queue, w=worker_id: engine.held(c, q, w)  # type: ignore[misc]
        )
        for row in rows:
            claimed = engine.ClaimedRun(
                queue=queue,
                run_id=row.run_id,
                task_id=row.task_id,
                attempt=row.attempt,
                task_name=PLAY_RUN_TASK,
                params=None,
                max_attempts=None,
                wake_event=None,
                event_payload=None,
            )
            if await give_back(attempts, claimed, None):
                given += 1
                log.warning(
                    "run.handed_back",
                    queue=queue,
                    release_id=attempts.seat.release_id,
                    task_id=str(row.task_id),
                    worker_id=worker_id,
                    attempt=row.attempt,
                    cause="left over at shutdown",
                )
    return given


async def give_back_after(
    attempts: Attempts, claimed: engine.ClaimedRun, claim: Claim, exc: BaseException
) -> None:
    """Give the claim back after ``exc`` cut its handling short (shielded, bounded)."""
    seat = attempts.seat
    bound = log.bind(
        queue=claimed.queue,
        release_id=seat.release_id,
        task_id=str(claimed.task_id),
        run_id=str(claim.run_id) if claim.run_id else None,
        worker_id=seat.worker_id_for(claimed.queue),
    )
    cancelled = isinstance(exc, anyio.get_cancelled_exc_class()) and really_cancelled()
    delay_s = 0.0 if cancelled else ERROR_HAND_BACK_DELAY_S
    attempt_id = claim.attempt.attempt_id if claim.attempt is not None else None
    with anyio.move_on_after(HAND_BACK_TIMEOUT_S, shield=True) as scope:
        try:
            given = await give_back(attempts, claimed, attempt_id, delay_s=delay_s)
        except Exception as failure:
            bound.warning("run.hand_back_failed", error=repr(failure), lease_s=seat.lease_s)
            return
    if scope.cancelled_caught:  # the database is away: the lease expiry takes over
        bound.warning("run.hand_back_timed_out", lease_s=seat.lease_s)
    elif given:
        bound.info(
            "run.handed_back", attempt=claimed.attempt, cause=type(exc).__name__, due_in_s=delay_s
        )
