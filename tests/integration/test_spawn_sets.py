"""lane_worker.spawn_tasks_v1 (engine contract spawn_v1) held to the engine's absurd.spawn_task.

The same tasks are spawned both ways on one queue, in one transaction rolled back
after each way, on the engine's clock held still: the task and run rows must be
the same but for their ids, and the refusals the same.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from support.runtime import connect
from worker.db import engine, engine_schema

QUEUE = "spawn_sets"
NOW = "2030-01-01T00:00:00Z"
RETRY = {"kind": "exponential", "base_seconds": 1, "factor": 2, "max_seconds": 300}
PARAMS = [{"runId": "a"}, {"runId": "b", "n": [1, 2]}, None, {}]
MAX_ATTEMPTS = [5, 1, 3, 1000]


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    c = await connect(database_url)
    await engine_schema.ensure_engine_schema(c)
    await engine.ensure_queue(c, QUEUE, record=None)
    try:
        yield c
    finally:
        await c.close()


async def rows(c: asyncpg.Connection[asyncpg.Record]) -> list[list[dict[str, Any]]]:
    """Every task and run of the queue, ids left out, in spawn order."""
    tasks = await c.fetch(
        f"select * from absurd.t_{QUEUE} order by enqueue_at, params::text, max_attempts"
    )
    runs = await c.fetch(
        f"select r.* from absurd.r_{QUEUE} r join absurd.t_{QUEUE} t using (task_id)"
        " order by t.enqueue_at, t.params::text, t.max_attempts"
    )
    ids = ("task_id", "run_id", "last_attempt_run")
    return [[{k: v for k, v in dict(r).items() if k not in ids} for r in part]
            for part in (tasks, runs)]  # fmt: skip


async def spawned(c: asyncpg.Connection[asyncpg.Record], by_set: bool) -> Any:
    tx = c.transaction()
    await tx.start()
    try:
        await c.execute(f"set local absurd.fake_now = '{NOW}'")
        if by_set:
            made = await c.fetch(
                "select * from lane_worker.spawn_tasks_v1($1, 'play-run', $2::text[]::jsonb[],"
                " $3, $4::text::jsonb)",
                QUEUE, [None if p is None else json.dumps(p) for p in PARAMS], MAX_ATTEMPTS,
                json.dumps(RETRY),
            )  # fmt: skip
            assert [m["at"] for m in made] == list(range(len(PARAMS)))
            # Each run is its task's first, and its task names it as the last attempt.
            for m in made:
                last = await c.fetchval(
                    f"select last_attempt_run from absurd.t_{QUEUE} where task_id = $1",
                    m["task_id"],
                )
                assert last == m["run_id"]
        else:
            for params, max_attempts in zip(PARAMS, MAX_ATTEMPTS, strict=True):
                await c.execute(
                    "select absurd.spawn_task($1, 'play-run', $2::text::jsonb,"
                    " jsonb_build_object('max_attempts', $3::integer,"
                    " 'retry_strategy', $4::text::jsonb))",
                    QUEUE, None if params is None else json.dumps(params), max_attempts,
                    json.dumps(RETRY),
                )  # fmt: skip
        return await rows(c)
    finally:
        await tx.rollback()


async def test_a_set_spawns_what_spawn_task_spawns(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """The same tasks and first runs, row for row, but for their ids."""
    by_engine = await spawned(conn, by_set=False)
    by_set = await spawned(conn, by_set=True)
    assert len(by_engine[0]) == len(PARAMS)
    assert by_set == by_engine


@pytest.mark.parametrize(
    ("name", "max_attempts", "retry", "message"),
    [
        (" ", [1], RETRY, "task_name must be provided"),
        ("play-run", [0], RETRY, "max_attempts must be >= 1"),
        ("play-run", [1], {"kind": "fixed", "base_seconds": -1}, None),
    ],
)
async def test_a_set_refuses_what_spawn_task_refuses(
    conn: asyncpg.Connection[asyncpg.Record],
    name: str,
    max_attempts: list[int],
    retry: dict[str, Any],
    message: str | None,
) -> None:
    """A blank name, an attempt count under 1, a bad retry strategy: spawn_task's own refusals."""
    errors = []
    for sql, args in (
        ("select absurd.spawn_task($1, $2, '{}'::jsonb, jsonb_build_object('max_attempts',"
         " $3::integer, 'retry_strategy', $4::text::jsonb))",
         (QUEUE, name, max_attempts[0], json.dumps(retry))),
        ("select * from lane_worker.spawn_tasks_v1($1, $2, array['{}'::jsonb], $3,"
         " $4::text::jsonb)",
         (QUEUE, name, max_attempts, json.dumps(retry))),
    ):  # fmt: skip
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.execute(sql, *args)
        errors.append((caught.value.sqlstate, str(caught.value)))
    assert errors[1] == errors[0]
    if message is not None:
        assert errors[0][1] == message
