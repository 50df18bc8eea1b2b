"""A thin client of the Absurd engine's stored functions and this project's claim functions.

Every function takes the connection to run on, so callers decide what commits
together. Here: queues, the runs a worker holds, and the calls on a held run that
its lease fences; the claims are ``engine_claims.py`` (re-exported here). The SQL
is in ``worker/sql/engine/queries.sql``; the engine schema's install is
``worker/db/engine_schema.py``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import asyncpg

# The claims (engine_claims.py), re-exported: callers say engine.claim, engine.ClaimedRun.
from worker.db.engine_claims import CLAIM_ADOPT as CLAIM_ADOPT
from worker.db.engine_claims import CLAIM_DRAIN as CLAIM_DRAIN
from worker.db.engine_claims import CLAIM_MINE as CLAIM_MINE
from worker.db.engine_claims import CLAIM_OWN as CLAIM_OWN
from worker.db.engine_claims import BeginOwn as BeginOwn
from worker.db.engine_claims import ClaimBatch as ClaimBatch
from worker.db.engine_claims import ClaimedRun as ClaimedRun
from worker.db.engine_claims import DueCheck as DueCheck
from worker.db.engine_claims import claim as claim
from worker.db.engine_claims import next_due_in_s as next_due_in_s
from worker.db.engine_claims import next_due_many as next_due_many
from worker.db.pool import Connection
from worker.db.sql import engine_query
from worker.errors import LeaseLostError, RunCancelledError, RunNotRunningError

# lane-worker's retention: the policy it sets on a queue it creates, and what the
# store's clean_own (migration 0023) keeps to for its own tasks on any queue.
QUEUE_CLEANUP_TTL = "6 hours"
QUEUE_CLEANUP_LIMIT = 1000
_CANCELLED = "AB001"
_ALREADY_FAILED = "AB002"
_NEWER_CLAIM = "LW001"  # a store function's fence: a newer claim owns the run


def datetime_from_ms(epoch_ms: int) -> datetime:
    """Return the UTC datetime of a Unix time in milliseconds."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)


# -- queues ---------------------------------------------------------------------


# Records, in the creating transaction, that this store created a queue (the
# store's ``lanes.record_created_queue``): what `lanes prune` may drop.
QueueRecorder = Callable[[Connection, str], Awaitable[None]]


async def ensure_queue(conn: Connection, queue: str, *, record: QueueRecorder | None) -> bool:
    """Create ``queue`` if it is missing; return whether this call created it.

    A queue that is there is left alone, whatever its storage mode (the app may
    create a partitioned one: the engine's claim and cleanup handle both).

    lane-worker's cleanup policy goes only on a queue it creates, in the same
    transaction (the caller's, or one of its own). A queue that was there before,
    the TypeScript app's when release ids coincide, keeps the policy its creator
    chose: the app's cleanup of its own tasks follows it (issue 29). lane-worker's
    own cleanup (the store's ``clean_own``) keeps to its own retention wherever.
    ``record`` is called in that transaction too when this call created the
    queue: every caller with a store passes the store's, so `lanes prune` can
    tell lane-worker's queues from another system's; None only where no store
    exists (an engine-only caller: nothing may prune what it made).
    """
    if conn.is_in_transaction():
        return await _create_queue(conn, queue, record)
    async with conn.transaction():
        return await _create_queue(conn, queue, record)


async def _create_queue(conn: Connection, queue: str, record: QueueRecorder | None) -> bool:
    await conn.execute(engine_query("create_queue"), queue)
    created: bool = await conn.fetchval(engine_query("queue_created_here"), queue)
    if created:
        await conn.execute(
            engine_query("set_queue_policy"),
            queue,
            {"cleanup_ttl": QUEUE_CLEANUP_TTL, "cleanup_limit": QUEUE_CLEANUP_LIMIT},
        )
        if record is not None:
            await record(conn, queue)
    return created


