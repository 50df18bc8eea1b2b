"""The engine task every run rides, its retry policy, and the NOTIFY that wakes a lane."""

from __future__ import annotations

import uuid
from typing import Any

from worker.db.pool import Connection

PLAY_RUN_TASK = "play-run"
# Always a delay > 0, so every retry is a `sleeping` run that passes the
# continuation fence (and is deferred there, never adopted).
RETRY_STRATEGY: dict[str, Any] = {
    "kind": "exponential",
    "base_seconds": 1,
    "factor": 2,
    "max_seconds": 300,
}


# Registry changes (a lane retired, activated, moved): every worker re-reads the lanes.
LANES_CHANNEL = "lane_worker_lanes"


def notify_channel(queue: str) -> str:
    """Return the NOTIFY channel a queue's workers listen on."""
    return f"lane_worker_{queue}"


async def notify(conn: Connection, queue: str, run_id: uuid.UUID | str) -> None:
    """Wake the workers of ``queue`` (delivered when the transaction commits)."""
    await conn.execute("select pg_notify($1, $2)", notify_channel(queue), str(run_id))
