"""A worker connecting as its own least role (issue 33), and an app as its own, end to end.

The owner migrates and applies ``lane-worker roles``; the daemon (a real process)
connects as a login member of the worker role, which may not create anything:
its lane's engine queue and NOTIFY trigger are made by the store's owner
(``prepare_lane_queue``, store migration 0042). The app submits and signals as
its own role; the run completes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import asyncpg
import pytest

from support.daemon import Daemons
from support.roles import Logins, made_roles
from support.runtime import SCHEMA, eventually

RELEASE = "rel-least"
QUEUE = "runs_rel_least"


@pytest.fixture
def logins(database_url: str) -> Iterator[Logins]:
    with made_roles(database_url) as made:
        yield made


async def test_worker_and_app_run_a_play_each_as_its_own_role(
    database_url: str, logins: Logins
) -> None:
    owner = await asyncpg.connect(database_url)
    app = await asyncpg.connect(logins.urls["app"])
    try:
        async with Daemons(database_url) as pool:
            # A lane nobody made yet: the worker role's boot has it made by the owner.
            daemon = pool.start(RELEASE, WORKFLOW_RUNTIME_POSTGRES=logins.urls["worker"])
            await daemon.ready()
            assert (
                await owner.fetchval(
                    "select count(*) from pg_trigger where tgrelid = to_regclass($1)"
                    " and tgname = 'lane_worker_runnable_v1'",
                    f"absurd.r_{QUEUE}",
                )
                == 1
            )
            made = json.loads(
                await app.fetchval(
                    f"select {SCHEMA}.submit_run('waiter', '{{}}', $1, null, null, null)", RELEASE
                )
            )
            assert made["served"] is True
            run_id = made["runId"]

            async def waiting() -> bool:
                status = await owner.fetchval(
                    f"select status from {SCHEMA}.runs where run_id = $1::uuid", run_id
                )
                return status == "waiting"

            await eventually(waiting, what="the waiter to park on its event")
            await app.fetchval(
                f"select {SCHEMA}.signal_run($1::uuid, 'go', '{{\"by\": \"app\"}}')", run_id
            )

            async def completed() -> str | None:
                row = await owner.fetchrow(
                    f"select status, output from {SCHEMA}.runs where run_id = $1::uuid", run_id
                )
                return row["output"] if row and row["status"] == "completed" else None

            output = json.loads(await eventually(completed, what="the run to complete"))
            assert output["by"] == "app"
            # The daemon's connections were the worker's login, never the owner.
            users = await owner.fetch(
                "select distinct usename from pg_stat_activity where datname = current_database()"
                " and usename like $1",
                f"{logins.prefix}%",
            )
            assert sorted(r[0] for r in users) == [
                f"{logins.prefix}_app_login",  # this test's app connection
                f"{logins.prefix}_worker_login",
            ]
            status = json.loads(await app.fetchval(f"select {SCHEMA}.run_status($1::uuid)", run_id))
            assert status["status"] == "completed"
            assert daemon.events("db.role_broad") == []  # its own role: no warning
    finally:
        await app.close()
        await owner.close()


async def test_a_worker_role_on_an_old_store_exits_78_naming_migrate(
    database_url: str, logins: Logins
) -> None:
    owner = await asyncpg.connect(database_url)
    try:
        # The store as an older build left it: this build's last migration not applied.
        await owner.execute(
            f"delete from {SCHEMA}.schema_migrations"
            f" where version = (select max(version) from {SCHEMA}.schema_migrations)"
        )
    finally:
        await owner.close()
    async with Daemons(database_url) as pool:
        daemon = pool.start(RELEASE, WORKFLOW_RUNTIME_POSTGRES=logins.urls["worker"])
        assert await daemon.wait_exit(timeout_s=60) == 78
        assert "lane-worker migrate" in daemon.stderr
        assert "owner" in daemon.stderr


async def test_a_deployed_worker_connecting_as_a_superuser_is_warned_once(
    database_url: str,
) -> None:
    async with Daemons(database_url) as pool:
        daemon = pool.start(RELEASE)  # the tests' URL: the superuser postgres
        await daemon.ready()
        (said,) = daemon.events("db.role_broad")
        assert (said["level"], said["part"], said["superuser"]) == ("warning", "worker", True)
        assert "lane_worker_worker" in said["hint"]
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 0
