"""Beginning an attempt: a claim recorded as an attempt row, the run taken over.

``Attempts.begin`` records a claim as an attempt row; for own and adopt it also
moves the run's fence to that row. The ``Attempt`` it returns
(``worker/run/attempt.py``) is the only code that ends it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import structlog

from worker.config.dburl import url_secrets
from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store import Store
from worker.db.store.rows import Begun
from worker.metrics import Metrics
from worker.run.attempt import Attempt
from worker.run.group_commit import GroupCommit
from worker.run.handle import STEP_KEYS_CURRENT, DbClock, RunHandle, WorkerSeat
from worker.states import Disposition

Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True)
class DeferLimits:
    """LANE_WORKER_DEFER_ALERT_AFTER, LANE_WORKER_DEFER_FAIL_AFTER (0: never fail) and
    LANE_WORKER_UNKNOWN_PLAY_GRACE (how long a play no machine registered is waited for)."""

    alert_after_s: float
    fail_after_s: float = 0.0
    unknown_play_grace_s: float = 600.0


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
        then end with ``HandBack`` (``Attempt.end``).
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
        return Attempt(
            self,
            claimed,
            handle,
            disposition,
            row.checkpoint,
            row.current_wait,
            row.engine_checkpoints,
            log,
        )
