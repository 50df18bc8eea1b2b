"""The app's SQL API (store migration 0008) as lane-worker calls it: submit, signal, cancel, status.

Each method is one call of one store function, in one transaction with
whatever else the caller does on ``conn``. The functions refuse bad input
with a SQLSTATE an app in any language can test; here those become the
errors ``LaneClient`` has always raised.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import args_of
from worker.errors import IdempotencyConflict, InvalidRequestError, RunNotFoundError

T = TypeVar("T")

INVALID_REQUEST = "22023"  # invalid_parameter_value: the message says what is wrong
IDEMPOTENCY_CONFLICT = "23505"  # unique_violation on constraint `idempotency_key`
NO_SUCH_RUN = "P0002"  # no_data_found


async def refusals(call: Awaitable[T]) -> T:
    """Await ``call``; turn the API's refusals into lane-worker's errors."""
    try:
        return await call
    except asyncpg.PostgresError as exc:
        state = getattr(exc, "sqlstate", None)
        message = str(getattr(exc, "message", "") or exc)
        if state == INVALID_REQUEST:
            raise InvalidRequestError(message) from None
        if state == IDEMPOTENCY_CONFLICT and exc.constraint_name == "idempotency_key":
            raise IdempotencyConflict(message, run_id=str(exc.detail)) from None
        if state == NO_SUCH_RUN:
            raise RunNotFoundError(message) from None
        raise


@dataclass(frozen=True, slots=True)
class _SubmitRun:
    """``submit_run``'s parameters, in its order ($1 ... $6)."""

    play: str
    input: Any
    release_id: str
    idempotency_key: str | None
    runtime_api: dict[str, Any] | None
    max_attempts: int | None


