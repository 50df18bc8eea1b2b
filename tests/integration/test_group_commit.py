"""Group commit (worker/run/group_commit.py) on real Postgres.

The writes of runs in flight that wait for a flush go together in one statement;
each still gets its own outcome: a write that fails (its run cancelled) raises for
its run alone, and a batch the server refuses as a whole falls back to one
statement per write. The first write of each test is held by a row lock taken
from another connection, so the others queue behind it deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from support.runtime import SCHEMA, connect, eventually, open_client, open_runtime
from worker import App, TaskContext
from worker.client import LaneClient
from worker.db.engine import ClaimedRun
from worker.db.pool import Connection
from worker.run.execute import Runtime
from worker.run.group_commit import GroupCommit
from worker.states import Outcome

RELEASE = "rel-gc"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_gc"
N = 6


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``predicate`` as the awaitable check ``eventually`` takes."""

    async def check() -> bool:
        return predicate()

    return check


async def first_sent(gc: GroupCommit) -> None:
    """Wait until the first write is in a flush (held by the lock) and none waits yet."""
    await eventually(
        holds(lambda: gc.busy and gc.waiting == 0), timeout_s=10, what="the first flush sent"
    )


def one_step_app() -> App:
    app = App()

    @app.play("one")
    async def one(ctx: TaskContext, params: dict[str, Any]) -> dict[str, int]:
        return await ctx.step("s", lambda: {"n": params["n"]})  # type: ignore[no-any-return]

    return app


@contextlib.asynccontextmanager
async def engine_row_locked(url: str, run: ClaimedRun) -> AsyncIterator[None]:
    """Hold the engine run row of ``run`` locked, so a write that extends its lease waits."""
    conn = await connect(url)
    try:
        async with conn.transaction():
            await conn.execute(
                f'select 1 from absurd."r_{QUEUE}" where run_id = $1 for update', run.run_id
            )
            yield
    finally:
        await conn.close()


async def claim_all(rt: Runtime, n: int) -> list[ClaimedRun]:
    async def claimed() -> list[ClaimedRun] | None:
        batch = await rt.claim(QUEUE, n)
        return batch.runs or None

    runs: list[ClaimedRun] = await eventually(claimed, timeout_s=10, what="runs to claim")
    assert len(runs) == n
    return runs


@contextlib.asynccontextmanager
async def claimed_runs(
    url: str, n: int
) -> AsyncIterator[tuple[LaneClient, Runtime, list[str], list[ClaimedRun]]]:
    """``n`` runs of the one-step play submitted and claimed: client, runtime, ids, claims."""
    async with (
        open_client(url, ENV) as client,
        open_runtime(url, one_step_app(), RELEASE) as rt,
    ):
        ids = [(await client.submit("one", {"n": i})).run_id for i in range(n)]
        yield client, rt, ids, await claim_all(rt, n)


async def queued_behind_first(
    rt: Runtime, runs: list[ClaimedRun], url: str, during: Any = None
) -> list[Any]:
    """Handle ``runs``: the first one's step write held, the others' queued behind it."""
    gc = rt.attempts.group_commit
    async with engine_row_locked(url, runs[0]):
        first = asyncio.create_task(rt.handle(runs[0]))
        await eventually(
            holds(lambda: gc.busy and gc.waiting == 0),
            timeout_s=10,
            what="the first flush sent",
        )
        rest = [asyncio.create_task(rt.handle(r)) for r in runs[1:]]
        await eventually(
            holds(lambda: gc.waiting == len(rest)), timeout_s=10, what="the others' writes queued"
        )
        if during is not None:
            await during()
    return list(await asyncio.gather(first, *rest, return_exceptions=True))


async def test_writes_in_flight_commit_together(database_url: str) -> None:
    """Five step checkpoints wait for one flush: they go as one batch, and every run completes."""
    async with claimed_runs(database_url, N) as (client, rt, ids, runs):
        handled = await queued_behind_first(rt, runs, database_url)
        assert [h.outcome for h in handled] == [Outcome.COMPLETED] * N
        gc = rt.attempts.group_commit
        assert gc.largest >= N - 1
        assert gc.flushes < 2 * N  # fewer round trips than one per write
        for n, run_id in enumerate(ids):
            status = await client.status(run_id)
            assert (status.status, status.output) == ("completed", {"n": n})
        # Exactly one checkpoint per run, each with its run's own value.
        rows = await rt.db.fetch(
            f'select state from absurd."c_{QUEUE}" where task_id = any($1::uuid[])',
            [r.task_id for r in runs],
        )
        assert sorted(r["state"]["n"] for r in rows) == list(range(N))


