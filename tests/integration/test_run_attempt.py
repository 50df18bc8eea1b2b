"""An attempt ends once, and never ends another's (worker/run/attempt.py), on real Postgres.

A stale attempt (its lease lost) that fails for good leaves the new owner's run alone;
a takeover closes the older attempt at once; a run that ends closes a dead worker's
attempt, and maintenance closes what a worker that died mid-attempt left open.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.db import (
    age_worker,
    attempt_rows,
    make_sleepers_due,
    sql,
)
from support.plays import (
    QA,
    A,
    RemedyPlays,
    remedies_app,
    two_lanes,
)
from support.runtime import (
    SCHEMA,
    claim_one,
    eventually,
    hold_in_flight,
    open_client,
    open_runtime,
    register_worker,
)
from worker import App, TaskContext
from worker.daemon.maintenance import maintain
from worker.db.engine import ClaimedRun
from worker.errors import FatalRunError
from worker.run.execute import Handled, Runtime

RELEASE = "rel-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
QUEUE = "runs_rel_a"


async def terminal_facts(rt: Runtime, run_id: str) -> list[str]:
    """Return the types of a run's terminal ledger facts."""
    rows = await rt.db.fetch(
        f"select type from {SCHEMA}.ledger where run_id = $1::uuid"
        " and type in ('run.completed', 'run.failed', 'run.cancelled') order by fact_id",
        run_id,
    )
    return [r["type"] for r in rows]


async def claim_when_due(rt: Runtime, *, timeout_s: float = 10) -> ClaimedRun:
    """Claim on the runtime's own queue until one run is handed out; return it."""

    async def claimed() -> ClaimedRun | None:
        batch = await rt.claim(rt.queue, 1)
        return batch.runs[0] if batch.runs else None

    run: ClaimedRun = await eventually(claimed, timeout_s=timeout_s, what="a run to claim")
    return run


async def test_stale_attempt_failing_for_good_leaves_the_new_owners_run_alone(
    database_url: str,
) -> None:
    """Attempt 1, its lease expired, fails for good: attempt 2 (another worker) still completes."""
    started = {1: asyncio.Event(), 2: asyncio.Event()}
    release = {1: asyncio.Event(), 2: asyncio.Event()}
    app = App()

    @app.play("stale")
    async def stale(ctx: TaskContext, params: dict[str, Any]) -> dict[str, int]:
        started[ctx.attempt].set()
        await release[ctx.attempt].wait()
        if ctx.attempt == 1:
            raise FatalRunError("attempt 1 gives up for good")
        return {"attempt": ctx.attempt}

    async def outcome_of(task: asyncio.Task[Handled]) -> str:
        """The attempt's outcome, or the exception that escaped ``handle``."""
        try:
            return (await asyncio.wait_for(task, 10)).outcome
        except Exception as exc:
            return f"raised {exc!r}"

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE, lease_s=30, worker_base="w1") as rt1,
        open_runtime(database_url, app, RELEASE, lease_s=30, worker_base="w2") as rt2,
    ):
        submitted = await client.submit("stale")
        first = asyncio.create_task(rt1.handle(await claim_when_due(rt1)))
        second: asyncio.Task[Handled] | None = None
        try:
            await asyncio.wait_for(started[1].wait(), 10)
            expired = await rt1.db.execute(
                f"update absurd.r_{QUEUE} set claim_expires_at = now() - interval '1 second'"
                " where state = 'running' and claimed_by = 'w1'"
            )
            assert expired == "UPDATE 1"
            # rt2's claims sweep the expired lease; the retry is due 1 s later.
            second = asyncio.create_task(rt2.handle(await claim_when_due(rt2)))
            await asyncio.wait_for(started[2].wait(), 10)
            release[1].set()
            first_outcome = await outcome_of(first)
            release[2].set()
            second_outcome = await outcome_of(second)
        finally:
            for event in release.values():
                event.set()
            for task in (first, second):
                if task is not None and not task.done():
                    task.cancel()
            await asyncio.gather(first, *([second] if second else []), return_exceptions=True)
        status = await client.status(submitted.run_id)
        engine_state = await rt1.db.fetchval(f"select state from absurd.t_{QUEUE}")
        attempts = await attempt_rows(database_url, submitted.run_id)
        facts = await terminal_facts(rt1, submitted.run_id)
    assert (first_outcome, second_outcome) == ("lease_lost", "completed")
    assert status.status == "completed"
    assert status.output == {"attempt": 2}
    assert engine_state == "completed"
    assert [(a["attempt"], a["worker_id"], a["outcome"]) for a in attempts] == [
        (1, "w1", "lease_lost"),
        (2, "w2", "completed"),
    ]
    assert facts == ["run.completed"]


# -- attempts closed once the run moved on ------------------------------------------------


