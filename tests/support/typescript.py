"""A simulated TypeScript system in lane-worker's database (the seed's): its tasks, store, engine.

It does what the TS app does through the vendored Absurd SDK, in SQL: spawns its
own tasks with ``absurd.spawn_task`` (on lane-worker's lane queues when release
ids coincide, or on its own), claims and completes them as its worker would,
keeps store tables named like lane-worker's, and patches ``absurd.claim_task``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from support.db import connect

TS_WORKER = "ts-worker-1"
TS_TASK = "ts-other-task"


async def spawn(
    database_url: str, queue: str, name: str = TS_TASK, params: dict[str, Any] | None = None
) -> uuid.UUID:
    """Spawn a task of the TS app on ``queue`` (created as the TS app does, if missing)."""
    conn = await connect(database_url)
    try:
        if not await conn.fetchval(
            "select exists (select 1 from absurd.queues where queue_name = $1)", queue
        ):
            await conn.execute("select absurd.create_queue($1)", queue)
        task_id: uuid.UUID = await conn.fetchval(
            "select task_id from absurd.spawn_task($1, $2, $3::jsonb, $4::jsonb)",
            queue,
            name,
            json.dumps(params if params is not None else {"from": "typescript"}),
            json.dumps({"max_attempts": 3}),
        )
        return task_id
    finally:
        await conn.close()


async def task_runs(database_url: str, queue: str, task_id: uuid.UUID) -> list[dict[str, Any]]:
    """The engine runs of a task, oldest first, with their task's state and attempts."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            f"select r.run_id, r.attempt, r.state, r.claimed_by, t.state as task_state,"
            f" t.attempts as task_attempts, r.available_at > absurd.current_time() as later"
            f' from absurd."r_{queue}" r join absurd."t_{queue}" t using (task_id)'
            f" where r.task_id = $1 order by r.attempt",
            task_id,
        )
        return [dict(r) for r in rows]
    finally:
        await conn.close()


async def claim(database_url: str, queue: str, worker_id: str = TS_WORKER) -> list[asyncpg.Record]:
    """Claim what is due on ``queue`` as the TS worker's poll loop does."""
    conn = await connect(database_url)
    try:
        return await conn.fetch(
            "select run_id, task_id, attempt, task_name from absurd.claim_task($1, $2, 30, 10)",
            queue,
            worker_id,
        )
    finally:
        await conn.close()


async def complete(database_url: str, queue: str, run_id: uuid.UUID) -> None:
    """Complete a run the TS worker claimed."""
    conn = await connect(database_url)
    try:
        await conn.execute(
            "select absurd.complete_run($1, $2, $3::jsonb)", queue, run_id, '{"ok": true}'
        )
    finally:
        await conn.close()
