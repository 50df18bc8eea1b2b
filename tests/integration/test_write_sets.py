"""The set-based batch writes (store 0027, engine contract writes_v1) held to the engine's.

Each test lays out one history of runs on a real database (live, cancelled,
failed, unknown, fenced off, a retry that owns a checkpoint), then writes the
same batch twice inside one transaction, rolled back after each: once write by
write through the engine's own functions (``absurd.set_task_checkpoint_state``,
the store's ``complete_attempt``, each in a savepoint as ``write_batch`` did),
once as the set-based statement. Both must fail the same writes with the same
SQLSTATE and leave the same rows, the engine clock held still so timestamps
compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, eventually, one_step_app, open_client, open_runtime
from worker.db.engine import ClaimedRun
from worker.run.execute import Runtime

RELEASE = "rel-ws"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_ws"
OTHER = "runs_rel_ws_other"  # a second queue in the same batch
NOW = "2030-01-01T00:00:00Z"  # the engine's clock while both ways write

Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record]"


@contextlib.asynccontextmanager
async def claimed(url: str, n: int) -> AsyncIterator[tuple[Runtime, list[ClaimedRun]]]:
    """``n`` runs of the one-step play submitted and claimed (begun as own)."""
    async with (
        open_client(url, ENV) as client,
        open_runtime(url, one_step_app(), RELEASE) as rt,
    ):
        for i in range(n):
            await client.submit("one", {"n": i})

        async def claim() -> list[ClaimedRun] | None:
            batch = await rt.claim(QUEUE, n)
            return batch.runs or None

        runs: list[ClaimedRun] = await eventually(claim, what="runs to claim")
        assert len(runs) == n
        assert all(r.begun is not None for r in runs)
        yield rt, runs


async def both_ways(
    conn: Conn,
    one_by_one: Callable[[], Awaitable[dict[int, str]]],
    as_a_set: Callable[[], Awaitable[dict[int, str]]],
    snapshot: Callable[[], Awaitable[Any]],
) -> tuple[tuple[dict[int, str], Any], tuple[dict[int, str], Any]]:
    """Run each way in a savepoint rolled back after: (its failures, the rows it left).

    Both in one transaction, so the store's now() is the same for both.
    """
    results = []
    outer = conn.transaction()
    await outer.start()
    try:
        await conn.execute(f"set local absurd.fake_now = '{NOW}'")
        for way in (one_by_one, as_a_set):
            tx = conn.transaction()
            await tx.start()
            try:
                failed = await way()
                results.append((failed, await snapshot()))
            finally:
                await tx.rollback()
    finally:
        await outer.rollback()
    return results[0], results[1]


async def each_alone(conn: Conn, calls: list[tuple[str, tuple[Any, ...]]]) -> dict[int, str]:
    """Run each statement in a savepoint of its own: the SQLSTATE of those that failed."""
    failed: dict[int, str] = {}
    for at, (sql, args) in enumerate(calls):
        try:
            async with conn.transaction():
                await conn.execute(sql, *args)
        except asyncpg.PostgresError as exc:
            failed[at] = exc.sqlstate
    return failed


async def spawn_and_claim(conn: Conn, queue: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A task of another system's on ``queue``, claimed: (its task, its run)."""
    await conn.execute("select absurd.create_queue($1)", queue)
    await conn.execute("select absurd.spawn_task($1, 'other', '{}'::jsonb)", queue)
    row = await conn.fetchrow("select * from absurd.claim_task($1, 'w', 30, 1)", queue)
    assert row is not None
    return row["task_id"], row["run_id"]


@pytest.fixture
async def history(database_url: str) -> AsyncIterator[tuple[Conn, list[ClaimedRun]]]:
    async with claimed(database_url, 6) as (_, runs):
        conn = await connect(database_url)
        try:
            yield conn, runs
        finally:
            await conn.close()


