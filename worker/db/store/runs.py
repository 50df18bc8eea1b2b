"""Store queries on runs: launch rows, their signals, facts, attempts and steps."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import (
    AttemptRow,
    FactRow,
    ListedRun,
    RunPageRow,
    RunRow,
    StepRow,
    args_of,
    row_of,
)

_LOCKS = {
    None: "get_run",
    "update": "lock_run",
    "share": "lock_run_shared",
    "engine_first": "lock_run_engine_first",
}


# Who settled a run, as its terminal fact's ``source`` says.
FactSource = Literal["worker", "reconciler", "client", "operator"]


@dataclass(frozen=True, slots=True)
class _InsertRun:
    """``insert_run``'s parameters, in its order ($1 ... $9)."""

    run_id: uuid.UUID
    play: str
    input: Any
    launch: dict[str, Any]
    release_id: str
    queue: str
    idempotency_key: str | None
    max_attempts: int
    retry_of: uuid.UUID | None


@dataclass(frozen=True, slots=True)
class _SettleRun:
    """``settle_run_by``'s parameters, in its order ($1 ... $7)."""

    run_id: uuid.UUID
    attempt_id: int | None  # the fence; None: unfenced
    status: str
    output: Any
    error: Any
    source: str
    own_attempt_id: int | None


class RunQueries(Queries):
    """Runs (``runs``), their signals (``signals``) and facts (``ledger``)."""

    FILE = "runs.sql"

    async def insert(
        self,
        conn: Connection,
        *,
        run_id: uuid.UUID,
        play: str,
        input: Any,
        launch: dict[str, Any],
        release_id: str,
        queue: str,
        idempotency_key: str | None,
        max_attempts: int,
        retry_of: uuid.UUID | None = None,
    ) -> uuid.UUID | None:
        """Insert a launch row; None when its idempotency key names another run already."""
        params = _InsertRun(
            run_id=run_id,
            play=play,
            input=input,
            launch=launch,
            release_id=release_id,
            queue=queue,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts,
            retry_of=retry_of,
        )
        inserted: uuid.UUID | None = await self._value(conn, "insert_run", *args_of(params))
        return inserted

    async def spawn_task(
        self, conn: Connection, *, run_id: uuid.UUID, queue: str, max_attempts: int
    ) -> uuid.UUID:
        """Spawn the engine task of a run row written in this transaction; wake its lane."""
        task_id: uuid.UUID = await self._value(conn, "spawn_run_task", run_id, queue, max_attempts)
        return task_id

    async def get(
        self,
        conn: Connection,
        run_id: uuid.UUID,
        *,
        lock: Literal["update", "share", "engine_first"] | None = None,
    ) -> RunRow | None:
        """Return the run's row; ``lock`` takes its row lock (``share``: waits for a move).

        ``engine_first``: ``update``, its engine task's rows locked before, as every
        transaction that locks both takes them (docs/DESIGN.md "Lock order").
        """
        return await self._row(conn, RunRow, _LOCKS[lock], run_id)

    async def mark_retried(
        self, conn: Connection, *, run_id: uuid.UUID, retry_id: uuid.UUID
    ) -> None:
        await self._run(conn, "mark_retried", run_id, retry_id)

    async def copy_signals(
        self,
        conn: Connection,
        *,
        from_run: uuid.UUID,
        to_run: uuid.UUID,
        leave_out: Sequence[str] = (),
    ) -> None:
        """Give retry ``to_run`` the events ``from_run`` received, but those in ``leave_out``."""
        await self._run(conn, "copy_signals", from_run, to_run, list(leave_out))

    async def long_signal_payloads(
        self, conn: Connection, *, run_id: uuid.UUID
    ) -> list[tuple[str, Any]]:
        """Return the run's signals whose payload may be unreadable: (event key, payload).

        A payload Python cannot decode comes back as the pool's ``Unreadable``.
        """
        rows = await self._records(conn, "long_signal_payloads", run_id)
        return [(r["event_key"], r["payload"]) for r in rows]

    async def copy_runtime_api(
        self, conn: Connection, *, from_run: uuid.UUID, to_run: uuid.UUID
    ) -> None:
        """Give retry ``to_run`` the runtime API context of ``from_run`` (if it had one)."""
        await self._run(conn, "copy_runtime_api", from_run, to_run)

    async def listed(
        self,
        conn: Connection,
        *,
        status: str | None,
        lane: str | None,
        play: str | None,
        limit: int,
    ) -> list[ListedRun]:
        """Return runs newest first; each filter applies when given."""
        return await self._rows(conn, ListedRun, "list_runs", status, lane, play, limit)

    async def move(
        self, conn: Connection, *, run_id: uuid.UUID, queue: str, release_id: str
    ) -> None:
        """Restamp a run onto another lane (``lanes move``)."""
        await self._run(conn, "move_run", run_id, queue, release_id)

    async def open_on_lane(self, conn: Connection, *, queue: str) -> list[uuid.UUID]:
        """Return the open runs whose effective lane is ``queue``, oldest first."""
        return [r["run_id"] for r in await self._records(conn, "lane_open_runs", queue)]

    async def queue_has_open(self, conn: Connection, *, queue: str) -> bool:
        return bool(await self._value(conn, "queue_has_open_runs", queue))

    async def settle(
        self,
        conn: Connection,
        run_id: uuid.UUID,
        *,
        status: str,
        source: FactSource,
        attempt_id: int | None,
        output: Any = None,
        error: Any = None,
        own_attempt_id: int | None = None,
    ) -> bool:
        """Move a run to a terminal status and append its one terminal fact.

        The store builds the fact (``terminal_fact``, migration 0032) from the
        status, output and error; ``source`` says who settled the run.

        Returns False (and writes nothing) when the fence does not match or the
        run is already terminal: whoever settled it first wrote the fact. The
        run's other attempts that recorded no end are closed as lost leases
        (see settle_run), except ``own_attempt_id``, which the caller ends.
        """
        params = _SettleRun(
            run_id=run_id,
            attempt_id=attempt_id,
            status=status,
            output=output,
            error=error,
            source=source,
            own_attempt_id=own_attempt_id,
        )
        return await self._value(conn, "settle_run", *args_of(params)) is not None

    async def page(self, conn: Connection, *, run_id: uuid.UUID) -> RunPageRow | None:
        """What the run page shows beside ``run_status``; None for an unknown run."""
        if await self._payloads_readable(conn):
            return await self._row(conn, RunPageRow, "run_page", run_id)
        return await self._row(conn, RunPageRow, "run_page_bookkeeping", run_id)

    async def facts(self, conn: Connection, *, run_id: uuid.UUID) -> list[FactRow]:
        """The run's ledger facts, oldest first."""
        return await self._rows(conn, FactRow, "run_facts", run_id)

    async def attempts(self, conn: Connection, *, run_id: uuid.UUID) -> list[AttemptRow]:
        """The run's attempts, in the order they were recorded."""
        return await self._rows(conn, AttemptRow, "run_attempts", run_id)

    async def steps(
        self, conn: Connection, *, queue: str, task_id: uuid.UUID, run_id: uuid.UUID
    ) -> list[StepRow]:
        """Return which attempt committed each checkpoint of the run's task."""
        sql = self._on_queue("step_provenance", queue)
        return [row_of(StepRow, r) for r in await conn.fetch(sql, task_id, run_id)]
