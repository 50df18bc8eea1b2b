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

from support.runtime import SCHEMA, connect, eventually, one_step_app, open_client, open_runtime
from worker.client import LaneClient
from worker.db.engine import ClaimedRun
from worker.db.pool import Connection
from worker.db.store.attempts import CheckpointWrite
from worker.run.execute import Runtime
from worker.run.group_commit import BatchWrite, GroupCommit
from worker.states import Outcome

RELEASE = "rel-gc"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_gc"
N = 6
HOLD_S = 60.0  # a group wait that outlasts the test: queued writes wait for the first


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
    gc.group_wait_s = HOLD_S  # the others wait for the held write, however long it takes
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


class NotingGroupCommit(GroupCommit):
    """A ``GroupCommit`` that notes the name of each checkpoint it sends alone."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent_alone: list[str] = []

    async def _write_alone(self, conn: Connection, write: BatchWrite) -> None:
        if isinstance(write, CheckpointWrite):
            self.sent_alone.append(write.name)
        await super()._write_alone(conn, write)


def checkpoint_write(gc: GroupCommit, run: ClaimedRun, name: str) -> Any:
    """``gc.write`` of checkpoint ``name`` for ``run``."""
    return gc.write(CheckpointWrite(QUEUE, run.task_id, name, '{"by": "test"}', run.run_id, 30))


async def checkpoint_names(url: str, runs: list[ClaimedRun]) -> list[str]:
    """The checkpoints of ``runs`` (on a connection of its own: the pool's may be held)."""
    conn = await connect(url)
    try:
        rows = await conn.fetch(
            f'select checkpoint_name from absurd."c_{QUEUE}" where task_id = any($1::uuid[])',
            [r.task_id for r in runs],
        )
    finally:
        await conn.close()
    return sorted(r["checkpoint_name"] for r in rows)


async def batch_waits_for_a_lock(url: str) -> bool:
    """Tell whether a batch statement waits for a lock now."""
    conn = await connect(url)
    try:
        return bool(
            await conn.fetchval(
                "select count(*) from pg_stat_activity where datname = current_database()"
                " and wait_event_type = 'Lock' and query like '%write_checkpoints%'"
            )
        )
    finally:
        await conn.close()


async def test_a_batch_refused_whole_falls_back_to_one_statement_each(
    database_url: str,
) -> None:
    """A value the server refuses fails the whole statement: each write then goes alone."""
    async with claimed_runs(database_url, 2) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store, group_wait_s=HOLD_S)
        async with engine_row_locked(database_url, runs[0]):
            held = asyncio.create_task(checkpoint_write(gc, runs[0], "first"))
            await first_sent(gc)
            good = asyncio.create_task(checkpoint_write(gc, runs[1], "good"))
            # jsonb refuses \u0000: the batch's one parameter, and so all of it (its own
            # statement, a text parameter, is refused as a NUL byte).
            bad = asyncio.create_task(checkpoint_write(gc, runs[1], "bad\x00name"))
            await eventually(holds(lambda: gc.waiting == 2), timeout_s=10, what="two writes queued")
        await held
        await good
        with pytest.raises(asyncpg.CharacterNotInRepertoireError):
            await bad
        assert await checkpoint_names(database_url, runs) == ["first", "good"]


async def test_a_write_whose_caller_was_cancelled_is_not_sent(database_url: str) -> None:
    """A caller cancelled while its write waited: nothing of it reaches the database."""
    async with claimed_runs(database_url, 2) as (_, rt, _, runs):
        gc = NotingGroupCommit(rt.db, rt.store, group_wait_s=HOLD_S)
        async with engine_row_locked(database_url, runs[0]):
            held = asyncio.create_task(checkpoint_write(gc, runs[0], "first"))
            await first_sent(gc)
            dropped = asyncio.create_task(checkpoint_write(gc, runs[1], "dropped"))
            await eventually(holds(lambda: gc.waiting == 1), timeout_s=10, what="queued")
            dropped.cancel()
            with pytest.raises(asyncio.CancelledError):
                await dropped
        await held
        await eventually(holds(lambda: not gc.busy), timeout_s=10, what="the flusher idle")
        assert gc.sent_alone == ["first"]
        assert await checkpoint_names(database_url, runs) == ["first"]