async def test_checkpoints_as_a_set_write_what_the_engine_writes(
    history: tuple[Conn, list[ClaimedRun]],
) -> None:
    """Every path of set_task_checkpoint_state: ok, null state, cancelled, failed, older attempt,
    unknown run, blank name, one checkpoint twice, no extension, a second queue."""
    conn, runs = history
    r = f'absurd."r_{QUEUE}"'
    t = f'absurd."t_{QUEUE}"'
    # r1's task cancelled, r2 failed: what a cancel or the sweep leaves.
    await conn.execute(f"update {t} set state = 'cancelled' where task_id = $1", runs[1].task_id)
    await conn.execute(f"update {r} set state = 'failed' where run_id = $1", runs[2].run_id)
    # r3's task has a newer attempt that wrote checkpoint "s": r3 (attempt 1), not
    # yet swept, writes "s" after it and must not replace it.
    newer = uuid.uuid4()
    await conn.execute(
        f"insert into {r} (run_id, task_id, attempt, state, available_at) "
        "values ($1, $2, 2, 'running', now())",
        newer, runs[3].task_id,
    )  # fmt: skip
    await conn.execute(
        "select absurd.set_task_checkpoint_state($1, $2, 's', '\"newer\"', $3)",
        QUEUE, runs[3].task_id, newer,
    )  # fmt: skip
    other_task, other_run = await spawn_and_claim(conn, OTHER)
    writes = [
        (QUEUE, runs[0].task_id, "a", json.dumps({"v": 1}), runs[0].run_id, 30),
        (QUEUE, runs[0].task_id, "b", None, runs[0].run_id, None),
        (QUEUE, runs[1].task_id, "a", "1", runs[1].run_id, 30),
        (QUEUE, runs[2].task_id, "a", "1", runs[2].run_id, 30),
        (QUEUE, runs[3].task_id, "s", '"older"', runs[3].run_id, 30),
        (QUEUE, runs[4].task_id, "a", "1", uuid.uuid4(), 30),
        (QUEUE, runs[4].task_id, " ", "1", runs[4].run_id, 30),
        (QUEUE, runs[5].task_id, "dup", "1", runs[5].run_id, 60),
        (QUEUE, runs[5].task_id, "dup", "2", runs[5].run_id, 0),
        (OTHER, other_task, "a", '"there"', other_run, 45),
        (OTHER, other_task, "a", "1", runs[0].run_id, 30),
    ]

    async def one_by_one() -> dict[int, str]:
        sql = "select absurd.set_task_checkpoint_state($1, $2, $3, $4::text::jsonb, $5, $6)"
        return await each_alone(conn, [(sql, w) for w in writes])

    async def as_a_set() -> dict[int, str]:
        cols = list(zip(*writes, strict=True))
        rows = await conn.fetch(
            f"select * from {SCHEMA}.write_checkpoints(50, $1::text[], $2::uuid[], $3::text[],"
            " $4::text[]::jsonb[], $5::uuid[], $6::integer[])",
            *[list(c) for c in cols],
        )
        return {row["write_at"]: row["error_code"] for row in rows}

    async def snapshot() -> Any:
        rows = []
        for q in (QUEUE, OTHER):
            rows.append(await conn.fetch(
                f'select task_id, checkpoint_name, state, status, owner_run_id, updated_at'
                f' from absurd."c_{q}" order by 1, 2'
            ))  # fmt: skip
            rows.append(await conn.fetch(
                f'select run_id, state, claim_expires_at from absurd."r_{q}" order by 1'
            ))  # fmt: skip
        return [[dict(x) for x in part] for part in rows]

    (failed_one, rows_one), (failed_set, rows_set) = await both_ways(
        conn, one_by_one, as_a_set, snapshot
    )
    assert failed_one == {2: "AB001", 3: "AB002", 5: "P0001", 6: "P0001", 10: "P0001"}
    assert failed_set == failed_one
    assert rows_set == rows_one


