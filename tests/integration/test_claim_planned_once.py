"""The static claims are planned once per connection, not on every call.

PostgreSQL's own choice re-planned the own loop's claim (``sql/engine/own_claim.sql``)
at each call, and asyncpg did not even keep it prepared once a release id of a dozen
characters or more made its text longer than asyncpg's 15 KiB default: about 5 ms of
planning a claim under a steady load (bench/README.md). ``pg_prepared_statements``
(PostgreSQL 14 and later) counts the plans each prepared statement used on this
connection.
"""

from __future__ import annotations

from support.runtime import SCHEMA, open_client, register_worker
from worker.app import App
from worker.db.pool import Database, PoolOptions
from worker.db.store import Store
from worker.run.begin import DeferLimits
from worker.run.context import TaskContext
from worker.run.execute import Runtime
from worker.run.handle import WorkerSeat

# A release id as long as a deploy's (a date and a commit): the claim's text grows with it.
RELEASE = "release-2026-12-07-3f9c2a1b7e"
PLAYS = App()


@PLAYS.play("noop")
async def noop(ctx: TaskContext, params: object) -> None:
    return None


async def test_the_own_claim_keeps_one_generic_plan_on_its_connection(database_url: str) -> None:
    claims = 8
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}) as client:
        for _ in range(claims):
            await client.submit("noop")
    # One connection, so every claim and the look at its statements share it.
    db = await Database.open(PoolOptions(url=database_url, max_size=1, retry_for_s=5))
    try:
        seat = WorkerSeat.of(RELEASE, worker_base="test-planned-once", lease_s=30)
        rt = Runtime(db, Store(SCHEMA), PLAYS, seat, defer=DeferLimits(3600.0))
        await register_worker(rt)
        for _ in range(claims):
            batch = await rt.claim(rt.queue, 1)
            assert len(batch.runs) == 1
        plans = await db.run(
            lambda c: c.fetch(
                "select generic_plans, custom_plans from pg_prepared_statements"
                " where statement like 'with clock as materialized%'"
            )
        )
    finally:
        await db.close()
    # Kept prepared (else no row: each call was parsed and planned afresh), and on its
    # generic plan, made once.
    assert [(p["generic_plans"], p["custom_plans"]) for p in plans] == [(claims, 0)]
