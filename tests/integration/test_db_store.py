"""The run-state store against a real Postgres: migrations, the lane registry, the ledger."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from support.runtime import connect
from worker.db.schema import known_migrations
from worker.db.store import Store, quote_ident
from worker.errors import StoreSchemaError

SCHEMA = "pr_store_test"


@pytest.fixture
async def conn(database_url: str) -> asyncpg.Connection[asyncpg.Record]:
    """A connection to a fresh database with the store migrated."""
    connection = await connect(database_url)
    await Store(SCHEMA).migrate(connection)
    yield connection  # type: ignore[misc]
    await connection.close()


async def insert_run(
    store: Store, conn: asyncpg.Connection[asyncpg.Record], key: str | None
) -> uuid.UUID | None:
    """Insert a minimal launch row."""
    run_id = uuid.uuid4()
    launch = {"absurdReleaseId": "rel-1", "play": "p"}
    return await store.runs.insert(
        conn, run_id=run_id, play="p", input={}, launch=launch, release_id="rel-1",
        queue="runs_rel_1", idempotency_key=key, max_attempts=3,
    )  # fmt: skip


def test_quote_ident_doubles_quotes() -> None:
    """The identifier helper quotes and escapes, and refuses empty names."""
    assert quote_ident("pr_1") == '"pr_1"'
    assert quote_ident('a"b') == '"a""b"'
    with pytest.raises(ValueError, match="identifier"):
        quote_ident("")


async def test_migrations_are_rerunnable(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Running the migrations again applies nothing and leaves the version where it was."""
    report = await Store(SCHEMA).migrate(conn)
    assert report.applied == ()
    assert report.current == known_migrations()[-1].version
    tables = {
        r["table_name"]
        for r in await conn.fetch(
            "select table_name from information_schema.tables where table_schema = $1", SCHEMA
        )
    }
    assert tables == {
        "schema_migrations",
        "runs",
        "attempts",
        "signals",
        "ledger",
        "releases",
        "workers",
        "run_runtime_api",
        "runner_attempts",
        "run_sandboxes",
        "deployments",
        "deployment_events",
        "scaler_state",
        "store_identity",
        "created_queues",
        "scaler_creates",
        "page_actions",
        "release_hold",
        "role_templates",
    }


async def test_concurrent_migrations_apply_once(database_url: str) -> None:
    """Five workers migrating at once: each migration is recorded exactly once."""
    conns = [await connect(database_url) for _ in range(5)]
    try:
        reports = await asyncio.gather(*(Store("pr_race").migrate(c) for c in conns))
        assert sum(len(r.applied) for r in reports) == len(known_migrations())
    finally:
        for c in conns:
            await c.close()


async def test_unknown_compatible_migration_is_accepted(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A newer build's additive migration does not stop an older build."""
    await conn.execute(
        f'insert into "{SCHEMA}".schema_migrations (version, name, compatible) '
        "values (9998, $1, true)",
        "future_additive",
    )
    report = await Store(SCHEMA).migrate(conn)
    assert report.unknown_compatible == (9998,)
    assert report.current == 9998


async def test_unknown_incompatible_migration_is_refused(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A newer build's incompatible migration refuses this build, naming both versions."""
    await conn.execute(
        f'insert into "{SCHEMA}".schema_migrations (version, name, compatible) '
        "values (9999, $1, false)",
        "future_breaking",
    )
    with pytest.raises(StoreSchemaError) as caught:
        await Store(SCHEMA).migrate(conn)
    assert caught.value.found == 9999
    assert "9999" in str(caught.value)
    assert f"{known_migrations()[-1].version:04d}" in str(caught.value)


async def test_registration_never_unretires_a_lane(
    conn: asyncpg.Connection[asyncpg.Record],
) -> None:
    """A retired lane stays retired when its worker registers; activate is the way back."""
    store = Store(SCHEMA)
    lanes = store.lanes
    assert await lanes.register(conn, queue="runs_a", release_id="a") == "claiming"
    assert (
        await lanes.set_status(conn, queue="runs_a", status="retired", release_id="A") == "retired"
    )
    assert await lanes.register(conn, queue="runs_a", release_id="a") == "retired"
    claiming = await lanes.set_status(conn, queue="runs_a", status="claiming", release_id="a")
    assert claiming == "claiming"
    ids = await conn.fetchval(
        f'select release_ids from "{SCHEMA}".releases where queue = $1', "runs_a"
    )
    assert ids == ["a", "A"]


async def test_terminal_fact_is_written_once(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Two settles of one run: the first wins, the ledger holds exactly one terminal fact."""
    store = Store(SCHEMA)
    run_id = await insert_run(store, conn, None)
    assert run_id is not None
    settle = store.runs.settle
    assert await settle(conn, run_id, status="completed", source="worker", attempt_id=None)
    assert not await settle(conn, run_id, status="failed", source="worker", attempt_id=None)
    failed = {"type": "run.failed", "runId": str(run_id)}
    facts = await store.runs.facts(conn, run_id=run_id)
    assert [f.type for f in facts] == ["run.completed"]
    # Even a direct second insert is refused by the index.
    with pytest.raises(asyncpg.UniqueViolationError):
        await conn.execute(
            f"insert into {store.schema_sql}.ledger (run_id, type, fact) values ($1, $2, $3)",
            run_id, "run.failed", failed,
        )  # fmt: skip


async def test_idempotency_key_is_unique(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """A second launch row with the same idempotency key is not inserted."""
    store = Store(SCHEMA)
    first = await insert_run(store, conn, "k-1")
    assert first is not None
    assert await insert_run(store, conn, "k-1") is None
    assert (
        await conn.fetchval(
            f"select run_id from {store.schema_sql}.runs where idempotency_key = 'k-1'"
        )
        == first
    )
