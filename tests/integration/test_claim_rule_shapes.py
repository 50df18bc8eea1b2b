"""The claim-rule table's run states are the ones the real paths leave.

``tests/support/claim_rule.py`` gives each of its runs a wait state by direct
updates (no API reaches thousands of combinations); this test takes one run into
each state the real way (a play that parks, fails, or is handed back; a signal, a
runner's report) and requires the rows the claim and decide() read to match:
the store's status and wait kind, and the engine run's state, due time and
event columns. A table state no real path leaves would test nothing real.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from support.claim_rule import WAITS, armed_event
from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    work_once,
)
from worker import App, TaskContext

REL, REL_H, REL_L = "rule-shapes", "rule-shapes-h", "rule-shapes-l"


def shapes_app() -> App:
    app = App()

    @app.play("nap")
    async def nap(ctx: TaskContext, params: Any) -> None:
        await ctx.sleep("nap", params["s"])

    @app.play("evt")
    async def evt(ctx: TaskContext, params: Any) -> None:
        await ctx.wait_for_event("evt", "go")

    @app.play("runner")
    async def runner(ctx: TaskContext, params: Any) -> None:
        await ctx.run_detached("r", lambda _: {"ticket": 1}, timeout=600)

    @app.play("fails")
    async def fails(ctx: TaskContext, params: Any) -> None:
        raise RuntimeError("once")

    return app


def table_shape(wait: str) -> tuple[Any, ...]:
    """What the table writes for ``wait`` (support.claim_rule.set_facts), as shape() reads it."""
    status, kind, state, due, payload = WAITS[wait]
    return status, kind, state, due, payload is not None, armed_event(kind, state)


async def shape(conn: asyncpg.Connection[asyncpg.Record], run_id: str) -> tuple[Any, ...]:
    """The run's store status and wait kind, and its latest engine run's state and events."""
    queue = await conn.fetchval(f"select queue from {SCHEMA}.runs where run_id = $1::uuid", run_id)
    row = await conn.fetchrow(
        f"select s.status, s.current_wait ->> 'kind' as kind, r.state,"
        " case when r.available_at = 'infinity' then 'infinity'"
        "      when r.available_at <= absurd.current_time() then 'past' else 'future' end,"
        " r.event_payload is not null, r.wake_event is not null"
        f" from {SCHEMA}.runs s join absurd.r_{queue} r on r.task_id = s.task_id"
        " where s.run_id = $1::uuid order by r.attempt desc limit 1",
        run_id,
    )
    assert row is not None, run_id
    return tuple(row)


async def test_the_tables_wait_states_are_what_the_real_paths_leave(database_url: str) -> None:
    app = shapes_app()
    async with (
        open_client(database_url, {**env_of(REL), "LANE_WORKER_MAX_ATTEMPTS": "3"}) as client,
        open_client(database_url, env_of(REL_H)) as client_h,
        open_client(database_url, env_of(REL_L)) as client_l,
        open_runtime(database_url, app, REL) as rt,
        open_runtime(database_url, app, REL_H) as rt_h,
        open_runtime(database_url, app, REL_L, lease_s=1) as rt_l,
    ):
        # A hand-back, on a lane of its own: an event woke the run, its worker claimed
        # it and gave it back (a drain's leftovers).
        handback = (await client_h.submit("evt")).run_id
        assert await work_once(rt_h) == ["parked"]
        await client_h.signal(handback, "go", {"ok": 1})
        claimed = await rt_h.claim(queue_of(REL_H), 5)
        assert len(claimed.runs) == 1
        assert await rt_h.give_back_leftovers([queue_of(REL_H)]) == 1

        # A lease lost: the worker claimed the run (its attempt begun) and died; the
        # next claim sweeps the expired lease.
        lost = (await client_l.submit("nap", {"s": 0})).run_id
        assert len((await rt_l.claim(queue_of(REL_L), 5)).runs) == 1

        async def swept() -> bool:
            return (await rt_l.claim(queue_of(REL_L), 5)).swept == 1

        await eventually(swept, what="a claim to sweep the expired lease")

        runs = {
            "retry": (await client.submit("fails")).run_id,
            "sleep_woken": (await client.submit("nap", {"s": 0.2})).run_id,
            "event_woken": (await client.submit("evt")).run_id,
            "runner_woken": (await client.submit("runner")).run_id,
            "sleep_asleep": (await client.submit("nap", {"s": 3600})).run_id,
            "event_asleep": (await client.submit("evt")).run_id,
        }
        assert sorted(await work_once(rt)) == [*["parked"] * 5, "retrying"]
        await client.signal(runs["event_woken"], "go", {"ok": 1})
        await client.report_runner_result(runs["runner_woken"], 1, {"ok": 1})
        runs["fresh"] = (await client.submit("nap", {"s": 1})).run_id
        runs["handback"], runs["lease_lost"] = handback, lost
        # mystery_woken: a wait kind this build does not know; only a newer build parks one.
        assert set(runs) == set(WAITS) - {"mystery_woken"}

        conn = await connect(database_url)
        try:

            async def real() -> dict[str, tuple[Any, ...]]:
                return {wait: await shape(conn, run_id) for wait, run_id in runs.items()}

            expected = {wait: table_shape(wait) for wait in runs}

            async def all_match() -> bool:
                return await real() == expected

            # The retry's backoff and the 0.2 s nap are due after a moment.
            try:
                await eventually(all_match, what="every real run in its table state")
            finally:
                assert await real() == expected
        finally:
            await conn.close()