async def test_a_takeover_closes_the_older_attempt_at_once(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """A worker stalls past its lease (as a killed one would); the next claim closes its attempt."""
    app = remedies_app(remedy_plays)
    async with (
        two_lanes(database_url, app) as (client, rt_a, _rt_b),
        open_runtime(database_url, app, A, worker_base="test-rel-a-2") as rt_a2,
    ):
        run = await client.submit("gated", {"name": "stuck"})
        stuck = await hold_in_flight(rt_a, remedy_plays, "stuck")
        try:
            # Its lease runs out: the engine fails that attempt and schedules a retry.
            await sql(
                database_url, f"update absurd.r_{QA} set claim_expires_at = now() - interval '1 s'"
                " where state = 'running'",
            )  # fmt: skip
            await rt_a2.claim(QA, 5)  # sweeps the expired lease
            await make_sleepers_due(database_url, QA)
            remedy_plays.entered.pop("stuck")
            taker = asyncio.create_task(rt_a2.handle(await claim_one(rt_a2, QA)))
            await asyncio.wait_for(remedy_plays.entered_event("stuck").wait(), 20)
            rows = await attempt_rows(database_url, run.run_id)
            assert [(r["worker_id"], r["outcome"]) for r in rows] == [
                ("test-rel-a", "lease_lost"), ("test-rel-a-2", None),
            ]  # fmt: skip
            assert rows[0]["finished_at"] is not None
            assert rows[0]["error"] == {"reason": "a newer attempt took the run over"}
        finally:
            remedy_plays.gate("stuck").set()
        assert (await asyncio.wait_for(taker, 20)).outcome == "completed"
        await asyncio.wait_for(stuck, 20)
        assert all(r["outcome"] for r in await attempt_rows(database_url, run.run_id))


async def test_an_ended_run_closes_a_dead_worker_s_attempt_and_maintenance_the_rest(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """Cancelled with a dead worker's attempt open: closed in the cancel; a live one is left."""
    app = remedies_app(remedy_plays)
    async with two_lanes(database_url, app) as (client, rt_a, _rt_b):
        dead = await client.submit("gated", {"name": "dead"})
        held = await hold_in_flight(rt_a, remedy_plays, "dead")
        try:
            await age_worker(database_url, rt_a.worker_base)  # as if SIGKILLed
            assert await client.cancel(dead.run_id)
            [row] = await attempt_rows(database_url, dead.run_id)
            assert (row["outcome"], row["error"]) == (
                "lease_lost", {"reason": "the run ended without this attempt"},
            )  # fmt: skip
        finally:
            remedy_plays.gate("dead").set()
        await asyncio.wait_for(held, 20)

        # A live worker's attempt stays open through the cancel (it may be in a step) ...
        await register_worker(rt_a, "test-rel-a-live")
        async with open_runtime(database_url, app, A, worker_base="test-rel-a-live") as live_rt:
            alive = await client.submit("gated", {"name": "alive"})
            held = await hold_in_flight(live_rt, remedy_plays, "alive")
            try:
                assert await client.fail_run(alive.run_id, "by hand")
                [row] = await attempt_rows(database_url, alive.run_id)
                assert row["outcome"] is None
                # ... until its worker dies; the maintenance pass closes it then.
                await age_worker(database_url, "test-rel-a-live")
                assert await maintain(live_rt.db, live_rt.store, worker_id="test-maint")
                [row] = await attempt_rows(database_url, alive.run_id)
                assert (row["outcome"], row["error"]) == (
                    "lease_lost", {"reason": "its worker stopped without recording its end"},
                )  # fmt: skip
            finally:
                remedy_plays.gate("alive").set()
            await asyncio.wait_for(held, 20)


async def test_a_completion_the_store_fence_refuses_leaves_the_engine_run_uncompleted(
    database_url: str,
) -> None:
    """The one-statement completion: the store's fence says a newer claim owns the run.

    Nothing of it stays (the engine's complete is rolled back with the rest): the
    run stays running in the engine and unsettled in the store, no fact is written,
    and the attempt ends as a lost lease, not as completed.
    """
    entered, go = asyncio.Event(), asyncio.Event()
    app = App()

    @app.play("held")
    async def held(ctx: TaskContext, params: dict[str, Any]) -> dict[str, int]:
        entered.set()
        await go.wait()
        return {"done": 1}

    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, app, RELEASE, lease_s=30) as rt,
    ):
        submitted = await client.submit("held")
        handling = asyncio.create_task(rt.handle(await claim_when_due(rt)))
        try:
            await asyncio.wait_for(entered.wait(), 10)
            # A newer claim's fence move, as the store records it (its engine side
            # is not needed to make the fence refuse).
            await rt.db.execute(
                f"with newer as (insert into {SCHEMA}.attempts (run_id, engine_run_id, attempt,"
                " worker_id, release_id, disposition) select run_id, gen_random_uuid(), 2,"
                f" 'w-newer', release_id, 'own' from {SCHEMA}.runs where run_id = $1::uuid"
                " returning run_id, attempt_id)"
                f" update {SCHEMA}.runs r set current_attempt_id = n.attempt_id from newer n"
                " where r.run_id = n.run_id",
                submitted.run_id,
            )
        finally:
            go.set()
        handled = await asyncio.wait_for(handling, 10)
        engine_state = await rt.db.fetchval(f"select state from absurd.t_{QUEUE}")
        status = await client.status(submitted.run_id)
        attempts = await attempt_rows(database_url, submitted.run_id)
        facts = await terminal_facts(rt, submitted.run_id)
    assert handled.outcome == "lease_lost"
    assert engine_state == "running"
    assert status.status == "running"
    assert facts == []
    assert (attempts[0]["worker_id"], attempts[0]["outcome"]) == ("test-rel-a", "lease_lost")
