"""Store queries on attempts: recording a claim, the fenced writes while it runs, its end."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import Begun, ClaimedRunState, DeferralCount, args_of, columns_of


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    """A step's engine checkpoint (the engine's set_task_checkpoint_state), alone or in a set.

    The one encoding of the write: sent alone (``engine.set_checkpoint``) or
    with others (``write_sets``), from the same value. Its fields are
    ``write_sets``' checkpoint arrays, in their order ($2 ... $7).
    """

    queue: str
    task_id: uuid.UUID
    name: str
    state: str | None  # JSON, encoded once by its writer; None is SQL null
    engine_run_id: uuid.UUID
    extend_s: int | None  # the lease's extension, seconds


@dataclass(frozen=True, slots=True)
class CompletionWrite:
    """A completing attempt, alone (``complete``) or as one of a set (``write_sets``).

    Its fields are ``write_sets``' completion arrays, in their order ($8 ... $12),
    and ``complete_attempt``'s parameters ($1 ... $5): no fact, the store builds it.
    """

    queue: str
    engine_run_id: uuid.UUID
    output: str | None  # JSON, encoded once by its writer; None is SQL null
    run_id: uuid.UUID
    attempt_id: int


@dataclass(frozen=True, slots=True)
class _BeginAttempt:
    """``begin_attempt``'s parameters, in its order ($1 ... $11)."""

    run_id: uuid.UUID
    engine_run_id: uuid.UUID
    attempt: int
    worker_id: str
    release_id: str
    disposition: str
    adopted_release_id: str | None
    adopted_queue: str | None
    step_keys: int
    task_id: uuid.UUID
    queue: str


