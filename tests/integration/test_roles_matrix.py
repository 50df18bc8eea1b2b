"""Least privilege (issue 33): each role made by ``lane-worker roles --apply``, table by table.

The roles are made by the real command (a subprocess) on this test's database; a
login role of each job connects as itself. The app calls every SQL API function
and is refused (SQLSTATE 42501) every table and every other function; the viewer
reads the bookkeeping and no payload or token. Role names are random per test
(roles are the whole server's, shared by parallel tests) and dropped after.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from support.roles import Logins, made_roles
from support.runtime import SCHEMA
from worker.db import roles as role_sql
from worker.db import schema

TOKEN = "tok-" + "s3cr3t" * 4
DENIED = "42501"


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


async def _as(logins: Logins, job: str) -> asyncpg.Connection[asyncpg.Record]:
    conn = await asyncpg.connect(logins.urls[job])
    assert await conn.fetchval("select current_user") == f"{logins.prefix}_{job}_login"
    assert not await conn.fetchval("select rolsuper from pg_roles where rolname = current_user")
    return conn


async def _refused(conn: asyncpg.Connection[asyncpg.Record], sql: str) -> str | None:
    """Return None when ``sql`` is refused with 42501, else what happened."""
    try:
        async with conn.transaction():
            await conn.execute(sql)
    except asyncpg.PostgresError as exc:
        return None if exc.sqlstate == DENIED else f"{sql}: {exc.sqlstate} {exc}"
    return f"{sql}: allowed"


async def _tables(owner: asyncpg.Connection[asyncpg.Record]) -> list[tuple[str, str]]:
    rows = await owner.fetch(
        "select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = any($1) and c.relkind in ('r', 'p') order by 1, 2",
        [SCHEMA, role_sql.ENGINE_SCHEMA, role_sql.CONTRACT_SCHEMA],
    )
    return [(r[0], r[1]) for r in rows]


async def _submit(conn: asyncpg.Connection[asyncpg.Record], release: str) -> dict[str, object]:
    api = json.dumps({"baseUrl": "http://app.invalid", "executorToken": TOKEN})
    made = await conn.fetchval(
        f"select {SCHEMA}.submit_run('greet', $1::jsonb, $2, null, $3::jsonb, null)",
        json.dumps({"secret": "input-of-" + release}),
        release,
        api,
    )
    result: dict[str, object] = json.loads(made)
    return result


async def test_app_calls_every_api_function(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    app = await _as(logins, "app")
    try:
        made = await _submit(app, "rel-roles")
        run_id = uuid.UUID(str(made["runId"]))
        assert made["created"] is True
        assert made["queue"] == "runs_rel_roles"
        many = json.loads(
            await app.fetchval(
                f"select {SCHEMA}.submit_runs($1::jsonb)",
                json.dumps([{"play": "greet", "input": {}, "releaseId": "rel-roles"}]),
            )
        )
        assert many[0]["created"] is True
        release = json.loads(
            await app.fetchval(f"select {SCHEMA}.worker_release_id('Feature/X', null)")
        )
        assert release == {"releaseId": "dev-feature_x", "queue": "runs_feature_x"}
        assert await app.fetchval(f"select ({SCHEMA}.value_limits()).max_depth") == 512
        signalled = json.loads(
            await app.fetchval(
                f"select {SCHEMA}.signal_run($1, 'approved', '{{\"by\": \"ada\"}}')", run_id
            )
        )
        assert signalled["delivered"] is True
        # A runner attempt is the worker's to begin (as the owner here).
        number = await owner.fetchval(f"select {SCHEMA}.begin_runner_attempt($1, 'build')", run_id)
        reported = json.loads(
            await app.fetchval(
                f"select {SCHEMA}.report_runner_result($1, $2, '{{\"ok\": true}}')",
                run_id,
                number,
            )
        )
        assert reported["recorded"] is True
        status_text = await app.fetchval(f"select {SCHEMA}.run_status($1)::text", run_id)
        assert TOKEN not in status_text
        cancelled = json.loads(
            await app.fetchval(f"select {SCHEMA}.cancel_run($1, 'roles test')", run_id)
        )
        assert cancelled["cancelled"] is True
    finally:
        await app.close()
    # What the app did is in the store, written with the owner's rights.
    assert await owner.fetchval(f"select status from {SCHEMA}.runs where run_id = $1", run_id) == (
        "cancelled"
    )
    assert (
        await owner.fetchval(f"select count(*) from {SCHEMA}.signals where run_id = $1", run_id)
        == 1
    )
    assert await owner.fetchval(
        f"select result is not null from {SCHEMA}.runner_attempts where run_id = $1", run_id
    )
    assert (
        await owner.fetchval(
            f"select api->>'executorToken' from {SCHEMA}.run_runtime_api where run_id = $1", run_id
        )
        == TOKEN
    )
    assert (
        await owner.fetchval(
            "select count(*) from absurd.queues where queue_name = 'runs_rel_roles'"
        )
        == 1
    )


async def test_app_is_refused_every_table_and_other_function(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    await _submit(owner, "rel-roles")  # a lane's engine tables exist to be refused
    tables = await _tables(owner)
    assert (SCHEMA, "run_runtime_api") in tables
    assert ("absurd", "t_runs_rel_roles") in tables
    app = await _as(logins, "app")
    try:
        allowed = []
        for schema, table in tables:
            name = f'"{schema}"."{table}"'
            for sql in (
                f"select * from {name}",
                f"select count(*) from {name}",
                f"insert into {name} default values",
                f"delete from {name} where false",
                f"truncate {name}",
            ):
                allowed.append(await _refused(app, sql))
        allowed.append(await _refused(app, f"select nextval('{SCHEMA}.ledger_fact_id_seq')"))
        allowed.append(await _refused(app, f"create table {SCHEMA}.mine (x int)"))
        allowed.append(await _refused(app, "select absurd.create_queue('runs_app_made')"))
        allowed.append(
            await _refused(
                app,
                f"select {SCHEMA}.settle_run_by(null::uuid, null::bigint, null::text, null::jsonb, "
                f"null::jsonb, null::text, null::bigint)",
            )
        )
        assert [a for a in allowed if a] == []
    finally:
        await app.close()
    # Every store function but the API is out of the app's reach (and of PUBLIC's).
    rows = await owner.fetch(
        "select p.oid::regprocedure::text as fn, has_function_privilege($2, p.oid, 'execute')"
        " as may, exists (select from aclexplode(coalesce(p.proacl, acldefault('f', p.proowner)))"
        " a where a.grantee = 0) as public_may from pg_proc p"
        " where p.pronamespace = $1::regnamespace",
        SCHEMA,
        f"{logins.prefix}_app_login",
    )
    api = {f"{SCHEMA}.{sig}".replace(", ", ",") for sig in role_sql.APP_FUNCTIONS}
    may = {r["fn"].replace(", ", ",") for r in rows if r["may"]}
    assert may == api
    assert [r["fn"] for r in rows if r["public_may"]] == []


async def test_api_functions_run_as_owner_with_a_pinned_path(
    owner: asyncpg.Connection[asyncpg.Record],
) -> None:
    # A migration that redefines one with `create or replace` resets both: restate them.
    every = (
        role_sql.DEFINER_FUNCTIONS + role_sql.WORKER_DEFINER_FUNCTIONS + role_sql.GATE_RUN_FUNCTIONS
    )
    for signature in every + role_sql.REPORT_FUNCTIONS:
        row = await owner.fetchrow(
            "select prosecdef, proconfig from pg_proc where oid = $1::regprocedure",
            f"{SCHEMA}.{signature}",
        )
        assert row is not None
        assert row["prosecdef"], signature
        assert row["proconfig"] == ["search_path=pg_catalog, pg_temp"], signature


async def test_viewer_reads_bookkeeping_never_payloads_or_tokens(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    made = await _submit(owner, "rel-roles")
    run_id = uuid.UUID(str(made["runId"]))
    viewer = await _as(logins, "viewer")
    try:
        row = await viewer.fetchrow(
            f"select run_id, play, status, queue from {SCHEMA}.runs where run_id = $1", run_id
        )
        assert row is not None
        assert row["status"] == "queued"
        assert await viewer.fetchval(f"select count(*) from {SCHEMA}.releases") >= 0
        refused = [
            await _refused(viewer, sql)
            for sql in (
                f"select * from {SCHEMA}.runs",
                f"select input from {SCHEMA}.runs",
                f"select launch from {SCHEMA}.runs",
                f"select output, error, checkpoint from {SCHEMA}.runs",
                f"select idempotency_key from {SCHEMA}.runs",
                f"select * from {SCHEMA}.run_runtime_api",
                f"select * from {SCHEMA}.signals",
                f"select fact from {SCHEMA}.ledger",
                f"select result from {SCHEMA}.runner_attempts",
                f"select error from {SCHEMA}.attempts",
                "select * from absurd.t_runs_rel_roles",
                f"update {SCHEMA}.runs set status = status where false",
                f"delete from {SCHEMA}.releases where false",
                f"select {SCHEMA}.run_status('{run_id}')",
                f"select {SCHEMA}.submit_run('greet', '{{}}', 'rel-roles', null, null, null)",
                f"select {SCHEMA}.cancel_run('{run_id}', null)",
            )
        ]
        assert [r for r in refused if r] == []
    finally:
        await viewer.close()


async def test_viewer_and_scaler_read_the_report_functions_and_no_payload(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    made = await _submit(owner, "rel-roles")
    run_id = uuid.UUID(str(made["runId"]))
    for job in ("viewer", "scaler"):
        conn = await _as(logins, job)
        try:
            (lane,) = await conn.fetch(f"select * from {SCHEMA}.report_runs_v1()")
            assert (lane["lane"], lane["runs"], lane["run_ids"]) == ("runs_rel_roles", 1, [run_id])
            assert await conn.fetchval(f"select count(*) from {SCHEMA}.report_lanes_v1()") >= 0
            said = await conn.fetchval(f"select {SCHEMA}.run_status_bookkeeping_v1($1)", run_id)
            assert "input-of-rel-roles" not in said
            assert "output" not in json.loads(said)
            refused = [
                await _refused(conn, sql)
                for sql in (
                    f"select input from {SCHEMA}.runs",
                    f"select current_wait from {SCHEMA}.runs",
                    f"select * from {SCHEMA}.run_runtime_api",
                    f"select {SCHEMA}.run_status('{run_id}')",
                    f"select {SCHEMA}.queue_open_tasks('runs_rel_roles')",
                    f"insert into {SCHEMA}.page_actions (who) values ('x')",
                    "select * from absurd.queues",
                )
            ]
            assert [r for r in refused if r] == [], job
        finally:
            await conn.close()


def test_roles_refuses_an_unusable_prefix() -> None:
    made = subprocess.run(
        [sys.executable, "-m", "worker", "roles", "--prefix", "Bad;drop"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 2
    assert "role prefix" in made.stderr
    assert made.stdout == ""


async def test_a_role_granted_the_store_by_hand_keeps_its_functions(
    database_url: str, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    # The store as 0040 left it (every function PUBLIC's and its caller's), and an
    # operator's own worker role granted the tables by hand; then 0041 is applied.
    hand = "lwt_hand_" + secrets.token_hex(5)
    await owner.execute(
        f"delete from {SCHEMA}.schema_migrations where version = 41;"
        f"grant execute on all functions in schema {SCHEMA} to public;"
        + "".join(
            f"alter function {SCHEMA}.{sig} security invoker reset search_path;"
            for sig in role_sql.DEFINER_FUNCTIONS
        )
        + f"create role {hand} nologin;"
        f"grant usage on schema {SCHEMA} to {hand};"
        f"grant select, insert, update, delete on all tables in schema {SCHEMA} to {hand};"
    )
    try:
        env = {**os.environ, "WORKFLOW_RUNTIME_POSTGRES": database_url}
        env.pop("LANE_WORKER_STORE_SCHEMA", None)
        env.pop("DEEPLINE_RUNTIME_SCHEDULER_SCHEMA", None)
        made = subprocess.run(  # noqa: ASYNC221 (the real command, once)
            [sys.executable, "-m", "worker", "migrate", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["storeApplied"] == [41]
        lost = await owner.fetch(
            "select p.oid::regprocedure::text from pg_proc p where p.pronamespace = "
            "$1::regnamespace and not has_function_privilege($2, p.oid, 'execute')",
            SCHEMA,
            hand,
        )
        assert [r[0] for r in lost] == []
    finally:
        await owner.execute(f"drop owned by {hand}; drop role {hand}")


def test_roles_prints_without_connecting() -> None:
    env = {**os.environ, "WORKFLOW_RUNTIME_POSTGRES": "postgresql://nobody@127.0.0.1:1/none"}
    env["LANE_WORKER_STORE_SCHEMA"] = "lw_store"
    made = subprocess.run(
        [sys.executable, "-m", "worker", "roles", "--prefix", "acme", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    assert report["storeSchema"] == "lw_store"
    assert report["applied"] is False
    assert [r["role"] for r in report["roles"]] == [f"acme_{job}" for job in role_sql.JOBS]
    app = report["roles"][0]["statements"]
    assert 'grant usage on schema "lw_store" to "acme_app"' in app
    assert not any("table" in s for s in app)


async def test_a_role_without_the_ledger_is_not_told_another_system_owns_the_store(
    logins: Logins,
) -> None:
    # information_schema hid the ledger's columns from the app's role, so migrate (the
    # Python client's first submit) said the store was another system's (StoreSchemaConflict).
    app = await _as(logins, "app")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="schema_migrations"):
            await schema.refuse_conflicts(app, SCHEMA)
    finally:
        await app.close()


async def test_worker_uses_the_engine_tables_of_a_lane_made_after_the_grants(
    logins: Logins, owner: asyncpg.Connection[asyncpg.Record]
) -> None:
    made = await _submit(owner, "rel-later")  # its queue is created after `roles --apply`
    worker = await _as(logins, "worker")
    try:
        assert (
            await worker.fetchval(
                "select count(*) from absurd.t_runs_rel_later where params->>'runId' = $1",
                str(made["runId"]),
            )
            == 1
        )
        assert (
            await worker.fetchval(
                f"select input->>'secret' from {SCHEMA}.runs where run_id = $1", made["runId"]
            )
            == "input-of-rel-later"
        )
        refused = [
            await _refused(worker, sql)
            for sql in (
                f"create table {SCHEMA}.mine (x int)",
                "create table absurd.mine (x int)",
                f"drop table {SCHEMA}.runs",
                "select absurd.create_queue('runs_worker_made')",
                # Which roles migrate grants again is the owner's record (store 0043).
                f"insert into {SCHEMA}.role_templates (prefix) values ('evil')",
            )
        ]
        assert [r for r in refused if r] == []
    finally:
        await worker.close()
