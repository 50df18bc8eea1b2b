"""The database layer: JSON codecs, and retries of transient errors only."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from worker.db.pool import Database, PoolOptions, is_transient


def test_transient_errors_are_classified() -> None:
    """Connection loss, 40001 and 40P01 are transient; constraint violations are not."""
    assert is_transient(asyncpg.SerializationError("x"))
    assert is_transient(asyncpg.DeadlockDetectedError("x"))
    assert is_transient(asyncpg.ConnectionDoesNotExistError("x"))
    assert is_transient(asyncpg.CannotConnectNowError("x"))
    assert is_transient(ConnectionRefusedError())
    assert is_transient(asyncpg.InternalClientError("cannot switch to state 12"))
    assert not is_transient(asyncpg.UniqueViolationError("x"))
    assert not is_transient(asyncpg.RaiseError("x"))
    assert not is_transient(asyncpg.QueryCanceledError("x"))
    assert not is_transient(ValueError("x"))
    # 55000 is an outage only when the database refuses connections.
    refused = 'database "x" is not currently accepting connections'
    assert is_transient(asyncpg.ObjectNotInPrerequisiteStateError(refused))
    assert not is_transient(asyncpg.ObjectNotInPrerequisiteStateError("lock x not held"))


@pytest.fixture
async def database(database_url: str) -> Database:
    """A 2-connection lane-worker pool on a fresh database."""
    db = await Database.open(PoolOptions(url=database_url, retry_for_s=5))
    yield db  # type: ignore[misc]
    await db.close()


async def test_json_round_trips(database: Database) -> None:
    """Python values go into json/jsonb and come back as Python values."""
    value = {"a": [1, 2.5, None, True], "b": {"c": "é"}}
    assert await database.fetchval("select $1::jsonb", value) == value
    assert await database.fetchval("select $1::json", value) == value


async def test_application_name_is_set(database: Database) -> None:
    """Connections identify themselves to Postgres."""
    assert await database.fetchval("select current_setting('application_name')") == "lane-worker"


async def test_transaction_is_retried_after_its_connection_is_killed(database: Database) -> None:
    """A unit whose backend is terminated mid-way is re-run whole on a fresh connection."""
    await database.execute("create table t (n int)")
    calls = 0

    async def unit(conn: asyncpg.Connection[asyncpg.Record]) -> int:
        nonlocal calls
        calls += 1
        await conn.execute("insert into t values ($1)", calls)
        if calls == 1:
            await conn.execute("select pg_terminate_backend(pg_backend_pid())")
        return calls

    assert await database.transaction(unit) == 2
    assert calls == 2
    # The first try's insert died with its transaction.
    assert await database.fetch("select n from t") == [(2,)]


async def test_constraint_violation_is_not_retried(database: Database) -> None:
    """A unique violation surfaces at once, after exactly one try."""
    await database.execute("create table u (k int primary key)")
    calls = 0

    async def unit(conn: asyncpg.Connection[asyncpg.Record]) -> None:
        nonlocal calls
        calls += 1
        await conn.execute("insert into u values (1), (1)")

    with pytest.raises(asyncpg.UniqueViolationError):
        await database.transaction(unit)
    assert calls == 1


async def test_unreachable_server_fails_after_the_retry_budget() -> None:
    """Nothing listening: open() retries for its budget, then raises the connection error."""
    options = PoolOptions(url="postgresql://u:secret@127.0.0.1:1/none", retry_for_s=0.5)
    with pytest.raises(ConnectionRefusedError):
        await Database.open(options)


@pytest.mark.parametrize(("setting", "named_statements"), [("true", False), ("false", True)])
async def test_client_follows_pgbouncer_mode(
    database_url: str, setting: str, named_statements: bool
) -> None:
    """LANE_WORKER_PGBOUNCER=true keeps the client's connections free of named prepared statements.

    PgBouncer in transaction pooling moves a session between server connections, so a
    statement prepared on one is missing on the next.
    """
    from worker.client import LaneClient

    env = {"WORKFLOW_RUNTIME_POSTGRES": database_url, "LANE_WORKER_PGBOUNCER": setting}
    async with await LaneClient.connect(env=env, retry_for_s=5) as client:
        await client.migrate()
        run = await client.submit("greet", {"name": "ada"})
        await client.status(run.run_id)
        async with client.db.pool.acquire() as conn:
            await conn.fetchval("select $1::int", 1)
            prepared = await conn.fetchval(
                "select count(*) from pg_prepared_statements where name <> ''"
            )
    assert (prepared > 0) is named_statements


async def test_a_transaction_left_open_is_rolled_back_on_release(database: Database) -> None:
    """The pool resets no session state, but never hands out a connection inside a transaction."""
    await database.execute("create table kept (n int)")
    async with database.pool.acquire() as conn:
        await conn.execute("begin")
        await conn.execute("insert into kept values (1)")
    # max_size 2: acquiring both proves neither is still in the abandoned transaction.
    async with database.pool.acquire() as one, database.pool.acquire() as two:
        assert not one.is_in_transaction()
        assert not two.is_in_transaction()
        assert await one.fetchval("select count(*) from kept") == 0


async def test_a_database_closed_to_connections_for_a_while_is_ridden_out(
    database: Database, database_url: str
) -> None:
    """Connections refused for a while (a maintenance window), every backend ended: retried."""
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(urlunsplit(urlsplit(database_url)._replace(path="/postgres")))
    try:
        await admin.execute(f'alter database "{name}" allow_connections false')
        await admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where datname = $1", name
        )
        attempt = asyncio.create_task(database.fetchval("select 1"))
        await asyncio.sleep(1.0)
        assert not attempt.done()  # still retrying while refused
        await admin.execute(f'alter database "{name}" allow_connections true')
        assert await asyncio.wait_for(attempt, 10) == 1
    finally:
        await admin.execute(f'alter database "{name}" allow_connections true')
        await admin.close()
