"""A row another session holds locked holds up its own run's claim, never the whole claim.

An operator's open transaction (`begin; select ... for update`) on a due run's
engine task row or store row: the claim statement waited for it, and with it
every claim of the worker (review, 2026-12-06). Now the claim skips a run whose
engine rows it cannot lock, as the engine's own claim does, and leaves a run
whose store row is locked to be begun after the claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from support.runtime import SCHEMA, connect, one_step_app, open_client, open_runtime
from worker.app import App
from worker.db import engine
from worker.run.context import TaskContext

RELEASE = "rel-locks"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_locks"
BOUND_S = 5  # a claim that waited for the lock would wait for the test's whole hold


@contextlib.asynccontextmanager
async def row_locked(url: str, sql: str, *args: Any) -> AsyncIterator[None]:
    """Hold the rows ``sql`` selects locked (``for update``) in another session."""
    conn = await connect(url)
    try:
        async with conn.transaction():
            assert await conn.fetch(sql + " for update", *args)
            yield
    finally:
        await conn.close()


async def test_a_locked_engine_task_row_holds_up_only_its_own_run(database_url: str) -> None:
    """The claim hands out the other due run at once; the locked one once the lock is gone."""
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, one_step_app(), RELEASE) as rt,
    ):
        first = await client.submit("one", {"n": 1})
        second = await client.submit("one", {"n": 2})
        locked = await rt.db.fetchval(
            f"select task_id from {SCHEMA}.runs where run_id = $1::uuid", first.run_id
        )
        sql = f'select 1 from absurd."t_{QUEUE}" where task_id = $1'
        async with row_locked(database_url, sql, locked):
            batch = await asyncio.wait_for(rt.claim(QUEUE, 4), BOUND_S)
            other = await rt.db.fetchval(
                f"select task_id from {SCHEMA}.runs where run_id = $1::uuid", second.run_id
            )
            assert [r.task_id for r in batch.runs] == [other]
            for claimed in batch.runs:
                await rt.handle(claimed)
        batch = await asyncio.wait_for(rt.claim(QUEUE, 4), BOUND_S)
        assert [r.task_id for r in batch.runs] == [locked]
        await rt.handle(batch.runs[0])
        for run in (first, second):
            assert (await client.status(run.run_id)).status == "completed"


async def test_a_locked_store_row_is_claimed_but_begun_after_the_claim(database_url: str) -> None:
    """The claim returns at once; the run whose store row is locked is not begun in it."""
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, one_step_app(), RELEASE) as rt,
    ):
        first = await client.submit("one", {"n": 1})
        second = await client.submit("one", {"n": 2})
        sql = f"select 1 from {SCHEMA}.runs where run_id = $1::uuid"
        async with row_locked(database_url, sql, first.run_id):
            batch = await asyncio.wait_for(rt.claim(QUEUE, 4), BOUND_S)
            begun = {str(r.lane.run_id): r.begun is not None for r in batch.runs if r.lane}
            assert begun == {first.run_id: False, second.run_id: True}
        for claimed in batch.runs:
            await rt.handle(claimed)
        for run in (first, second):
            assert (await client.status(run.run_id)).status == "completed"


async def test_a_locked_task_row_holds_up_only_its_own_expired_lease(database_url: str) -> None:
    """The sweep of expired leases skips a run whose task row is locked, and sweeps the rest."""
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, one_step_app(), RELEASE) as rt,
    ):
        runs = [await client.submit("one", {"n": n}) for n in range(2)]
        async with rt.db.pool.acquire() as conn:
            claimed = (await engine.claim(conn, QUEUE, "gone-worker", lease_s=30, qty=2)).runs
            assert len(claimed) == 2
            await conn.execute(
                f"update absurd.\"r_{QUEUE}\" set claim_expires_at = now() - interval '1 second'"
            )
        locked = claimed[0].task_id
        sql = f'select 1 from absurd."t_{QUEUE}" where task_id = $1'
        async with row_locked(database_url, sql, locked):
            batch = await asyncio.wait_for(rt.claim(QUEUE, 4), BOUND_S)
            assert batch.swept == 1
        states = dict(
            await rt.db.fetch(
                f'select task_id, state from absurd."r_{QUEUE}" where run_id = any($1::uuid[])',
                [r.run_id for r in claimed],
            )
        )
        assert states == {locked: "running", claimed[1].task_id: "failed"}
        assert len(runs) == 2  # both submitted, both claimed by the worker that went away


async def test_a_short_lease_outlives_its_row_locked_across_two_of_the_keepers_turns(
    database_url: str,
) -> None:
    """A 5 s lease whose engine row another session holds from 1 s to 3.9 s is extended in time.

    The keeper extends every third of the lease; a try that found the row locked
    went again 2 s later, so the tries at 1.7 s and 3.7 s both failed and the next
    came after the lease had ended (CI's chaos test: another worker swept it, and
    the run spent an attempt).
    """
    app = App()

    @app.play("long")
    async def long(ctx: TaskContext, params: dict[str, Any]) -> str:
        async def wait() -> str:
            await asyncio.sleep(6)
            return "done"

        return await ctx.step("wait", wait)  # type: ignore[no-any-return]

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE, lease_s=5) as rt,
    ):
        run = await client.submit("long", {})
        (claimed,) = (await rt.claim(QUEUE, 1)).runs
        handling = asyncio.create_task(rt.handle(claimed))
        await asyncio.sleep(1.0)
        sql = f'select 1 from absurd."r_{QUEUE}" where run_id = $1'
        async with row_locked(database_url, sql, claimed.run_id):
            await asyncio.sleep(2.9)  # the lock spans two of the keeper's turns
        await asyncio.sleep(0.9)  # 4.8 s after the claim: the first lease ends in 0.2 s
        left = await rt.db.fetchval(
            f'select extract(epoch from claim_expires_at - now()) from absurd."r_{QUEUE}"'
            " where run_id = $1",
            claimed.run_id,
        )
        assert left > 1.0, left
        await asyncio.wait_for(handling, 30)
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert len(status.attempts) == 1
