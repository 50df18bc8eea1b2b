"""Maintenance: a bounded engine cleanup pass and the reconciler, one worker at a time."""

from __future__ import annotations

import structlog

from worker import engine
from worker.db import Connection, Database
from worker.reconcile import reconcile_queue
from worker.store import Store

log = structlog.get_logger("lane_worker.maintenance")

# pg_try_advisory_xact_lock key of the maintenance pass ("lwmaint"): transaction
# scoped, so it also holds under PgBouncer transaction pooling.
_MAINTENANCE_LOCK_KEY = 0x6C77_6D61_696E_7400


async def maintain(db: Database, store: Store, *, worker_id: str) -> bool:
    """Run one pass if no other worker is running one; return whether this one ran."""

    async def cleanup(conn: Connection) -> list[str] | None:
        if not await conn.fetchval("select pg_try_advisory_xact_lock($1)", _MAINTENANCE_LOCK_KEY):
            return None
        # cleanup_all_queues deletes at most each queue's cleanup_limit per call.
        for queue, tasks, events in await engine.cleanup(conn):
            if tasks or events:
                log.info("maintenance.cleaned", queue=queue, tasks=tasks, events=events)
        queues: list[str] = [
            r["queue"] for r in await conn.fetch(f"select queue from {store.schema_sql}.releases")
        ]
        return queues

    queues = await db.transaction(cleanup)
    if queues is None:
        return False
    for queue in queues:
        await reconcile_queue(db, store, queue, worker_id=worker_id)
    return True