class ApiQueries(Queries):
    """``submit_run(s)``, ``signal_run``, ``cancel_run``, ``run_status``, runner results."""

    FILE = "api.sql"

    def __init__(self, schema: str) -> None:
        super().__init__(schema)
        # Whether this process's role may read the tables `status` reads beside
        # run_status (False once refused: the app's role).
        self._tables_readable = True
        self._api_callable = True

    async def schema_versions(self, conn: Connection) -> dict[str, Any]:
        """The store's applied migrations, the engine's version and contracts (0043)."""
        said = await self._value(conn, "schema_versions")
        result: dict[str, Any] = json.loads(said) if isinstance(said, str) else said
        return result

    async def submit(
        self,
        conn: Connection,
        *,
        play: str,
        input: Any,
        release_id: str,
        idempotency_key: str | None,
        runtime_api: dict[str, Any] | None,
        max_attempts: int | None,
    ) -> dict[str, Any]:
        """Submit a run; ``created`` False when the key names an earlier run (nothing written)."""
        params = _SubmitRun(
            play=play,
            input=input,
            release_id=release_id,
            idempotency_key=idempotency_key,
            runtime_api=runtime_api,
            max_attempts=max_attempts,
        )
        result: dict[str, Any] = await refusals(self._value(conn, "submit_run", *args_of(params)))
        return result

    async def submit_many(self, conn: Connection, items: list[dict[str, Any]]) -> list[Any]:
        """Submit every item (submit_run's arguments by their JSON names) in one call.

        One result per item in order, as ``submit`` returns; a refusal names its
        item's index (``item 3: ...``) and nothing is written (migration 0025).
        """
        results: list[Any] = await refusals(self._value(conn, "submit_runs", items))
        return results

    async def worker_release(
        self, conn: Connection, *, queue_suffix: str | None, deploy_version: str | None
    ) -> dict[str, Any]:
        """The release id (as deployed) and queue of a worker with this suffix / version."""
        result: dict[str, Any] = await refusals(
            self._value(conn, "worker_release_id", queue_suffix, deploy_version)
        )
        return result

    async def signal(
        self, conn: Connection, *, run_id: uuid.UUID, event_key: str, payload: Any
    ) -> dict[str, Any]:
        """Deliver an event to a run (or its retry); ``delivered``, ``duplicate``, ``runEnded``."""
        result: dict[str, Any] = await refusals(
            self._value(conn, "signal_run", run_id, event_key, payload)
        )
        return result

    async def cancel(
        self, conn: Connection, *, run_id: uuid.UUID, reason: str | None, source: str = "client"
    ) -> dict[str, Any]:
        """Cancel a run; ``cancelled`` False when it had already ended.

        ``source`` is who cancels, as the ``run.cancelled`` fact names it: ``client``
        (the app) or ``operator`` (the CLI, the page).
        """
        # The app's own cancel_run says `client` as cancel_run_by does: one answer,
        # and the only one a role granted the SQL API alone may call (issue 33).
        name, args = (
            ("cancel_run_api", (reason,))
            if source == "client"
            else ("cancel_run", (reason, source))
        )
        result: dict[str, Any] = await refusals(self._value(conn, name, run_id, *args))
        return result

    async def report_runner(
        self, conn: Connection, *, run_id: uuid.UUID, runner_attempt: int, result: Any
    ) -> dict[str, Any]:
        """Record a detached runner's result; ``woke`` says whether its run was waiting for it."""
        said: dict[str, Any] = await refusals(
            self._value(conn, "report_runner_result", run_id, runner_attempt, result)
        )
        return said

    async def status(self, conn: Connection, *, run_id: uuid.UUID) -> dict[str, Any]:
        """Return what ``status --json`` prints about a run.

        Read in parts, so a stored value this process cannot decode (its output,
        error, or a fact's delivery error) stands in alone as ``Unreadable``.
        """
        row = None
        if self._tables_readable:
            try:
                async with conn.transaction():  # a savepoint when the caller's is open
                    row = await refusals(conn.fetchrow(self._q["run_status"], run_id))
            except asyncpg.InsufficientPrivilegeError:
                # A role granted the SQL API only (the app's: issue 33) reads what
                # run_status returns and no table: from now on, that alone.
                self._tables_readable = False
        if row is None and self._api_callable:
            try:
                async with conn.transaction():
                    row = await refusals(conn.fetchrow(self._q["run_status_api"], run_id))
            except asyncpg.InsufficientPrivilegeError:
                # The viewer's and the scaler's roles (store 0049): the bookkeeping
                # alone, no output, error or delivery error, from now on.
                self._api_callable = False
        if row is None:
            row = await refusals(conn.fetchrow(self._q["run_status_bookkeeping"], run_id))
        assert row is not None  # one row per call; an unknown run raises
        result: dict[str, Any] = dict(row["rest"])
        result["output"], result["error"] = row["output"], row["error"]
        if "wait" in row and row["wait"] is not None:
            result["waitsFor"] = {k: v for k, v in row["wait"].items() if v is not None}
        facts = []
        for fact, error in zip(row["facts"], row["delivery_errors"], strict=True):
            fact = dict(fact)
            if isinstance(fact.get("delivery"), dict):
                fact["delivery"] = fact["delivery"] | {"error": error}
            facts.append(fact)
        result["facts"] = facts
        # Numbered once each (`attempt` is the engine's: a defer or a resumed
        # park repeats it), with the claim's error or put-back reason. The claims
        # are `claims` since 0036; `attempts` is the same list under its old name.
        claims = result.get("claims", result["attempts"])
        if "sleeps" not in row:  # run_status alone: the claims numbered, no more
            for n, attempt in enumerate(claims, start=1):
                attempt.update(claim=n)
            result["claims"] = result["attempts"] = claims
            return result
        for n, (attempt, claim, error) in enumerate(
            zip(claims, row["claims"], row["attempt_errors"], strict=True), start=1
        ):
            attempt.update(claim=n, **claim, error=error)
        result["claims"] = result["attempts"] = claims
        result["steps"] = sorted(
            [*result["steps"], *row["sleeps"]],
            key=lambda s: datetime.fromisoformat(s["committedAt"]),
        )
        return result
