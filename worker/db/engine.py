"""A thin client of the Absurd engine's stored functions, and the engine schema's install.

The engine schema is not written here: it is ``absurdctl.BUNDLED_SCHEMA_SQL``
(and absurdctl's bundled migrations to upgrade an older one). The only
addition is this project's continuation claim, in its own schema
(``sql/engine/claim_lane.sql``). Every function takes the connection to
run on, so callers decide what commits together.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import absurdctl
import asyncpg

from worker.db.pool import Connection
from worker.db.sql import queue_query
from worker.errors import EngineSchemaError, RunCancelledError, RunNotRunningError

ENGINE_SCHEMA_VERSION: str = absurdctl.ABSURD_SCHEMA_TARGET_VERSION
QUEUE_CLEANUP_TTL = "6 hours"
QUEUE_CLEANUP_LIMIT = 1000
# pg_advisory_xact_lock key shared by every lane-worker install step ("lwschema").
_INSTALL_LOCK_KEY = 0x6C77_7363_6865_6D61
_CANCELLED = "AB001"
_ALREADY_FAILED = "AB002"


def datetime_from_ms(epoch_ms: int) -> datetime:
    """Return the UTC datetime of a Unix time in milliseconds."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


# The columns a claim returns (both claim functions return the engine's row shape).
_CLAIMED = "run_id, task_id, attempt, task_name, params, max_attempts, wake_event, event_payload"


def _sql(name: str) -> str:
    return resources.files("worker.sql").joinpath(name).read_text(encoding="utf-8")


def _version_key(version: str) -> tuple[Any, ...]:
    key: tuple[Any, ...] = absurdctl.version_sort_key(version)
    return key


async def installed_engine_version(conn: Connection) -> str | None:
    """Return the engine schema version in the database, or None when it is not installed."""
    present = await conn.fetchval(
        "select to_regprocedure('absurd.get_schema_version()') is not null"
    )
    if not present:
        return None
    version: str = await conn.fetchval("select absurd.get_schema_version()")
    return version


def _refuse_newer(version: str) -> None:
    if _version_key(version) > _version_key(ENGINE_SCHEMA_VERSION):
        raise EngineSchemaError(
            f"the database holds Absurd engine schema {version}, newer than "
            f"{ENGINE_SCHEMA_VERSION} which this build knows; deploy a lane-worker built "
            "against the newer schema.",
            found=version,
            expected=ENGINE_SCHEMA_VERSION,
        )


async def engine_schema_current(conn: Connection) -> bool:
    """Tell whether the engine schema is installed at this build's version; change nothing.

    Raises ``EngineSchemaError`` when it is newer than this build knows.
    """
    version = await installed_engine_version(conn)
    if version is None:
        return False
    _refuse_newer(version)
    current = version == ENGINE_SCHEMA_VERSION
    # The continuation claim functions come with the engine install (migrate).
    return current and bool(
        await conn.fetchval("select to_regnamespace('lane_worker') is not null")
    )


async def ensure_engine_schema(conn: Connection) -> str:
    """Install or upgrade the engine schema and the continuation claim; return what was done.

    Safe when many workers boot at once: one transaction-scoped advisory lock
    (it survives PgBouncer transaction pooling) serialises the check and the install.
    """
    async with conn.transaction():
        await conn.execute("select pg_advisory_xact_lock($1)", _INSTALL_LOCK_KEY)
        version = await installed_engine_version(conn)
        if version is None:
            await conn.execute(absurdctl.BUNDLED_SCHEMA_SQL)
            outcome = f"installed {ENGINE_SCHEMA_VERSION}"
        elif version != ENGINE_SCHEMA_VERSION:
            _refuse_newer(version)
            steps = absurdctl.resolve_migration_path(
                version, ENGINE_SCHEMA_VERSION, absurdctl.discover_bundled_migrations()
            )
            if steps is None:
                raise EngineSchemaError(
                    f"no migration path from Absurd engine schema {version} to "
                    f"{ENGINE_SCHEMA_VERSION}; upgrade the schema with absurdctl first.",
                    found=version,
                    expected=ENGINE_SCHEMA_VERSION,
                )
            for step in steps:
                await conn.execute(absurdctl.get_migration_sql(step))
            outcome = f"upgraded {version} -> {ENGINE_SCHEMA_VERSION}"
        else:
            outcome = "current"
        await conn.execute(_sql("engine/claim_lane.sql"))
    return outcome