async def test_completions_as_a_set_write_what_complete_attempt_writes(
    history: tuple[Conn, list[ClaimedRun]],
) -> None:
    """Every path of complete_attempt: ok, null output, cancelled, failed, a lost fence, a
    settled run, an unknown engine run, and another open attempt closed as lost."""
    conn, runs = history
    r = f'absurd."r_{QUEUE}"'
    s = f"{SCHEMA}.runs"
    store_runs = {
        c.run_id: await conn.fetchval(
            f"select run_id from {s} where task_id = $1", c.task_id
        )
        for c in runs
    }  # fmt: skip
    await conn.execute(f"update {r} set state = 'cancelled' where run_id = $1", runs[1].run_id)
    await conn.execute(f"update {r} set state = 'failed' where run_id = $1", runs[2].run_id)
    # r3's fence moved on (a newer claim's attempt), r4 already settled.
    await conn.execute(
        f"update {s} set current_attempt_id = current_attempt_id + 100000 where run_id = $1",
        store_runs[runs[3].run_id],
    )
    await conn.execute(
        f"update {s} set status = 'cancelled' where run_id = $1", store_runs[runs[4].run_id]
    )
    # r0 has an older attempt that recorded no end: the settle closes it as lost.
    await conn.execute(
        f"insert into {SCHEMA}.attempts (run_id, engine_run_id, attempt, worker_id, release_id,"
        " disposition) select run_id, $2, 0, worker_id, release_id, disposition"
        f" from {SCHEMA}.attempts where attempt_id = $1",
        runs[0].begun.attempt_id if runs[0].begun else None, uuid.uuid4(),
    )  # fmt: skip

    def write(
        c: ClaimedRun, output: str | None, engine_run: uuid.UUID | None = None
    ) -> tuple[Any, ...]:
        assert c.begun is not None
        fact = json.dumps({"type": "run.completed", "runId": str(store_runs[c.run_id])})
        return (QUEUE, engine_run or c.run_id, output, store_runs[c.run_id], c.begun.attempt_id,
                fact)  # fmt: skip

    writes = [
        write(runs[0], json.dumps({"o": 1})),
        write(runs[1], "1"),
        write(runs[2], "1"),
        write(runs[3], "1"),
        write(runs[4], "1"),
        write(runs[5], None, engine_run=uuid.uuid4()),
        write(runs[5], None),
    ]

    async def one_by_one() -> dict[int, str]:
        sql = (f"select {SCHEMA}.complete_attempt($1, $2, $3::text::jsonb, $4, $5,"
               " $6::text::jsonb)")  # fmt: skip
        return await each_alone(conn, [(sql, w) for w in writes])

    async def as_a_set() -> dict[int, str]:
        cols = list(zip(*writes, strict=True))
        rows = await conn.fetch(
            f"select * from {SCHEMA}.write_completions(50, $1::text[], $2::uuid[],"
            " $3::text[]::jsonb[], $4::uuid[], $5::bigint[], $6::text[]::jsonb[])",
            *[list(c) for c in cols],
        )
        return {row["write_at"]: row["error_code"] for row in rows}

    async def snapshot() -> Any:
        parts = [
            f"select run_id, state, completed_at, result from {r} order by 1",
            f'select task_id, state, completed_payload, last_attempt_run from absurd."t_{QUEUE}"'
            " order by 1",
            f'select run_id from absurd."w_{QUEUE}" order by 1',
            f"select run_id, status, output, error, current_wait, finished_at, updated_at,"
            f" current_attempt_id from {s} order by 1",
            f"select run_id, type, fact from {SCHEMA}.ledger order by run_id, type",
            f"select attempt_id, outcome, error, finished_at from {SCHEMA}.attempts order by 1",
        ]
        return [[dict(x) for x in await conn.fetch(p)] for p in parts]

    (failed_one, rows_one), (failed_set, rows_set) = await both_ways(
        conn, one_by_one, as_a_set, snapshot
    )
    assert failed_one == {1: "AB001", 2: "AB002", 3: "LW001", 4: "LW001", 5: "P0001"}
    assert failed_set == failed_one
    assert rows_set == rows_one


async def test_a_completion_whose_rows_are_locked_fails_alone(
    history: tuple[Conn, list[ClaimedRun]], database_url: str
) -> None:
    """A run whose store row another session holds: 55P03 for it, the others complete."""
    conn, runs = history
    locker = await connect(database_url)
    try:
        store_run = await locker.fetchval(
            f"select run_id from {SCHEMA}.runs where task_id = $1", runs[0].task_id
        )
        tx = locker.transaction()
        await tx.start()
        await locker.execute(f"select 1 from {SCHEMA}.runs where run_id = $1 for update", store_run)
        writes = []
        for c in runs[:3]:
            assert c.begun is not None
            sr = await conn.fetchval(
                f"select run_id from {SCHEMA}.runs where task_id = $1", c.task_id
            )
            writes.append(
                (QUEUE, c.run_id, "1", sr, c.begun.attempt_id, '{"type": "run.completed"}')
            )
        cols = [list(c) for c in zip(*writes, strict=True)]
        rows = await asyncio.wait_for(conn.fetch(
            f"select * from {SCHEMA}.write_completions(50, $1::text[], $2::uuid[],"
            " $3::text[]::jsonb[], $4::uuid[], $5::bigint[], $6::text[]::jsonb[])",
            *cols,
        ), 60)  # fmt: skip
        await tx.rollback()
    finally:
        await locker.close()
    assert {row["write_at"]: row["error_code"] for row in rows} == {0: "55P03"}
    statuses = await conn.fetch(
        f"select status from {SCHEMA}.runs where run_id = any($1::uuid[]) order by run_id",
        cols[3],
    )
    assert sorted(x["status"] for x in statuses) == ["completed", "completed", "running"]
