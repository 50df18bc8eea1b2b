"""The reconciler: every engine-terminal task gets a terminal store row and one fact."""

from __future__ import annotations

import structlog

from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store import Store
from worker.states import RunStatus

log = structlog.get_logger("lane_worker.reconcile")

RECONCILE_BATCH = 100


async def reconcile_queue(
    db: Database, store: Store, queue: str, *, worker_id: str, max_batches: int | None = None
) -> int:
    """Give every engine-terminal (or vanished) task on ``queue`` its terminal store row.

    The engine can end a task by itself (an expired lease on the last attempt,
    a cancellation policy); each such run gets exactly one ledger fact here.
    Works in batches of ``RECONCILE_BATCH`` runs, one transaction each, until none
    is left (or ``max_batches``), so a mass lease expiry is settled within one
    maintenance pass. Returns how many runs it settled.
    """
    total, batches = 0, 0
    while True:
        found, settled = await db.transaction(
            lambda c: settle_batch(c, store, queue, worker_id=worker_id)
        )
        total, batches = total + settled, batches + 1
        # A short batch was the last; a batch that settled nothing would repeat itself.
        if found < RECONCILE_BATCH or settled == 0 or batches == max_batches:
            return total


async def settle_batch(
    conn: Connection, store: Store, queue: str, *, worker_id: str
) -> tuple[int, int]:
    """Settle up to ``RECONCILE_BATCH`` engine-ended runs of ``queue``; return (found, settled)."""
    settled = 0
    rows = await engine.ended_tasks(conn, queue, store_schema=store.schema, limit=RECONCILE_BATCH)
    for row in rows:
        run_id, state = row.run_id, row.state
        if state == RunStatus.COMPLETED:
            status, output, error = RunStatus.COMPLETED, row.completed_payload, None
        elif state == RunStatus.CANCELLED:
            status, output, error = RunStatus.CANCELLED, None, None
        else:
            status, output = RunStatus.FAILED, None
            error = row.failure_reason or {
                "name": "EngineTaskMissing",
                "message": "the engine task is gone (cleaned up) before the run settled",
            }
        if await store.runs.settle(
            conn,
            run_id,
            status=str(status),
            source="reconciler",
            attempt_id=None,
            output=output,
            error=error,
        ):
            settled += 1
            log.warning(
                "run.reconciled",
                run_id=str(run_id),
                release_id=row.release_id,
                queue=queue,
                worker_id=worker_id,
                status=status,
            )
    return len(rows), settled