async def watch_queue(conn: Connection, queue: str) -> bool:
    """Have every run of ``queue`` that becomes pending or sleeping NOTIFY its workers.

    A trigger on the queue's engine run table (``lane_worker.watch_queue_v1``),
    installed once (an older build's trigger may sit beside it): runs written
    straight through the engine (an app that spawns without the store, a retry,
    a sleep, an event) wake the claim loops as a submit does, so the loops may
    poll rarely while LISTEN is connected.
    Return whether this call installed it.
    """
    installed: bool = await conn.fetchval(engine_query("watch_queue"), queue)
    return installed


async def queues_unprepared(conn: Connection, queues: list[str]) -> list[str]:
    """Return those of ``queues`` that lack their engine queue or ``watch_queue``'s trigger."""
    rows = await conn.fetch(engine_query("queues_unprepared"), queues)
    return [r["queue"] for r in rows]


async def queue_exists(conn: Connection, queue: str) -> bool:
    """Tell whether the engine has queue ``queue`` (``lanes prune`` drops a drained one)."""
    found: bool = await conn.fetchval(engine_query("queue_exists"), queue)
    return found


async def drop_queue(conn: Connection, queue: str) -> None:
    """Drop ``queue`` and its tables (waits for any writer of them to commit)."""
    await conn.execute(engine_query("drop_queue"), queue)


# -- tasks ----------------------------------------------------------------------


async def cancel(conn: Connection, queue: str, task_id: uuid.UUID) -> None:
    """Cancel a task; a terminal task is left as it is."""
    await conn.execute(engine_query("cancel_task"), queue, task_id)


async def task_state(conn: Connection, queue: str, task_id: uuid.UUID) -> str | None:
    """Return the engine task's state, or None when the task is gone (cleaned up)."""
    state: str | None = await conn.fetchval(engine_query("task_state"), queue, task_id)
    return state


@dataclass(frozen=True)
class HeldRun:
    """An engine run a worker still holds (its lease not given back)."""

    run_id: uuid.UUID
    task_id: uuid.UUID
    attempt: int


async def held(conn: Connection, queue: str, worker_id: str) -> list[HeldRun]:
    """Return the engine runs ``worker_id`` holds on ``queue``."""
    rows = await conn.fetch(engine_query("held_runs", queue=queue), worker_id)
    return [HeldRun(r["run_id"], r["task_id"], r["attempt"]) for r in rows]


async def lock_if_held(conn: Connection, queue: str, run_id: uuid.UUID, worker_id: str) -> bool:
    """Lock engine run ``run_id`` and tell whether it is still running under ``worker_id``."""
    return bool(await conn.fetchval(engine_query("lock_if_held", queue=queue), run_id, worker_id))


@dataclass(frozen=True)
class EndedTask:
    """An open store run whose engine task ended by itself, or vanished (``state`` None)."""

    run_id: uuid.UUID
    release_id: str
    state: str | None
    completed_payload: Any
    failure_reason: Any


async def ended_tasks(
    conn: Connection, queue: str, *, store_schema: str, limit: int
) -> list[EndedTask]:
    """Return up to ``limit`` open store runs of ``queue`` whose engine task ended."""
    sql = engine_query("reconcile_batch", queue=queue, schema=store_schema)
    return [
        EndedTask(
            run_id=r["run_id"],
            release_id=r["release_id"],
            state=r["state"],
            completed_payload=r["completed_payload"],
            failure_reason=r["failure_reason"],
        )
        for r in await conn.fetch(sql, queue, limit)
    ]


# -- a held run: the calls the lease fences --------------------------------------


def _engine_error(exc: asyncpg.PostgresError, run_id: uuid.UUID) -> Exception:
    if exc.sqlstate == _CANCELLED:
        return RunCancelledError(f"run {run_id} was cancelled", engine_run_id=run_id)
    return RunNotRunningError(
        f"engine run {run_id} is no longer held by this worker: {exc}", engine_run_id=run_id
    )