async def ensure_queue(conn: Connection, queue: str) -> None:
    """Create ``queue`` if it is missing and set its cleanup policy (idempotent)."""
    await conn.execute("select absurd.create_queue($1)", queue)
    await conn.execute(
        "select absurd.set_queue_policy($1, $2::jsonb)",
        queue,
        {"cleanup_ttl": QUEUE_CLEANUP_TTL, "cleanup_limit": QUEUE_CLEANUP_LIMIT},
    )


@dataclass(frozen=True)
class Spawned:
    """The engine task a spawn created, or found under the same idempotency key."""

    task_id: uuid.UUID
    run_id: uuid.UUID | None
    attempt: int | None
    created: bool


async def spawn(
    conn: Connection,
    queue: str,
    task_name: str,
    params: Any,
    *,
    max_attempts: int,
    retry_strategy: dict[str, Any],
    idempotency_key: str | None = None,
    headers: dict[str, Any] | None = None,
) -> Spawned:
    """Spawn one task on ``queue``."""
    options: dict[str, Any] = {"max_attempts": max_attempts, "retry_strategy": retry_strategy}
    if idempotency_key is not None:
        options["idempotency_key"] = idempotency_key
    if headers:
        options["headers"] = headers
    row = await conn.fetchrow(
        "select task_id, run_id, attempt, created from absurd.spawn_task($1, $2, $3, $4)",
        queue,
        task_name,
        params,
        options,
    )
    assert row is not None  # spawn_task always returns one row
    return Spawned(row["task_id"], row["run_id"], row["attempt"], row["created"])


@dataclass(frozen=True)
class ClaimedRun:
    """One engine run handed to this worker, with its lease."""

    queue: str
    run_id: uuid.UUID
    task_id: uuid.UUID
    attempt: int
    task_name: str
    params: Any
    max_attempts: int | None
    wake_event: str | None
    event_payload: Any


@dataclass(frozen=True)
class ClaimBatch:
    """What a claim call returned: the runs, and how many expired leases it swept."""

    runs: tuple[ClaimedRun, ...]
    swept: int


# lane_worker.claim_lane's modes (sql/engine/claim_lane.sql says what each hands out).
CLAIM_OWN = "own"
CLAIM_ADOPT = "adopt"
CLAIM_MINE = "mine"
CLAIM_DRAIN = "drain"


async def claim(
    conn: Connection,
    queue: str,
    worker_id: str,
    *,
    lease_s: int,
    qty: int,
    mode: str | None = None,
    store_schema: str | None = None,
    own_queue: str | None = None,
    plays: list[str] | None = None,
) -> ClaimBatch:
    """Claim up to ``qty`` runs from ``queue``.

    Without ``mode``, the engine's own claim (a claiming release on its own
    queue). With a mode (``CLAIM_OWN``, ``CLAIM_ADOPT``, ``CLAIM_MINE``,
    ``CLAIM_DRAIN``), ``lane_worker.claim_lane``, which needs the run-state
    store's schema, the claimer's own lane queue and its app's plays.
    """
    if mode is not None:
        rows = await conn.fetch(
            f"select {_CLAIMED}, swept from lane_worker.claim_lane($1, $2, $3, $4, $5, $6, $7, $8)",
            queue,
            worker_id,
            lease_s,
            qty,
            store_schema,
            own_queue,
            mode,
            plays or [],
        )
    else:
        rows = await conn.fetch(
            f"select {_CLAIMED}, 0 as swept from absurd.claim_task($1, $2, $3, $4)",
            queue,
            worker_id,
            lease_s,
            qty,
        )
    runs = tuple(
        ClaimedRun(
            queue=queue,
            run_id=r["run_id"],
            task_id=r["task_id"],
            attempt=r["attempt"],
            task_name=r["task_name"],
            params=r["params"],
            max_attempts=r["max_attempts"],
            wake_event=r["wake_event"],
            event_payload=r["event_payload"],
        )
        for r in rows
        if r["run_id"] is not None
    )
    return ClaimBatch(runs=runs, swept=max((r["swept"] for r in rows), default=0))


