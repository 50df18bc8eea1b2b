"""A simulated TypeScript system in lane-worker's database (the seed's): its tasks, store, engine.

It does what the TS app does through the vendored Absurd SDK, in SQL: spawns its
own tasks with ``absurd.spawn_task`` (on lane-worker's lane queues when release
ids coincide, or on its own), claims and completes them as its worker would,
keeps store tables named like lane-worker's, and patches ``absurd.claim_task``.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import absurdctl
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
            # Objects: the connection's codec encodes them (a json.dumps here stored a
            # JSON string, whose ->> 'runId' is null).
            params if params is not None else {"from": "typescript"},
            {"max_attempts": 3},
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
            "select absurd.complete_run($1, $2, $3::jsonb)", queue, run_id, {"ok": True}
        )
    finally:
        await conn.close()


# -- the TS app's vendored engine ----------------------------------------------------------

# The TS app's patch of claim_task (its continuation fence), as one added statement.
FENCE_MARK = "continuation fence (vendored patch g)"
_CREATE = r"create\s+(?:or\s+replace\s+)?function\s+absurd\.{name}\s*\(.*?\$\$.*?\$\$;"
# What absurdctl's migration to the newest engine replaces: an engine "at" an older
# version has Absurd's own bodies of these (the test database is at the newest).
UPGRADED = ("get_schema_version", "ensure_queue_tables", "claim_task")


def stock_sql(name: str, version: str) -> str:
    """Return Absurd's own ``create function absurd.NAME`` statement at ``version``."""
    steps = absurdctl.discover_bundled_migrations()
    path = absurdctl.resolve_migration_path("0.0.8", version, steps) or []
    pattern = re.compile(_CREATE.format(name=name), re.IGNORECASE | re.DOTALL)
    found = [m.group(0) for step in path for m in pattern.finditer(step["sql"])]
    return re.sub(r"^create\s+function", "create or replace function", found[-1], flags=re.I)


def patched(statement: str) -> str:
    """Return ``statement`` with the TS app's fence added at the start of its body."""
    fence = (
        f"begin\n  -- {FENCE_MARK}\n"
        "  if p_worker_id like '%:continuations' and p_qty > 1000 then\n"
        "    raise exception 'fenced';\n  end if;\n"
    )
    return statement.replace("begin\n", fence, 1)


async def install_engine(database_url: str, version: str, *, patch: bool) -> None:
    """Make the engine look as the TS app left it: Absurd ``version``, claim_task patched or not."""
    conn = await connect(database_url)
    try:
        for name in UPGRADED:
            statement = stock_sql(name, version)
            await conn.execute(patched(statement) if patch and name == "claim_task" else statement)
    finally:
        await conn.close()


async def engine_state(database_url: str) -> tuple[str, bool]:
    """Return the engine's version and whether its claim_task carries the TS app's fence."""
    conn = await connect(database_url)
    try:
        version: str = await conn.fetchval("select absurd.get_schema_version()")
        body: str = await conn.fetchval(
            "select prosrc from pg_proc where oid = 'absurd.claim_task(text,text,integer,integer)'"
            "::regprocedure"
        )
        return version, FENCE_MARK in body
    finally:
        await conn.close()