@contextlib.contextmanager
def fenced(run_id: uuid.UUID) -> Iterator[None]:
    """Translate what a fenced write raises when the run is not ours any more.

    The engine's refusals (lease lost, cancelled, already failed) become
    ``RunNotRunningError`` or ``RunCancelledError``; a store function's LW001
    (its fence shows a newer claim) becomes ``LeaseLostError``.
    """
    try:
        yield
    except asyncpg.RaiseError as exc:
        raise _engine_error(exc, run_id) from exc
    except asyncpg.PostgresError as exc:
        if exc.sqlstate == _NEWER_CLAIM:
            raise LeaseLostError(str(exc), engine_run_id=run_id) from exc
        if exc.sqlstate in (_CANCELLED, _ALREADY_FAILED):
            raise _engine_error(exc, run_id) from exc
        raise


async def _lease_call(conn: Connection, name: str, run_id: uuid.UUID, *args: Any) -> None:
    # These engine calls raise when the run is not ours any more (lease lost,
    # cancelled, already failed); translate that into errors the runtime acts on.
    with fenced(run_id):
        await conn.execute(engine_query(name), *args)


async def complete(conn: Connection, queue: str, run_id: uuid.UUID, result: Any) -> None:
    """Complete a running run with ``result``."""
    await _lease_call(conn, "complete_run", run_id, queue, run_id, result)


async def fail(
    conn: Connection,
    queue: str,
    run_id: uuid.UUID,
    reason: dict[str, Any],
    *,
    retry_at: datetime | None = None,
) -> None:
    """Fail a run; the engine retries it while attempts remain."""
    await _lease_call(conn, "fail_run", run_id, queue, run_id, reason, retry_at)


async def schedule(conn: Connection, queue: str, run_id: uuid.UUID, wake_at: datetime) -> None:
    """Put a running run back to sleep until ``wake_at``; no attempt is spent."""
    await _lease_call(conn, "schedule_run", run_id, queue, run_id, wake_at)


async def schedule_in(conn: Connection, queue: str, run_id: uuid.UUID, delay_s: float) -> None:
    """Put a running run back to sleep for ``delay_s`` seconds of the database's clock."""
    await _lease_call(conn, "schedule_run_in", run_id, queue, run_id, delay_s)


# How long a lease extension waits for its run's row lock at most.
EXTEND_LOCK_WAIT_MS = 100


async def extend_claim(conn: Connection, queue: str, run_id: uuid.UUID, by_s: int) -> None:
    """Extend a run's lease by ``by_s`` seconds from now.

    Raises ``asyncpg.LockNotAvailableError`` when the run's row stayed locked
    for ``EXTEND_LOCK_WAIT_MS``: the connection is not held for the lock.
    """
    await _lease_call(conn, "extend_claim", run_id, queue, run_id, by_s, EXTEND_LOCK_WAIT_MS)


async def set_checkpoint(
    conn: Connection,
    queue: str,
    task_id: uuid.UUID,
    name: str,
    state: str | None,
    run_id: uuid.UUID,
    *,
    extend_lease_s: int | None = None,
) -> None:
    """Commit checkpoint ``name`` (``state``: its JSON text) for the task, extending the lease."""
    await _lease_call(
        conn, "set_checkpoint_state", run_id, queue, task_id, name, state, run_id, extend_lease_s
    )


class AwaitedEvent(NamedTuple):
    """What ``await_event`` answered: parked, or the event's payload if it was delivered."""

    suspended: bool
    delivered: bool
    payload: Any


async def await_event(
    conn: Connection,
    queue: str,
    task_id: uuid.UUID,
    run_id: uuid.UUID,
    step_name: str,
    event_name: str,
    timeout_s: int | None,
) -> AwaitedEvent:
    """Wait for an engine event: ``suspended`` means the run is now parked.

    ``delivered`` tells an event the engine holds (its payload may be JSON null,
    the payload of ``emit_event`` without one) from the engine's belief that the
    wait timed out (no payload at all); both read back as ``None`` in Python.
    """
    try:
        row = await conn.fetchrow(
            engine_query("await_event"), queue, task_id, run_id, step_name, event_name, timeout_s
        )
    except asyncpg.PostgresError as exc:
        if exc.sqlstate == _CANCELLED:
            raise _engine_error(exc, run_id) from exc
        raise
    assert row is not None  # await_event always returns one row
    return AwaitedEvent(bool(row["should_suspend"]), bool(row["delivered"]), row["payload"])
