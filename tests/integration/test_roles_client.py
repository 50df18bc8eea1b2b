"""The Python client as the app's role, a worker role's maintenance, grants kept by migrate.

Issue 33: ``LaneClient`` connected as a login member of the app's role (made by
the real ``lane-worker roles --apply``) submits, signals, reports a runner's
result, reads a status and cancels through the SQL API alone, and still refuses
a store too old or too new for its build. A worker's role does not prune (it may
not drop the owner's engine tables): it says so once a pass. ``migrate`` grants
the recorded roles what a later migration adds. Role names are random per test
and dropped after (the server is shared by parallel tests).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from support.roles import Logins, lane_worker, made_roles
from support.runtime import SCHEMA, env_of, open_client
from worker.client import LaneClient, SchemasMissingError, SubmitRequest
from worker.daemon.maintenance import maintain
from worker.db import role_check
from worker.errors import StoreSchemaError

TOKEN = "tok-" + "cl13nt" * 4
DAY = 86_400.0


@pytest.fixture
def logins(database_url: str) -> Iterator[Logins]:
    with made_roles(database_url) as made:
        yield made


@pytest.fixture
async def owner(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


async def test_the_client_as_the_app_role_makes_every_call(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    async with open_client(logins.urls["app"], env_of("rel-app")) as app:
        made = await app.submit(
            "greet",
            {"secret": "mine"},
            runtime_api={"baseUrl": "http://app.invalid", "executorToken": TOKEN},
        )
        assert (made.created, made.queue) == (True, "runs_rel_app")
        many = await app.submit_many(
            [SubmitRequest("greet", {"n": 1}), SubmitRequest("greet", {"n": 2})]
        )
        assert [m.created for m in many] == [True, True]
        signalled = await app.signal(made.run_id, "approved", {"by": "ada"})
        assert not signalled.duplicate
        number = await owner.fetchval(  # a runner attempt is the worker's to begin
            f"select {SCHEMA}.begin_runner_attempt($1, 'build')", uuid.UUID(made.run_id)
        )
        reported = await app.report_runner_result(made.run_id, number, {"ok": True})
        assert reported.recorded
        status = await app.status(made.run_id)
        assert (status.run_id, status.status, status.play) == (made.run_id, "queued", "greet")
        assert TOKEN not in json.dumps(status.as_json(), default=str)
        assert (await app.worker_release_id(deploy_version="rel-app")).queue == "runs_rel_app"
        assert await app.cancel(made.run_id, reason="roles test")
        assert not await app.cancel(made.run_id)  # ended already
        assert (await app.status(made.run_id)).status == "cancelled"
    rows = await owner.fetch(
        f"select status, count(*) from {SCHEMA}.runs where release_id = 'rel-app' group by 1"
    )
    assert sorted((r[0], r[1]) for r in rows) == [("cancelled", 1), ("queued", 2)]
    assert (
        await owner.fetchval(
            f"select fact->>'source' from {SCHEMA}.ledger where run_id = $1"
            " and type = 'run.cancelled'",
            uuid.UUID(made.run_id),
        )
        == "client"
    )
    assert (
        await owner.fetchval(
            f"select count(*) from {SCHEMA}.signals where run_id = $1", uuid.UUID(made.run_id)
        )
        == 1
    )


async def test_the_client_as_the_app_role_refuses_an_old_or_new_store(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    # The store as an older build left it: this build's last migration missing.
    newest = await owner.fetchval(f"select max(version) from {SCHEMA}.schema_migrations")
    row = await owner.fetchrow(
        f"delete from {SCHEMA}.schema_migrations where version = $1 returning *", newest
    )
    app = await LaneClient.connect(logins.urls["app"], env=env_of("rel-app"))
    try:
        with pytest.raises(SchemasMissingError, match="as the schemas' owner first"):
            await app.submit("greet", {})
        with pytest.raises(SchemasMissingError, match="run `lane-worker migrate` first"):
            await app.status(str(uuid.uuid4()))
    finally:
        await app.close()
    assert await owner.fetchval(f"select count(*) from {SCHEMA}.runs") == 0
    await owner.execute(
        f"insert into {SCHEMA}.schema_migrations (version, name, compatible, applied_at)"
        " values ($1, $2, $3, $4), (9999, 'from_the_future', false, now())",
        *row.values(),
    )
    app = await LaneClient.connect(logins.urls["app"], env=env_of("rel-app"))
    try:
        with pytest.raises(StoreSchemaError, match="9999"):
            await app.submit("greet", {})
    finally:
        await app.close()
    assert await owner.fetchval(f"select count(*) from {SCHEMA}.runs") == 0


async def test_migrate_grants_the_roles_what_a_later_migration_adds(
    database_url: str, logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    # As before 0043: its function gone with its grants, the migration not applied.
    app_login = f"{logins.prefix}_app_login"
    await owner.execute(
        f"drop function {SCHEMA}.schema_versions();"
        f"delete from {SCHEMA}.schema_migrations where version = 43"
    )
    made = lane_worker(database_url, "migrate", "--json")
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    assert report["storeApplied"] == [43]
    assert logins.prefix in report["rolesRegranted"]
    for job in ("app", "viewer", "scaler", "worker"):
        assert await owner.fetchval(
            "select has_function_privilege($1, $2::regprocedure, 'execute')",
            f"{logins.prefix}_{job}_login",
            f"{SCHEMA}.schema_versions()",
        ), job
    async with open_client(logins.urls["app"], env_of("rel-app")) as app:
        assert (await app.submit("greet", {})).created
    # The app still reaches nothing else (the matrix test's check, after a migrate).
    allowed = await owner.fetchval(
        "select count(*) from pg_proc p where p.pronamespace = $1::regnamespace"
        " and has_function_privilege($2, p.oid, 'execute')",
        SCHEMA,
        app_login,
    )
    assert allowed == 9  # the SQL API and schema_versions


async def _retired_lane(database_url: str, release: str) -> str:
    async with open_client(database_url, env_of(release)) as client:
        run = await client.submit("plain", {})
        assert await client.cancel(run.run_id)
        await client.retire_release(release)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            f"update {SCHEMA}.releases set retired_at = now() - interval '2 days' where queue = $1",
            run.queue,
        )
    finally:
        await conn.close()
    return run.queue


async def test_a_worker_role_does_not_prune_and_says_so(
    database_url: str, logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    queue = await _retired_lane(database_url, "rel-pruned-later")
    worker = await LaneClient.connect(logins.urls["worker"], env={}, as_app=False)
    try:
        with capture_logs() as lines:
            for _ in range(2):
                assert await maintain(worker.db, worker.store, worker_id="t", prune_after_s=DAY)
    finally:
        await worker.close()
    skipped = [line for line in lines if line["event"] == "maintenance.prune_skipped"]
    assert len(skipped) == 2  # one a pass
    assert "prune as the store's owner" in skipped[0]["hint"]
    assert (
        await owner.fetchval("select count(*) from absurd.queues where queue_name = $1", queue) == 1
    )
    assert await owner.fetchval(
        f"select pruned_at is null from {SCHEMA}.releases where queue = $1", queue
    )
    # The owner's maintenance prunes it, as before.
    async with open_client(database_url, {}) as client:
        assert await maintain(client.db, client.store, worker_id="o", prune_after_s=DAY)
    assert (
        await owner.fetchval("select count(*) from absurd.queues where queue_name = $1", queue) == 0
    )


async def test_a_deployed_part_connecting_broadly_is_warned_once(
    logins: Logins,
    owner: asyncpg.Connection[asyncpg.Record],
    monkeypatch: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(role_check, "_warned", False)
    with capture_logs() as lines:
        assert not await role_check.warn_if_broad(owner, SCHEMA, part="worker", release_id="dev-x")
        assert await role_check.warn_if_broad(owner, SCHEMA, part="worker", release_id="rel-1")
        assert not await role_check.warn_if_broad(owner, SCHEMA, part="worker", release_id="rel-1")
    said = [line for line in lines if line["event"] == "db.role_broad"]
    assert len(said) == 1
    assert (said[0]["log_level"], said[0]["superuser"], said[0]["part"]) == (
        "warning", True, "worker",
    )  # fmt: skip
    # An app's client warns through the standard library's logging (stderr unless the
    # app set it up), never structlog's default print to stdout.
    monkeypatch.setattr(role_check, "_warned", False)
    caplog.set_level(logging.WARNING, logger="lane_worker.db")
    with capture_logs() as lines:
        assert await role_check.warn_if_broad(owner, SCHEMA, part="app", release_id="rel-1")
    assert lines == []
    [record] = [r for r in caplog.records if r.name == "lane_worker.db"]
    assert "db.role_broad: lane-worker's client connects as a superuser" in record.getMessage()
    monkeypatch.setattr(role_check, "_warned", False)
    caplog.clear()
    app = await asyncpg.connect(logins.urls["app"])
    try:
        assert not await role_check.warn_if_broad(app, SCHEMA, part="app", release_id="rel-1")
    finally:
        await app.close()
    assert caplog.records == []
