"""The engine task every run rides, its retry policy, and the NOTIFY that wakes a lane."""

from __future__ import annotations

import uuid

from worker.db.pool import Connection

PLAY_RUN_TASK = "play-run"
# The engine task's retry policy (always a delay > 0: every retry is a sleeping
# run, which the continuation fence defers) is set where the task is spawned:
# the store's spawn_run_task (migration 0008).


# Registry changes (a lane retired, activated, moved): every worker re-reads the lanes.
LANES_CHANNEL = "lane_worker_lanes"
# A ledger fact waits for delivery (sent by the store's ledger_outbox trigger).
LEDGER_CHANNEL = "lane_worker_ledger"


def notify_channel(queue: str) -> str:
    """Return the NOTIFY channel a queue's workers listen on."""
    return f"lane_worker_{queue}"


async def notify(conn: Connection, queue: str, run_id: uuid.UUID | str) -> None:
    """Wake the workers of ``queue`` (delivered when the transaction commits)."""
    await conn.execute("select pg_notify($1, $2)", notify_channel(queue), str(run_id))
