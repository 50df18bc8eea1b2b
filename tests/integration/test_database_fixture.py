"""The real-database fixtures: a working server, a fresh isolated database per test (migrated
once, in the session's template), and an empty one for tests that must start from nothing."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import asyncpg
import pytest

from support.pgfixture import DatabaseFactory, PgServer


@pytest.fixture
def second_database_url(pg_databases: DatabaseFactory) -> Iterator[str]:
    """Another fresh database for the same test, made the way ``database_url`` is."""
    with pg_databases.fresh_database() as url:
        yield url


async def test_connection_reports_server_version(db: asyncpg.Connection[asyncpg.Record]) -> None:
    """The per-test connection works and the server reports a supported version."""
    version_num = int(await db.fetchval("SHOW server_version_num"))
    version = await db.fetchval("SHOW server_version")
    assert version_num >= 130000
    assert version.split(".")[0] == str(version_num // 10000)
    assert await db.fetchval("SELECT 1") == 1


async def test_two_fresh_databases_do_not_share_tables(
    db: asyncpg.Connection[asyncpg.Record], second_database_url: str
) -> None:
    """A table and row written in one fresh database do not exist in another."""
    await db.execute(
        "CREATE TABLE isolation_probe (id int); INSERT INTO isolation_probe VALUES (1)"
    )
    assert await db.fetchval("SELECT count(*) FROM isolation_probe") == 1
    other = await asyncpg.connect(second_database_url)
    try:
        assert await other.fetchval("SELECT current_database()") != await db.fetchval(
            "SELECT current_database()"
        )
        assert await other.fetchval("SELECT to_regclass('public.isolation_probe')") is None
    finally:
        await other.close()


@pytest.mark.parametrize("round_", [1, 2, 3])
async def test_writes_never_reach_later_tests(
    db: asyncpg.Connection[asyncpg.Record], round_: int
) -> None:
    """Whichever round runs later, it finds none of the earlier rounds' table."""
    assert await db.fetchval("SELECT to_regclass('public.later_probe')") is None
    await db.execute("CREATE TABLE later_probe (round int)")
    await db.execute("INSERT INTO later_probe VALUES ($1)", round_)


@pytest.fixture
def second_empty_database_url(pg_databases: DatabaseFactory) -> Iterator[str]:
    """Another database without schemas, made the way ``empty_database_url`` is."""
    with pg_databases.empty_database() as url:
        yield url


async def test_absurd_schema_name_is_free_in_each_database(
    empty_database_url: str, second_empty_database_url: str
) -> None:
    """CREATE SCHEMA absurd succeeds in two empty databases of the same session."""
    for url in (empty_database_url, second_empty_database_url):
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT to_regnamespace('absurd')") is None
            await conn.execute("CREATE SCHEMA absurd")
            assert await conn.fetchval("SELECT to_regnamespace('absurd')::text") == "absurd"
        finally:
            await conn.close()


async def test_a_fresh_database_holds_the_schemas_migrate_installs_and_nothing_else(
    database_url: str, pg_databases: DatabaseFactory
) -> None:
    """The template was migrated once: engine and store current, no queue, no lane, no row."""
    from worker.client import LaneClient

    assert pg_databases.migrated is not None
    assert pg_databases.migrated.store_schema == "runtime_scheduler"
    client = await LaneClient.connect(database_url, env={}, retry_for_s=5)
    try:
        await client.check_schemas()  # raises SchemasMissingError unless both are current
        engine, store = await client.migrate()  # as a test's own migrate: nothing to do
        assert (engine, store.applied) == ("current", ())
        assert store.current == pg_databases.migrated.store_version
    finally:
        await client.close()
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM absurd.queues") == 0
        assert await conn.fetchval("SELECT count(*) FROM runtime_scheduler.releases") == 0
        assert await conn.fetchval("SELECT count(*) FROM runtime_scheduler.runs") == 0
    finally:
        await conn.close()


async def test_an_empty_database_has_no_schema_of_lane_workers(empty_database_url: str) -> None:
    """``empty_database_url`` holds neither the engine schema nor the store nor the claim."""
    conn = await asyncpg.connect(empty_database_url)
    try:
        schemas = {
            row["nspname"]
            for row in await conn.fetch(
                "SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_'"
                " AND nspname <> 'information_schema'"
            )
        }
    finally:
        await conn.close()
    assert schemas == {"public"}


async def test_subprocess_connects_with_database_url(database_url: str) -> None:
    """A child process given the URL (as WORKFLOW_RUNTIME_POSTGRES) reaches the same database."""
    script = (
        "import asyncio, os, asyncpg\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(os.environ['WORKFLOW_RUNTIME_POSTGRES'])\n"
        "    print(await conn.fetchval('SELECT current_database()'))\n"
        "    await conn.close()\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        env={**os.environ, "WORKFLOW_RUNTIME_POSTGRES": database_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, stderr.decode()
    conn = await asyncpg.connect(database_url)
    try:
        assert stdout.decode().strip() == await conn.fetchval("SELECT current_database()")
    finally:
        await conn.close()


async def test_only_live_databases_of_this_session_exist(
    pg_server: PgServer, pg_databases: DatabaseFactory, db: asyncpg.Connection[asyncpg.Record]
) -> None:
    """Earlier tests' databases are dropped: only the template and this test's remain."""
    admin = await asyncpg.connect(pg_server.admin_url)
    try:
        names = {
            row["datname"]
            for row in await admin.fetch(
                "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
                pg_databases.prefix,
            )
        }
    finally:
        await admin.close()
    assert names == {pg_databases.template, await db.fetchval("SELECT current_database()")}


def test_urls_keep_the_socket_and_never_show_the_password() -> None:
    """url_for swaps only the database; repr and redact hide the password."""
    server = PgServer(
        admin_url="postgresql://app:s3cret@db.example:6543/postgres?sslmode=require&dbname=x",
        kind="external",
    )
    assert server.url_for("t_1") == "postgresql://app:s3cret@db.example:6543/t_1?sslmode=require"
    assert "s3cret" not in repr(server)
    socket = PgServer(
        admin_url="postgresql://postgres@/postgres?host=%2Ftmp%2Flw&port=5432", kind="embedded"
    )
    assert socket.url_for("t_2") == "postgresql://postgres@/t_2?host=%2Ftmp%2Flw&port=5432"
