"""Bounded, visible deferral: a run put back again and again is counted, then reported.

A continuation loop defers a run it may not run (not parked, or a play its app
lacks) 30 s at a time. Each deferral adds to the run's current streak (reset
when a worker takes the run over); past the alert age one warning and a
metric name the run and its lane, and past the fail age (off by default) the
run fails for good with that reason and its one terminal fact.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import structlog

from worker.db import engine
from worker.db.pool import Connection
from worker.db.store import Store
from worker.metrics import Metrics
from worker.states import RunStatus

Log = structlog.typing.FilteringBoundLogger

DEFER_LIMIT_ERROR = "DeferralLimitExceeded"


@dataclass(frozen=True)
class Streak:
    """A run's deferral streak after counting one more deferral."""

    count: int
    age_s: float
    alert: bool  # this deferral crossed the alert age: warn once
    failed: dict[str, Any] | None = None  # the reason, when it failed the run for good


async def count_deferral(
    conn: Connection,
    store: Store,
    claimed: engine.ClaimedRun,
    run_id: uuid.UUID,
    *,
    alert_after_s: float,
    fail_after_s: float,
    attempt_id: int,
) -> Streak:
    """Count one deferral of ``run_id`` (in the put-back's transaction); fail it past the limit.

    Returns a ``Streak`` whose ``failed`` is set when the run was failed for good:
    the caller then must not reschedule it.
    """
    row = await store.attempts.count_deferral(conn, run_id=run_id, alert_after_s=alert_after_s)
    streak = Streak(row.defer_count, float(row.deferred_s), bool(row.alert_now))
    if not fail_after_s or streak.age_s < fail_after_s:
        return streak
    reason = {
        "name": DEFER_LIMIT_ERROR,
        "message": f"run {run_id} was deferred {streak.count} times over {streak.age_s:.0f} s "
        f"(LANE_WORKER_DEFER_FAIL_AFTER={fail_after_s:g}): no release that may run it took it",
        "fatal": True,
    }
    # Unfenced (no attempt of ours runs it), but this claim holds the engine run.
    if await store.runs.settle(
        conn,
        run_id,
        status=str(RunStatus.FAILED),
        source="worker",
        attempt_id=None,
        error=reason,
        own_attempt_id=attempt_id,
    ):
        await engine.cancel(conn, claimed.queue, claimed.task_id)
    return Streak(streak.count, streak.age_s, streak.alert, reason)


def report_streak(streak: Streak, log: Log, metrics: Metrics | None, queue: str) -> None:
    """Warn once when a streak crossed the alert age; say when it failed the run."""
    if streak.alert:
        log.warning(
            "run.deferred_too_long",
            defer_count=streak.count,
            deferred_s=round(streak.age_s),
            remedy="no release that may run it takes it: see `lane-worker lanes show` for "
            "its lane's blockers",
        )
        if metrics is not None:
            metrics.long_deferrals.labels(queue=queue).inc()
    if streak.failed is not None:
        log.error("run.failed_for_good", error=streak.failed)
