"""Maintenance: a bounded engine cleanup pass and the reconciler, one worker at a time.

Every queue is maintained on its own: a queue that fails is logged
(``maintenance.queue_failed``) and counted (``lane_worker_maintenance_errors_total``),
and the pass goes on with the next one. A database outage ends the pass (it
raises), since every other queue would fail the same way.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from worker.db import engine
from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store
from worker.db.store.rows import MaintainedLane
from worker.metrics import Metrics
from worker.run.reconcile import reconcile_queue
from worker.states import LaneStatus

log = structlog.get_logger("lane_worker.maintenance")

# pg_try_advisory_xact_lock key of the maintenance pass ("lwmaint"): transaction
# scoped, so it also holds under PgBouncer transaction pooling.
_MAINTENANCE_LOCK_KEY = 0x6C77_6D61_696E_7400
# Open attempts of dead workers closed per pass (a chaos roll leaves a handful).
ATTEMPT_SWEEP_BATCH = 1000


async def maintain(
    db: Database, store: Store, *, worker_id: str, metrics: Metrics | None = None
) -> bool:
    """Run one pass if no other worker is running one; return whether this one ran."""

    async def cleanup(conn: Connection) -> tuple[list[tuple[str, str]], list[Any]] | None:
        if not await conn.fetchval("select pg_try_advisory_xact_lock($1)", _MAINTENANCE_LOCK_KEY):
            return None
        failed: list[tuple[str, str]] = []
        for queue in await engine.queue_names(conn):
            try:
                # A savepoint per queue: a broken queue's error leaves the others' cleanup.
                async with conn.transaction():
                    # Deletes at most the queue's cleanup_limit per call.
                    for name, tasks, events in await engine.cleanup(conn, queue):
                        if tasks or events:
                            log.info("maintenance.cleaned", queue=name, tasks=tasks, events=events)
            except Exception as exc:
                if is_transient(exc):
                    raise
                failed.append((queue, repr(exc)))
        registry = await store.lanes.for_maintenance(conn)
        return failed, registry

    outcome = await db.transaction(cleanup)
    if outcome is None:
        return False
    failed_cleanups, registry = outcome
    # Logged once the transaction committed: a retried transaction must not count twice.
    for queue, error in failed_cleanups:
        _queue_failed(metrics, queue, worker_id, "cleanup", error)
    await reconcile_lanes(db, store, registry, worker_id=worker_id, metrics=metrics)
    # After the reconcile: a run it just ended may leave a dead worker's attempt open.
    closed = await db.run(lambda c: store.attempts.close_abandoned(c, limit=ATTEMPT_SWEEP_BATCH))
    if closed:
        log.info("maintenance.attempts_closed", worker_id=worker_id, attempts=len(closed))
    return True


async def reconcile_lanes(
    db: Database,
    store: Store,
    registry: list[MaintainedLane],
    *,
    worker_id: str,
    metrics: Metrics | None = None,
) -> None:
    """Reconcile the queue of each lane in ``registry`` (maintenance's second step)."""
    for lane in registry:
        queue = lane.queue
        if not lane.engine_queue:
            # Left by a `lanes retire` of an older build (usually a mistyped release
            # id): there are no engine tables, so nothing can end there.
            command = "retire" if lane.status == LaneStatus.RETIRED else "activate"
            release_id = (lane.release_ids or [queue])[0]
            _queue_failed(
                metrics, queue, worker_id, "reconcile", "the lane has no engine queue",
                remedy=f"`lane-worker lanes {command} {release_id}` creates it",
            )  # fmt: skip
            continue
        try:
            await reconcile_queue(db, store, queue, worker_id=worker_id)
        except asyncpg.UndefinedTableError as exc:
            if await db.run(lambda c, q=queue: engine.queue_exists(c, q)):  # type: ignore[misc]
                _queue_failed(metrics, queue, worker_id, "reconcile", repr(exc))
            else:
                # `lanes prune` dropped the queue since the registry was read: its
                # runs were all settled, so there is nothing to reconcile.
                log.info("maintenance.queue_dropped", queue=queue, worker_id=worker_id)
        except Exception as exc:
            if is_transient(exc):
                raise
            _queue_failed(metrics, queue, worker_id, "reconcile", repr(exc))


def _queue_failed(
    metrics: Metrics | None, queue: str, worker_id: str, step: str, error: str, **extra: str
) -> None:
    if metrics is not None:
        metrics.maintenance_errors.labels(queue=queue).inc()
    log.error(
        "maintenance.queue_failed",
        queue=queue,
        worker_id=worker_id,
        step=step,
        error=error,
        **extra,
    )
