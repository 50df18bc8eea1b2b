"""The one lock order (docs/DESIGN.md "Lock order"): a run's engine rows, then its store row.

Each test holds the engine's rows of a run as a completion does (absurd.complete_run
locks them first), starts a path that also locks the run's store row, waits until it
waits, then takes the store row as the completion's settle does. In the one order the
path waits for the completion and goes on; in the other it holds the store row while it
waits, and Postgres aborts one side (40P01). Neither may be aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from structlog.testing import capture_logs

from support.db import run_row, sql
from support.plays import RemedyPlays, remedies_app
from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    work_once,
)

REL = "rel-lock"


async def race_a_completion(
    database_url: str, run_id: str, path: Callable[[], Awaitable[Any]], waits_as: str
) -> Any:
    """Hold the run's engine rows, start ``path``, take the store row once it waits.

    ``waits_as``: a pattern of the statement ``path`` waits in (pg_stat_activity).
    """
    row = await run_row(database_url, run_id)
    completing = await connect(database_url)
    errors: list[Any] = []
    try:
        tx = completing.transaction()
        await tx.start()
        await completing.execute(
            f"select 1 from absurd.r_{row['queue']} where task_id = $1 for update",
            row["task_id"],
        )
        with capture_logs() as lines:
            racing = asyncio.ensure_future(path())
            await eventually(
                lambda: sql(
                    database_url,
                    "select count(*) > 0 from pg_stat_activity"
                    " where wait_event_type = 'Lock' and query ~ $1",
                    waits_as,
                )
            )
            try:
                await completing.execute(
                    f"select 1 from {SCHEMA}.runs where run_id = $1 for update", row["run_id"]
                )
                await tx.commit()
            except asyncpg.DeadlockDetectedError as exc:
                errors.append(exc)
                await tx.rollback()
            try:
                said = await racing
            except asyncpg.DeadlockDetectedError as exc:
                errors.append(exc)
                said = None
    finally:
        await completing.close()
    # A deadlock the client's retry hid is one too (its db.retry says so).
    errors += [line for line in lines if line.get("error") == "DeadlockDetectedError"]
    assert errors == []
    return said


async def test_a_signal_racing_a_completion_waits(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """signal_run's engine event wakes the parked run's engine rows: it locks them first."""
    async with (
        open_client(database_url, env_of(REL)) as client,
        open_runtime(database_url, remedies_app(remedy_plays), REL) as rt,
    ):
        run = await client.submit("waiter")
        assert await work_once(rt) == ["parked"]
        said = await race_a_completion(
            database_url,
            run.run_id,
            lambda: client.signal(run.run_id, "go", {"by": "race"}),
            "signal_run",
        )
        assert said is not None
        assert not said.duplicate
        assert await work_once(rt) == ["completed"]
        assert (await run_row(database_url, run.run_id))["status"] == "completed"


async def test_runs_fail_racing_a_completion_waits(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """`runs fail` locks the run, then cancels its engine task: the engine's rows first."""
    async with open_client(database_url, env_of(REL)) as client:
        run = await client.submit("plain", {"k": 1})
        said = await race_a_completion(
            database_url,
            run.run_id,
            lambda: client.fail_run(run.run_id, "race"),
            "run_row_engine_first|cancel_task",  # as it waits now, as it waited before
        )
        assert said is True
        row = await run_row(database_url, run.run_id)
        assert row["status"] == "failed"
        facts = await sql(
            database_url,
            f"select count(*) from {SCHEMA}.ledger where run_id = $1 and type = 'run.failed'",
            row["run_id"],
        )
        assert facts == 1