async def test_a_blocked_write_holds_up_no_other_run(database_url: str) -> None:
    """One write waits for a lock alone, another in a batch: a third run's write still commits.

    The queued writes go after the group wait, not when the blocked one returns, and
    in the batch the blocked write gives up its lock wait and goes again in a later one.
    """
    async with claimed_runs(database_url, 3) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store, group_wait_s=0.05)
        async with (
            engine_row_locked(database_url, runs[0]),
            engine_row_locked(database_url, runs[1]),
        ):
            first = asyncio.create_task(checkpoint_write(gc, runs[0], "first"))
            await first_sent(gc)
            second = asyncio.create_task(checkpoint_write(gc, runs[1], "second"))
            # Committed while both locks are still held: held up by neither.
            await asyncio.wait_for(checkpoint_write(gc, runs[2], "third"), 10)
            assert gc.largest == 2  # "second" and "third" went as one batch
            assert await checkpoint_names(database_url, runs) == ["third"]
            # Each of the others still waits for its lock.
            assert not first.done()
            assert not second.done()
        await first
        await second
        assert await checkpoint_names(database_url, runs) == ["first", "second", "third"]


async def test_a_caller_cancelled_mid_batch_returns_only_once_the_batch_ended(
    database_url: str,
) -> None:
    """Its write cannot commit after its caller (and the claim's hand-back) went on."""
    async with claimed_runs(database_url, 3) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store, group_wait_s=0.05, lock_wait_ms=30_000)
        async with engine_row_locked(database_url, runs[0]):
            first = asyncio.create_task(checkpoint_write(gc, runs[0], "first"))
            await first_sent(gc)
            async with engine_row_locked(database_url, runs[1]):
                second = asyncio.create_task(checkpoint_write(gc, runs[1], "second"))
                third = asyncio.create_task(checkpoint_write(gc, runs[2], "third"))
                await eventually(
                    lambda: batch_waits_for_a_lock(database_url), timeout_s=10,
                    what="the batch of second and third waiting for second's lock",
                )  # fmt: skip
                third.cancel()
                done, _ = await asyncio.wait({third}, timeout=0.5)
                assert not done  # it waits for its batch, which waits for the lock
            # The lock is gone: the batch commits both, then the cancel completes.
            with pytest.raises(asyncio.CancelledError):
                await third
            assert await checkpoint_names(database_url, runs) == ["second", "third"]
            await second
        await first


async def test_writes_waiting_for_locks_leave_the_pool_to_the_others(database_url: str) -> None:
    """Three runs' rows stay locked: their writes wait without taking the pool's two connections.

    One waits in its own statement (it went with nothing else in flight); the
    two that failed their lock wait in a batch go again in later batches after a
    backoff, each holding a connection for the lock wait only. A fourth run's
    write and any other statement still get a connection meanwhile.
    """
    async with claimed_runs(database_url, 4) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store, group_wait_s=0.05)
        async with (
            engine_row_locked(database_url, runs[0]),
            engine_row_locked(database_url, runs[1]),
            engine_row_locked(database_url, runs[2]),
        ):
            first = asyncio.create_task(checkpoint_write(gc, runs[0], "first"))
            await first_sent(gc)
            blocked = [
                asyncio.create_task(checkpoint_write(gc, runs[1], "second")),
                asyncio.create_task(checkpoint_write(gc, runs[2], "third")),
            ]
            # Both have failed a lock wait at least once and wait to go again.
            await eventually(
                holds(lambda: gc.flushes >= 3), timeout_s=10, what="the blocked writes retried"
            )
            for _ in range(5):
                await asyncio.wait_for(rt.db.fetchval("select 1"), 5)
                await asyncio.wait_for(checkpoint_write(gc, runs[3], "fourth"), 5)
            assert await checkpoint_names(database_url, runs) == ["fourth"]
            assert not first.done()
            assert not any(b.done() for b in blocked)
        await asyncio.wait_for(first, 10)
        await asyncio.wait_for(asyncio.gather(*blocked), 10)
        assert await checkpoint_names(database_url, runs) == ["first", "fourth", "second", "third"]


async def test_a_lone_write_queued_behind_a_blocked_one_waits_without_a_connection(
    database_url: str,
) -> None:
    """The only write of its batch, while another waits for a lock alone: its wait is bounded too.

    Handed back to its caller it waited for its lock in a statement of its own,
    and the two blocked writes held both of the pool's connections.
    """
    async with claimed_runs(database_url, 2) as (_, rt, _, runs):
        gc = GroupCommit(rt.db, rt.store, group_wait_s=0.05)
        async with (
            engine_row_locked(database_url, runs[0]),
            engine_row_locked(database_url, runs[1]),
        ):
            first = asyncio.create_task(checkpoint_write(gc, runs[0], "first"))
            await first_sent(gc)
            second = asyncio.create_task(checkpoint_write(gc, runs[1], "second"))
            await eventually(
                holds(lambda: gc.flushes >= 3), timeout_s=10, what="the lone write retried"
            )
            for _ in range(5):
                await asyncio.wait_for(rt.db.fetchval("select 1"), 5)
            assert not first.done()
            assert not second.done()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert await checkpoint_names(database_url, runs) == ["first", "second"]