async def test_a_cancelled_run_in_a_batch_fails_no_other(database_url: str) -> None:
    """One run of the batch is cancelled while its write waits: only that run ends cancelled."""
    async with claimed_runs(database_url, N) as (client, rt, ids, runs):
        victim = runs[3]
        victim_id = await rt.db.fetchval(
            f"select run_id::text from {SCHEMA}.runs where task_id = $1", victim.task_id
        )

        async def cancel() -> None:
            assert await client.cancel(victim_id, reason="test")

        handled = await queued_behind_first(rt, runs, database_url, during=cancel)
        outcomes = {str(r.task_id): h.outcome for r, h in zip(runs, handled, strict=True)}
        assert outcomes.pop(str(victim.task_id)) == Outcome.CANCELLED
        assert set(outcomes.values()) == {Outcome.COMPLETED}
        assert rt.attempts.group_commit.largest >= N - 1
        for run_id in ids:
            want = "cancelled" if run_id == victim_id else "completed"
            assert (await client.status(run_id)).status == want


async def test_a_batch_refused_whole_falls_back_to_one_statement_each(
    database_url: str,
) -> None:
    """A value the server refuses fails the whole statement: each write then goes alone."""
    async with claimed_runs(database_url, 2) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store)

        def checkpoint(run: ClaimedRun, name: str) -> tuple[dict[str, Any], Any]:
            entry = {"k": "checkpoint", "q": QUEUE, "t": str(run.task_id), "n": name,
                     "r": str(run.run_id), "s": {"by": "test"}, "x": 30}  # fmt: skip

            async def alone(conn: Connection) -> None:
                await conn.execute(
                    "select absurd.set_task_checkpoint_state($1, $2, $3, $4, $5, 30)",
                    QUEUE, run.task_id, name, {"by": "test"}, run.run_id,
                )  # fmt: skip

            return entry, alone

        async with engine_row_locked(database_url, runs[0]):
            held = asyncio.create_task(gc.write(*checkpoint(runs[0], "first")))
            await first_sent(gc)
            good = asyncio.create_task(gc.write(*checkpoint(runs[1], "good")))
            # jsonb refuses \u0000: the batch's one parameter, and so all of it (its own
            # statement, a text parameter, is refused as a NUL byte).
            bad = asyncio.create_task(gc.write(*checkpoint(runs[1], "bad\x00name")))
            await eventually(holds(lambda: gc.waiting == 2), timeout_s=10, what="two writes queued")
        await held
        await good
        with pytest.raises(asyncpg.CharacterNotInRepertoireError):
            await bad
        names = await rt.db.fetch(
            f'select checkpoint_name from absurd."c_{QUEUE}" where task_id = any($1::uuid[])',
            [r.task_id for r in runs],
        )
        assert sorted(r["checkpoint_name"] for r in names) == ["first", "good"]


async def test_a_write_whose_caller_was_cancelled_is_not_sent(database_url: str) -> None:
    """A caller cancelled while its write waited: nothing of it reaches the database."""
    async with claimed_runs(database_url, 2) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store)
        sent: list[str] = []

        def write(run: ClaimedRun, name: str) -> Any:
            async def alone(conn: Connection) -> None:
                sent.append(name)
                await conn.execute(
                    "select absurd.set_task_checkpoint_state($1, $2, $3, $4, $5, 30)",
                    QUEUE, run.task_id, name, {"by": "test"}, run.run_id,
                )  # fmt: skip

            entry = {"k": "checkpoint", "q": QUEUE, "t": str(run.task_id), "n": name,
                     "r": str(run.run_id), "s": {"by": "test"}, "x": 30}  # fmt: skip
            return gc.write(entry, alone)

        async with engine_row_locked(database_url, runs[0]):
            held = asyncio.create_task(write(runs[0], "first"))
            await first_sent(gc)
            dropped = asyncio.create_task(write(runs[1], "dropped"))
            await eventually(holds(lambda: gc.waiting == 1), timeout_s=10, what="queued")
            dropped.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dropped
        await held
        await eventually(holds(lambda: not gc.busy), timeout_s=10, what="the flusher idle")
        assert sent == ["first"]
        count = await rt.db.fetchval(
            f'select count(*) from absurd."c_{QUEUE}" where checkpoint_name = $1', "dropped"
        )
        assert count == 0
