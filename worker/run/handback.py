"""Giving a claim back without spending an attempt: after a cancel, an error, or at shutdown.

``HandBack`` is mixed into ``Runtime``. Every give-back is fenced by the
claim's attempt row and the engine lease: a claim that already ended (parked,
completed, failed, put back) is never touched, and one whose lease is gone is
left to its new holder.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import anyio
import structlog

from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store import Store, quote_ident
from worker.db.tasks import PLAY_RUN_TASK, notify

log = structlog.get_logger("lane_worker.runtime")

HAND_BACK_TIMEOUT_S = 10.0


def really_cancelled() -> bool:
    """Tell whether this task is being cancelled (a drain), not handed a stray CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


# A claim given back after an unexpected error waits this long before it is due
# again: an error that repeats must not become a busy loop of claims.
ERROR_HAND_BACK_DELAY_S = 10.0


@dataclass
class Claim:
    """What is known so far of one claim being handled; decides its give-back."""

    run_id: uuid.UUID | None = None
    attempt_id: int | None = None
    ended: bool = False


class HandBack:
    """The give-back paths of ``Runtime`` (which provides the attributes below)."""

    db: Database
    store: Store
    release_id: str
    lease_s: int

    def worker_id_for(self, queue: str) -> str:  # pragma: no cover - Runtime's
        raise NotImplementedError

    async def give_back(
        self, claimed: engine.ClaimedRun, attempt_id: int | None, *, delay_s: float = 0.0
    ) -> bool:
        """Give an unfinished claim back, due in ``delay_s``: no attempt spent; say if it was.

        Fenced by the claim's attempt row: when the attempt already ended (the
        run parked, completed, failed or was put back, and the caller did not
        hear of it), nothing changes. A claim with no attempt row yet (it ended
        before recording one) is given back by its engine lease alone.
        """
        worker_id = self.worker_id_for(claimed.queue)

        async def give(conn: Connection) -> bool:
            # The engine row first: the same lock order as every other final write.
            held = await engine.lock_if_held(conn, claimed.queue, claimed.run_id, worker_id)
            closed = await self.store.fetch(
                conn, "hand_back_claim", claimed.task_id, claimed.run_id, worker_id,
                "handed_back" if held else "lease_lost",
            )  # fmt: skip
            if attempt_id is not None and attempt_id not in {r["attempt_id"] for r in closed}:
                return False
            if held:
                await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
                if delay_s <= 0:
                    await notify(conn, claimed.queue, claimed.task_id)
            return held

        given: bool = await self.db.transaction(give)
        return given

    async def give_back_leftovers(self, queues: list[str]) -> int:
        """Give back every engine run this worker still holds on ``queues``; return how many.

        Called once claiming and handling have stopped: a claim that committed
        while its loop was being cancelled never reached a handler, and would
        otherwise wait for its lease to expire (spending an attempt).
        """
        given = 0
        for queue in queues:
            worker_id = self.worker_id_for(queue)
            rows = await self.db.fetch(
                f"select run_id, task_id, attempt from absurd.{quote_ident('r_' + queue)}"
                " where state = 'running' and claimed_by = $1",
                worker_id,
            )
            for row in rows:
                claimed = engine.ClaimedRun(
                    queue=queue,
                    run_id=row["run_id"],
                    task_id=row["task_id"],
                    attempt=row["attempt"],
                    task_name=PLAY_RUN_TASK,
                    params=None,
                    max_attempts=None,
                    wake_event=None,
                    event_payload=None,
                )
                if await self.give_back(claimed, None):
                    given += 1
                    log.warning(
                        "run.handed_back",
                        queue=queue,
                        release_id=self.release_id,
                        task_id=str(row["task_id"]),
                        worker_id=worker_id,
                        attempt=row["attempt"],
                        cause="left over at shutdown",
                    )
        return given

    async def _give_back_after(
        self, claimed: engine.ClaimedRun, claim: Claim, exc: BaseException
    ) -> None:
        """Give the claim back after ``exc`` cut its handling short (shielded, bounded)."""
        bound = log.bind(
            queue=claimed.queue,
            release_id=self.release_id,
            task_id=str(claimed.task_id),
            run_id=str(claim.run_id) if claim.run_id else None,
            worker_id=self.worker_id_for(claimed.queue),
        )
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class()) and really_cancelled()
        delay_s = 0.0 if cancelled else ERROR_HAND_BACK_DELAY_S
        with anyio.move_on_after(HAND_BACK_TIMEOUT_S, shield=True) as scope:
            try:
                given = await self.give_back(claimed, claim.attempt_id, delay_s=delay_s)
            except Exception as failure:
                bound.warning("run.hand_back_failed", error=repr(failure), lease_s=self.lease_s)
                return
        if scope.cancelled_caught:  # the database is away: the lease expiry takes over
            bound.warning("run.hand_back_timed_out", lease_s=self.lease_s)
        elif given:
            bound.info(
                "run.handed_back",
                attempt=claimed.attempt,
                cause=type(exc).__name__,
                due_in_s=delay_s,
            )