class AttemptQueries(Queries):
    """Attempts (``attempts``) and the run writes fenced by the current one."""

    FILE = "attempts.sql"

    async def lane_state(self, conn: Connection, *, task_id: uuid.UUID) -> ClaimedRunState | None:
        """Return what a loop needs to decide on the claimed engine task, or None (no launch)."""
        return await self._row(conn, ClaimedRunState, "lane_state", task_id)

    async def begin(
        self,
        conn: Connection,
        *,
        run_id: uuid.UUID,
        engine_run_id: uuid.UUID,
        attempt: int,
        worker_id: str,
        release_id: str,
        disposition: str,
        adopted_release_id: str | None,
        adopted_queue: str | None,
        step_keys: int,
        task_id: uuid.UUID,
        queue: str,
    ) -> Begun:
        """Record a claim; own and adopt also move the run's fence to it (see begin_attempt)."""
        params = _BeginAttempt(
            run_id=run_id,
            engine_run_id=engine_run_id,
            attempt=attempt,
            worker_id=worker_id,
            release_id=release_id,
            disposition=disposition,
            adopted_release_id=adopted_release_id,
            adopted_queue=adopted_queue,
            step_keys=step_keys,
            task_id=task_id,
            queue=queue,
        )
        begun = await self._row(conn, Begun, "begin_attempt", *args_of(params))
        assert begun is not None  # the insert always returns its row
        return begun

    async def complete(self, conn: Connection, write: CompletionWrite) -> None:
        """Complete the run with the write's output and end the attempt, in one statement.

        Nothing is written when the fence or the engine refuses: SQLSTATE LW001
        (a newer claim owns the run) or the engine's own error, which
        ``engine.fenced`` translates.
        """
        await self._run(conn, "complete_attempt", *args_of(write))

    async def write_sets(
        self,
        conn: Connection,
        checkpoints: list[CheckpointWrite],
        completions: list[CompletionWrite],
        *,
        lock_wait_ms: int,
    ) -> tuple[dict[int, str], dict[int, str]]:
        """Apply a batch's writes as typed arrays, one statement (``write_sets``).

        Return the SQLSTATE of each checkpoint and each completion that failed,
        by its position in its list; a failed write is undone alone, the others
        commit. A write that waits over ``lock_wait_ms`` for a lock fails (55P03).
        """
        rows = await self._records(
            conn,
            "write_sets",
            lock_wait_ms,
            *columns_of(CheckpointWrite, checkpoints),
            *columns_of(CompletionWrite, completions),
        )
        failed: tuple[dict[int, str], dict[int, str]] = ({}, {})
        for r in rows:
            failed[0 if r["kind"] == "checkpoint" else 1][r["write_at"]] = r["error_code"]
        return failed

    async def finish(
        self, conn: Connection, *, attempt_id: int, outcome: str, error: Any = None
    ) -> None:
        """Record how an attempt ended (once: an ended attempt is not touched)."""
        await self._run(conn, "finish_attempt", attempt_id, outcome, error)

    async def save_checkpoint(
        self, conn: Connection, *, run_id: uuid.UUID, attempt_id: int, envelope: dict[str, Any]
    ) -> bool:
        """Write the run's envelope if ``attempt_id`` is still its current attempt."""
        saved = await self._value(conn, "save_checkpoint", run_id, attempt_id, envelope)
        return saved is not None

    async def park(
        self,
        conn: Connection,
        *,
        run_id: uuid.UUID,
        attempt_id: int,
        wait: dict[str, Any],
        envelope: dict[str, Any],
    ) -> bool:
        """Mark the run waiting in ``wait`` if ``attempt_id`` is still its current attempt."""
        parked = await self._value(conn, "park_run", run_id, attempt_id, wait, envelope)
        return parked is not None

    async def lock_running(self, conn: Connection, *, run_id: uuid.UUID, attempt_id: int) -> bool:
        """Lock the run while ``attempt_id`` is current and still running its play."""
        return await self._value(conn, "lock_running_attempt", run_id, attempt_id) is not None

    async def retrying(
        self, conn: Connection, *, run_id: uuid.UUID, attempt_id: int, error: Any
    ) -> None:
        await self._value(conn, "retrying_run", run_id, attempt_id, error)

    async def count_deferral(
        self, conn: Connection, *, run_id: uuid.UUID, alert_after_s: float
    ) -> DeferralCount:
        """Count one more deferral in the run's streak."""
        counted = await self._row(conn, DeferralCount, "count_deferral", run_id, alert_after_s)
        assert counted is not None  # the run was claimed: its row exists
        return counted

    async def hand_back_claim(
        self,
        conn: Connection,
        *,
        task_id: uuid.UUID,
        engine_run_id: uuid.UUID,
        worker_id: str,
        outcome: str,
    ) -> set[int]:
        """End this worker's open attempts on the engine run; return the attempt ids it ended."""
        rows = await self._records(
            conn, "hand_back_claim", task_id, engine_run_id, worker_id, outcome
        )
        return {r["attempt_id"] for r in rows}

    async def consume_signal(
        self, conn: Connection, *, run_id: uuid.UUID, event_key: str, attempt_id: int
    ) -> tuple[bool, Any]:
        """Mark the run's signal for ``event_key`` consumed; return (found, payload)."""
        rows = await self._records(conn, "consume_signal", run_id, event_key, attempt_id)
        return (True, rows[0]["payload"]) if rows else (False, None)

    async def begin_runner(self, conn: Connection, *, run_id: uuid.UUID, name: str) -> int:
        """Number a new runner attempt of the run (an older launch of ``name`` is superseded)."""
        number: int = await self._value(conn, "begin_runner_attempt", run_id, name)
        return number

    async def take_runner_result(
        self, conn: Connection, *, run_id: uuid.UUID, runner_attempt: int
    ) -> tuple[bool, Any]:
        """Resolve the run's wait from the runner's report: (reported, result)."""
        rows = await self._records(conn, "take_runner_result", run_id, runner_attempt)
        return (True, rows[0]["result"]) if rows else (False, None)

    async def time_out_runner(
        self, conn: Connection, *, run_id: uuid.UUID, runner_attempt: int
    ) -> tuple[bool, Any]:
        """Resolve the wait at its deadline: (reported after all, result)."""
        row = await conn.fetchrow(self._q["time_out_runner"], run_id, runner_attempt)
        if row is None or row["state"] != "resolved":
            return False, None
        return True, row["result"]

    async def on_live_worker(self, conn: Connection, *, run_id: uuid.UUID) -> bool:
        """Tell whether an executing attempt of the run has not ended and its worker is live."""
        return bool(await self._value(conn, "attempt_on_live_worker", run_id))

    async def close_abandoned(self, conn: Connection, *, limit: int) -> list[int]:
        """Close, as lost leases, attempts whose run moved on and whose worker is gone."""
        return [
            r["attempt_id"] for r in await self._records(conn, "close_abandoned_attempts", limit)
        ]