def _engine_error(exc: asyncpg.PostgresError, run_id: uuid.UUID) -> Exception:
    if exc.sqlstate == _CANCELLED:
        return RunCancelledError(f"run {run_id} was cancelled", engine_run_id=run_id)
    return RunNotRunningError(
        f"engine run {run_id} is no longer held by this worker: {exc}", engine_run_id=run_id
    )


async def _lease_call(conn: Connection, sql: str, run_id: uuid.UUID, *args: Any) -> None:
    # These engine calls raise when the run is not ours any more (lease lost,
    # cancelled, already failed); translate that into errors the runtime acts on.
    try:
        await conn.execute(sql, *args)
    except asyncpg.RaiseError as exc:
        raise _engine_error(exc, run_id) from exc
    except asyncpg.PostgresError as exc:
        if exc.sqlstate in (_CANCELLED, _ALREADY_FAILED):
            raise _engine_error(exc, run_id) from exc
        raise


async def complete(conn: Connection, queue: str, run_id: uuid.UUID, result: Any) -> None:
    """Complete a running run with ``result``."""
    await _lease_call(conn, "select absurd.complete_run($1, $2, $3)", run_id, queue, run_id, result)


async def fail(
    conn: Connection,
    queue: str,
    run_id: uuid.UUID,
    reason: dict[str, Any],
    *,
    retry_at: datetime | None = None,
) -> None:
    """Fail a run; the engine retries it while attempts remain."""
    await _lease_call(
        conn, "select absurd.fail_run($1, $2, $3, $4)", run_id, queue, run_id, reason, retry_at
    )


async def schedule(conn: Connection, queue: str, run_id: uuid.UUID, wake_at: datetime) -> None:
    """Put a running run back to sleep until ``wake_at``; no attempt is spent."""
    await _lease_call(
        conn, "select absurd.schedule_run($1, $2, $3)", run_id, queue, run_id, wake_at
    )


async def schedule_in(conn: Connection, queue: str, run_id: uuid.UUID, delay_s: float) -> None:
    """Put a running run back to sleep for ``delay_s`` seconds of the database's clock."""
    await _lease_call(
        conn,
        "select absurd.schedule_run($1, $2,"
        " absurd.current_time() + make_interval(secs => $3::double precision))",
        run_id,
        queue,
        run_id,
        delay_s,
    )


async def lock_if_held(conn: Connection, queue: str, run_id: uuid.UUID, worker_id: str) -> bool:
    """Lock engine run ``run_id`` and tell whether it is still running under ``worker_id``."""
    held = await conn.fetchval(queue_query("lock_if_held", queue), run_id, worker_id)
    return bool(held)


async def extend_claim(conn: Connection, queue: str, run_id: uuid.UUID, by_s: int) -> None:
    """Extend a run's lease by ``by_s`` seconds from now."""
    await _lease_call(conn, "select absurd.extend_claim($1, $2, $3)", run_id, queue, run_id, by_s)


async def get_checkpoints(
    conn: Connection, queue: str, task_id: uuid.UUID, run_id: uuid.UUID
) -> dict[str, Any]:
    """Return the committed checkpoints this run may see, by name."""
    rows = await conn.fetch(
        "select checkpoint_name, state from absurd.get_task_checkpoint_states($1, $2, $3)",
        queue,
        task_id,
        run_id,
    )
    return {r["checkpoint_name"]: r["state"] for r in rows}


