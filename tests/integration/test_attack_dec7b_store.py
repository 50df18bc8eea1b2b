"""Attacks of 2026-12-07 (b) on retry targets and dev lanes, on real Postgres.

Each xfail(strict) test is a defect found: it fails on the code of its commit and
passes once the defect is fixed; the others are attacks that held.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import make_mocked_request
from structlog.testing import capture_logs

from support.db import execute, run_row, sql
from support.plays import RemedyPlays, remedies_app
from support.runtime import (
    SCHEMA,
    connect,
    env_of,
    eventually,
    open_client,
    open_runtime,
    queue_of,
    register_worker,
    work_once,
)
from worker.daemon.boot import install_and_register
from worker.daemon.maintenance import maintain
from worker.daemon.page_auth import same_origin
from worker.db.store import Store

REL_A = "rel-a"
SHARED = "foo"  # release foo and worktree suffix foo: both queue runs_foo


async def test_a_release_run_is_never_retried_onto_a_lane_a_worktree_shares(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """rel-a, then release foo; a worktree with suffix foo registers on runs_foo too.

    runs_foo is dev by the store's rule (0035): a release run's retry must go to
    rel-a (or be refused), never to runs_foo, where the worktree's worker claims it.
    """
    app = remedies_app(remedy_plays)
    async with (
        open_client(database_url, env_of(REL_A)) as client,
        open_runtime(database_url, app, REL_A) as rt_a,
        open_runtime(database_url, app, SHARED) as rt_foo,
        open_runtime(database_url, app, f"dev-{SHARED}") as rt_wt,
    ):
        # Each release's worker boots: it registers its lane (as boot does) and itself.
        for runtime in (rt_a, rt_foo):
            await runtime.db.run(
                lambda c, r=runtime: Store(SCHEMA).lanes.register(
                    c, queue=r.queue, release_id=r.release_id
                )
            )
            await client.activate_release(runtime.release_id, force=True)  # its engine queue
            await register_worker(runtime)
        # A worktree's worker of an older build booted on runs_foo: it added its spelling
        # (this build refuses that, test_lane_boundary.py) and registered itself.
        await execute(
            database_url,
            f"update {SCHEMA}.releases set release_ids = release_ids || $1::text"
            " where queue = 'runs_foo'",
            f"dev-{SHARED}",
        )
        await register_worker(rt_wt)
        assert rt_wt.queue == rt_foo.queue == "runs_foo"
        is_dev = await rt_a.db.fetchval(
            f"select {SCHEMA}.lane_is_dev(release_ids) from {SCHEMA}.releases where queue = $1",
            "runs_foo",
        )
        assert is_dev  # the store's word: runs_foo is a dev lane now

        run = await client.submit("plain", {"k": 1})
        assert (await run_row(database_url, run.run_id))["queue"] == queue_of(REL_A)
        assert await client.fail_run(run.run_id, "try again")
        retried = await client.retry_run(run.run_id)
        assert retried.queue == queue_of(REL_A), retried
        assert await work_once(rt_wt) == []


# The page's origin check (page_auth.same_origin), attacked with what a page of another
# site can make a browser send: every one is refused (held).
CROSS_SITE = (
    {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://evil.example"},
    {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://page.example:9999", "Sec-Fetch-Site": "same-site"},
    {"Origin": "http://sub.page.example:8080", "Sec-Fetch-Site": "same-site"},
    {"Origin": "http://page.example:8080@evil.example"},
    {"Origin": "http://evil.example/page.example:8080"},
    {"Sec-Fetch-Site": "none"},
    {"Sec-Fetch-Site": "Same-Origin ", "Origin": "http://evil.example"},
    {},
)


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_the_page_refuses_every_cross_site_post(headers: dict[str, str]) -> None:
    request = make_mocked_request(
        "POST", "/actions/run", headers={"Host": "page.example:8080", **headers}
    )
    assert not same_origin(request), headers


def test_the_page_takes_its_own_posts() -> None:
    own = (
        {"Sec-Fetch-Site": "same-origin"},
        {"Origin": "http://page.example:8080"},
        {"Origin": "https://PUBLIC.example", "X-Forwarded-Host": "public.example, proxy"},
    )
    for headers in own:
        request = make_mocked_request(
            "POST", "/actions/run", headers={"Host": "page.example:8080", **headers}
        )
        assert same_origin(request), headers


async def test_a_cancel_racing_a_completion_waits_and_never_deadlocks(
    database_url: str, remedy_plays: RemedyPlays
) -> None:
    """The completion's first step holds the engine's run row (as absurd.complete_run
    does) when an operator cancels; the completion then settles the store's row.

    Either may win, with exactly one terminal fact, but neither is aborted.
    """
    async with open_client(database_url, env_of(REL_A)) as client:
        run = await client.submit("plain", {"k": 9})
        row = await run_row(database_url, run.run_id)
        completing = await connect(database_url)
        cancelling = await connect(database_url)
        try:
            tx = completing.transaction()
            await tx.start()
            await completing.execute(
                f"select 1 from absurd.r_{row['queue']} where task_id = $1 for update",
                row["task_id"],
            )
            cancel = asyncio.ensure_future(
                cancelling.fetchval(
                    f"select {SCHEMA}.cancel_run_by($1, 'race', 'operator')", row["run_id"]
                )
            )
            # The cancel holds the store's row and waits for the engine's.
            await eventually(
                lambda: sql(
                    database_url,
                    "select count(*) > 0 from pg_stat_activity"
                    " where wait_event_type = 'Lock' and query like '%cancel_run_by%'",
                )
            )
            errors: list[BaseException] = []
            try:
                await completing.execute(
                    f"select 1 from {SCHEMA}.runs where run_id = $1 for update", row["run_id"]
                )
                await tx.commit()
            except asyncpg.DeadlockDetectedError as exc:
                errors.append(exc)
                await tx.rollback()
            try:
                await cancel
            except asyncpg.DeadlockDetectedError as exc:
                errors.append(exc)
            assert errors == []
        finally:
            await completing.close()
            await cancelling.close()


WEEK = 7 * 86_400.0


async def test_an_idle_dev_lane_holding_a_run_it_adopted_is_kept(database_url: str) -> None:
    store = Store(SCHEMA)
    async with open_client(database_url, env_of("rel-1")) as client:
        for queue, release_id in (
            ("runs_rel_1", "rel-1"), ("runs_wt", "dev-wt"), ("runs_rel_2", "rel-2"),
        ):  # fmt: skip
            await client.db.run(
                lambda c, q=queue, r=release_id: store.lanes.register(c, queue=q, release_id=r)
            )
        run = await client.submit("waiter", {})
        # Adopted by the worktree's continuation loop before migration 0035, now parked.
        await execute(
            database_url,
            f"update {SCHEMA}.runs set status = 'waiting', adopted_queue = 'runs_wt',"
            " adopted_release_id = 'dev-wt' where run_id = $1",
            uuid.UUID(run.run_id),
        )
        await client.db.run(
            lambda c: store.lanes.set_status(
                c, queue="runs_rel_1", status="retired", release_id="rel-1"
            )
        )
        await execute(
            database_url,
            f"update {SCHEMA}.releases set updated_at = now() - interval '8 days'"
            " where queue = 'runs_wt'",
        )
        open_there = await sql(
            database_url,
            f"select count(*) from {SCHEMA}.runs where coalesce(adopted_queue, queue) = 'runs_wt'"
            " and status not in ('completed', 'failed', 'cancelled')",
        )
        assert open_there == 1
        assert await maintain(client.db, store, worker_id="t", dev_idle_after_s=WEEK)
        status = await sql(
            database_url, f"select status from {SCHEMA}.releases where queue = 'runs_wt'"
        )
        assert status == "claiming"


async def test_a_dev_worker_booting_while_maintenance_retires_its_idle_lane_ends_claiming(
    database_url: str,
) -> None:
    """Held: boot (install_and_register) and a maintenance pass race on an idle dev lane,
    many times over; whichever goes first, the booted worker's lane claims, queue and all."""
    async with (
        open_client(database_url) as booting,
        open_client(database_url) as keeping,
    ):
        settings: Any = SimpleNamespace(queue="runs_race", release_id="dev-race")
        await install_and_register(booting.db, booting.store, settings)
        orders: set[bool] = set()  # whether maintenance retired the lane first, each time
        for _ in range(25):
            await execute(
                database_url,
                f"update {SCHEMA}.releases set updated_at = now() - interval '8 days'"
                " where queue = 'runs_race'",
            )
            with capture_logs() as lines:
                states = await asyncio.gather(
                    install_and_register(booting.db, booting.store, settings),
                    maintain(keeping.db, keeping.store, worker_id="k", dev_idle_after_s=WEEK),
                )
            orders.add(any(line["event"] == "lane.dev_retired" for line in lines))
            assert str(states[0]) == "claiming"
            status = await sql(
                database_url, f"select status from {SCHEMA}.releases where queue = 'runs_race'"
            )
            assert status == "claiming"
            assert await sql(
                database_url, "select count(*) from absurd.queues where queue_name = 'runs_race'"
            )
