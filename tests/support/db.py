"""One query on a connection of its own: staging a database and reading what it holds.

Every helper opens a plain connection with the JSON codecs lane-worker's pool uses
(:func:`support.runtime.connect`), runs one statement and closes it, so a test can
read or stage the database between any two steps of the code under test.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from support.runtime import SCHEMA, connect, eventually

LIVENESS_S = 60  # the report counts a worker live for 60 s after its last heartbeat
TERMINAL = ("completed", "failed", "cancelled")


async def sql(database_url: str, statement: str, *args: Any) -> Any:
    """Run one statement on a connection of its own; return its first value."""
    conn = await connect(database_url)
    try:
        return await conn.fetchval(statement, *args)
    finally:
        await conn.close()


async def execute(database_url: str, statement: str, *args: Any) -> str:
    """Run one statement on a connection of its own; return its status (``UPDATE 1``)."""
    conn = await connect(database_url)
    try:
        return await conn.execute(statement, *args)
    finally:
        await conn.close()


async def fetch(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on a connection of its own; return its rows."""
    conn = await connect(database_url)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def run_row(database_url: str, run_id: str) -> dict[str, Any]:
    """Return a run's store row (with its deferral streak)."""
    conn = await connect(database_url)
    try:
        row = await conn.fetchrow(f"select * from {SCHEMA}.runs where run_id = $1::uuid", run_id)
    finally:
        await conn.close()
    assert row is not None, run_id
    return dict(row)


async def backdate_heartbeats(
    database_url: str, queue: str, seconds: float = LIVENESS_S + 1
) -> str:
    """Make the workers of ``queue`` look as if their last heartbeat was ``seconds`` ago.

    A SIGKILLed machine stops beating; the report counts it live for 60 s more, so
    the default makes them gone without waiting that minute out. Returns the status.
    """
    return await execute(
        database_url,
        f"update {SCHEMA}.workers set heartbeat_at = now() - make_interval(secs => $2::float8)"
        " where queue = $1",
        queue,
        seconds,
    )


async def age_worker(database_url: str, worker_id: str) -> str:
    """Make a worker's heartbeat two minutes old: it reads as gone (killed). Returns the status."""
    return await execute(
        database_url,
        f"update {SCHEMA}.workers set heartbeat_at = now() - interval '2 minutes'"
        " where worker_id = $1",
        worker_id,
    )


async def make_sleepers_due(database_url: str, queue: str) -> None:
    """Make every sleeping engine run of ``queue`` due now (retry backoffs, short naps)."""
    await sql(
        database_url,
        f"update absurd.r_{queue} set available_at = now() where state = 'sleeping'",
    )


async def wake_nap(database_url: str, queue: str, run_id: str, boundary: str = "nap") -> None:
    """Make a run's durable sleep ``boundary`` due now, as if its time had passed.

    Both move: the wake time armed in the run's stored envelope (which the resumed
    play compares with the database's clock) and the engine run's due time, so the
    run resumes and ends its sleep rather than parking again. Tests park runs in
    naps of an hour and end them with this, instead of racing a short nap.
    """
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            now_ms = "to_jsonb((extract(epoch from now()) * 1000)::bigint)"
            task_id = await conn.fetchval(
                f"update {SCHEMA}.runs"
                f" set checkpoint = jsonb_set(checkpoint, array['armedWaits', $2, 'wakeAtMs'],"
                f" {now_ms}), current_wait = jsonb_set(current_wait, '{{wakeAtMs}}', {now_ms})"
                " where run_id = $1::uuid and checkpoint->'armedWaits' ? $2"
                " returning task_id",
                run_id,
                boundary,
            )
            assert task_id is not None, f"run {run_id} is not parked in {boundary!r}"
            moved = await conn.execute(
                f"update absurd.r_{queue} set available_at = now()"
                " where task_id = $1 and state = 'sleeping'",
                task_id,
            )
            assert moved == "UPDATE 1", moved
    finally:
        await conn.close()


async def engine_runs_due(database_url: str, queue: str, run_id: str, *, in_s: float) -> None:
    """Move a run's sleeping engine run's due time to ``in_s`` seconds from now.

    Staging only the engine's timer (the store is untouched, and the report reads
    only the store): a retry's 1 s backoff or a 30 s defer must not decide what a
    later claim in the test is handed.
    """
    moved = await sql(
        database_url,
        f"with moved as (update absurd.r_{queue} r"
        " set available_at = now() + make_interval(secs => $2::float8)"
        f" from {SCHEMA}.runs s"
        " where s.run_id = $1::uuid and r.task_id = s.task_id and r.state = 'sleeping'"
        " returning 1) select count(*) from moved",
        run_id,
        in_s,
    )
    assert moved == 1, f"run {run_id} has no sleeping engine run on {queue}"


async def attempt_rows(database_url: str, run_id: str) -> list[dict[str, Any]]:
    """Return a run's attempt rows (every column), oldest first."""
    rows = await fetch(
        database_url,
        f"select * from {SCHEMA}.attempts where run_id = $1::uuid order by attempt_id",
        run_id,
    )
    return [dict(r) for r in rows]


async def statuses(database_url: str, run_ids: list[str]) -> dict[str, str]:
    """Return the store status of each run."""
    rows = await fetch(
        database_url,
        f"select run_id::text, status from {SCHEMA}.runs where run_id = any($1::uuid[])",
        run_ids,
    )
    return {row["run_id"]: row["status"] for row in rows}


async def all_ended(database_url: str, run_ids: list[str], *, timeout_s: float = 60) -> None:
    """Wait until every run is in a terminal status."""

    async def ended() -> bool:
        found = await statuses(database_url, run_ids)
        return len(found) == len(run_ids) and all(s in TERMINAL for s in found.values())

    await eventually(ended, timeout_s=timeout_s, what=f"{len(run_ids)} runs to end")