async def set_checkpoint(
    conn: Connection,
    queue: str,
    task_id: uuid.UUID,
    name: str,
    state: Any,
    run_id: uuid.UUID,
    *,
    extend_lease_s: int | None = None,
) -> None:
    """Commit checkpoint ``name`` for the task, extending the lease when asked."""
    await _lease_call(
        conn,
        "select absurd.set_task_checkpoint_state($1, $2, $3, $4, $5, $6)",
        run_id,
        queue,
        task_id,
        name,
        state,
        run_id,
        extend_lease_s,
    )


async def await_event(
    conn: Connection,
    queue: str,
    task_id: uuid.UUID,
    run_id: uuid.UUID,
    step_name: str,
    event_name: str,
    timeout_s: int | None,
) -> tuple[bool, Any]:
    """Wait for an engine event: ``(True, None)`` means the run is now parked."""
    try:
        row = await conn.fetchrow(
            "select should_suspend, payload from absurd.await_event($1, $2, $3, $4, $5, $6)",
            queue,
            task_id,
            run_id,
            step_name,
            event_name,
            timeout_s,
        )
    except asyncpg.PostgresError as exc:
        if exc.sqlstate == _CANCELLED:
            raise _engine_error(exc, run_id) from exc
        raise
    assert row is not None  # await_event always returns one row
    return bool(row["should_suspend"]), row["payload"]


async def emit_event(conn: Connection, queue: str, event_name: str, payload: Any) -> None:
    """Emit an engine event on ``queue`` (first emit wins)."""
    await conn.execute("select absurd.emit_event($1, $2, $3)", queue, event_name, payload)


async def cancel(conn: Connection, queue: str, task_id: uuid.UUID) -> None:
    """Cancel a task; a terminal task is left as it is."""
    await conn.execute("select absurd.cancel_task($1, $2)", queue, task_id)


async def task_state(conn: Connection, queue: str, task_id: uuid.UUID) -> str | None:
    """Return the engine task's state, or None when the task is gone (cleaned up)."""
    state: str | None = await conn.fetchval(
        "select state from absurd.get_task_result($1, $2)", queue, task_id
    )
    return state


async def cleanup(conn: Connection, queue: str | None = None) -> list[tuple[str, int, int]]:
    """Run one bounded cleanup batch by each queue's policy; return deletions per queue."""
    rows = await conn.fetch(
        "select queue_name, tasks_deleted, events_deleted from absurd.cleanup_all_queues($1)",
        queue,
    )
    return [(r["queue_name"], r["tasks_deleted"], r["events_deleted"]) for r in rows]


async def queue_exists(conn: Connection, queue: str) -> bool:
    """Tell whether the engine has queue ``queue`` (``lanes prune`` drops a drained one)."""
    found: bool = await conn.fetchval(
        "select exists (select 1 from absurd.queues where queue_name = $1)", queue
    )
    return found


async def held_runs(conn: Connection, queue: str, worker_id: str) -> list[asyncpg.Record]:
    """Return the engine runs (run_id, task_id, attempt) ``worker_id`` holds on ``queue``."""
    return await conn.fetch(queue_query("held_runs", queue), worker_id)


async def next_due_in_s(
    conn: Connection,
    queue: str,
    *,
    mode: str | None = None,
    store_schema: str | None = None,
    own_queue: str | None = None,
    plays: list[str] | None = None,
) -> float | None:
    """Seconds until ``claim`` (with the same arguments) hands out a run of ``queue``, if any.

    Negative: one is due already; measured on the database's clock, which the
    engine wakes runs by.
    """
    if mode is None:
        due: float | None = await conn.fetchval(queue_query("next_due", queue))
    else:
        # The same filter as the claim: only runs this loop would be handed.
        due = await conn.fetchval(
            "select lane_worker.next_due_in($1, $2, $3, $4, $5)",
            queue, store_schema, own_queue, mode, plays or [],
        )  # fmt: skip
    return due
