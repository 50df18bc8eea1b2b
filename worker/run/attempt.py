"""Ending an attempt: completion, failure (retrying or for good), an observed cancel.

``Settlement`` is mixed into ``Runtime``. Each end commits the engine
transition with the store's, fenced by the attempt row, so a stale attempt
never settles (or cancels) a run a newer claim owns.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from worker import checkpoint
from worker.config.dburl import mask_secrets
from worker.db import engine
from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store
from worker.errors import LeaseLostError, printable
from worker.run.context import RunHandle
from worker.run.reconcile import cancelled_fact

# A stored error message is for people; a multi-megabyte one only bloats rows.
MAX_ERROR_MESSAGE_CHARS = 8000


def error_reason(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop the failure being recorded
        message = f"<{type(exc).__name__} whose message could not be read>"
    # jsonb refuses NUL characters, and UTF-8 lone surrogates (a file name decoded
    # with surrogateescape, say): escape both, so the failure can be stored.
    message = message.replace("\x00", "\\u0000")[:MAX_ERROR_MESSAGE_CHARS]
    message = printable(message)
    return {"name": type(exc).__name__, "message": message}


class Settlement:
    """The attempt-ending paths of ``Runtime`` (which provides the attributes below)."""

    db: Database
    store: Store
    secrets: tuple[str, ...]

    async def _finish(self, h: RunHandle, outcome: str, error: Any) -> None:
        await self.db.run(
            lambda c: self.store.execute(c, "finish_attempt", h.attempt_id, outcome, error)
        )

    async def _complete(self, h: RunHandle, output: Any) -> None:
        fact = checkpoint.terminal_ledger_event(
            {"status": "completed", "runId": str(h.run_id), "output": output, "error": None}
        )
        assert fact is not None

        async def complete(conn: Connection) -> None:
            await engine.complete(conn, h.queue, h.engine_run_id, output)
            if not await self.store.settle(
                conn, h.run_id, status="completed", fact=fact, attempt_id=h.attempt_id,
                output=output,
            ):  # fmt: skip
                raise LeaseLostError("run settled by a newer claim", engine_run_id=h.engine_run_id)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "completed", None)

        await self.db.transaction(complete)

    def _reason(self, exc: BaseException) -> dict[str, Any]:
        reason = error_reason(exc)
        reason["message"] = mask_secrets(reason["message"], self.secrets)
        return reason

    async def _fail_attempt(
        self,
        h: RunHandle,
        max_attempts: int | None,
        exc: BaseException,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> str:
        reason = self._reason(exc)
        final = max_attempts is not None and h.attempt >= max_attempts
        outcome = "failed" if final else "retrying"
        fact = checkpoint.terminal_ledger_event(
            {"status": "failed", "runId": str(h.run_id), "output": None, "error": reason}
        )
        assert fact is not None

        async def fail(conn: Connection) -> None:
            await engine.fail(conn, h.queue, h.engine_run_id, reason)
            if (
                await self.store.fetchval(conn, "lock_running_attempt", h.run_id, h.attempt_id)
                is None
            ):
                raise LeaseLostError(
                    "the run parked or was taken by a newer claim", engine_run_id=h.engine_run_id
                )
            if final:
                await self.store.settle(
                    conn, h.run_id, status="failed", fact=fact, attempt_id=h.attempt_id,
                    error=reason,
                )  # fmt: skip
            else:
                await self.store.fetchval(conn, "retrying_run", h.run_id, h.attempt_id, reason)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, outcome, reason)

        try:
            try:
                await self.db.transaction(fail)
            except (asyncpg.PostgresError, ValueError) as unstorable:
                if is_transient(unstorable):
                    raise
                # The error itself cannot be stored: record that instead, so the
                # attempt still fails rather than coming back for ever.
                reason = {
                    "name": type(exc).__name__,
                    "message": f"(the error's details could not be stored: {unstorable!r})"[
                        :MAX_ERROR_MESSAGE_CHARS
                    ],
                }
                fact["error"] = reason
                await self.db.transaction(fail)
        except LeaseLostError as lost:
            bound.warning("run.lease_lost", detail=str(lost))
            await self._finish(h, "lease_lost", error_reason(lost))
            return "lease_lost"
        event = "run.failed" if final else "run.attempt_failed"
        bound.warning(event, attempt=h.attempt, max_attempts=max_attempts, error=reason)
        return outcome

    async def _fail_for_good(
        self, h: RunHandle, exc: Exception, bound: structlog.typing.FilteringBoundLogger
    ) -> str:
        reason = {**self._reason(exc), "fatal": True}
        fact = checkpoint.terminal_ledger_event(
            {"status": "failed", "runId": str(h.run_id), "output": None, "error": reason}
        )
        assert fact is not None

        async def fail(conn: Connection) -> None:
            # The fenced store write first: a stale attempt must not cancel the
            # task that a newer claim now owns.
            if not await self.store.settle(
                conn, h.run_id, status="failed", fact=fact, attempt_id=h.attempt_id, error=reason
            ):
                raise LeaseLostError(
                    "run settled or taken by a newer claim", engine_run_id=h.engine_run_id
                )
            await engine.cancel(conn, h.queue, h.task_id)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "failed", reason)

        try:
            await self.db.transaction(fail)
        except LeaseLostError as lost:
            bound.warning("run.lease_lost", detail=str(lost))
            await self._finish(h, "lease_lost", error_reason(lost))
            return "lease_lost"
        bound.error("run.failed_for_good", error=reason)
        return "failed"

    async def _observe_cancel(
        self, h: RunHandle, bound: structlog.typing.FilteringBoundLogger
    ) -> str:
        async def settle(conn: Connection) -> None:
            # Fenced: only while this attempt is the run's (a cancel command, `runs
            # fail` or a move settled or restamped it already, and wrote its fact).
            await self.store.settle(
                conn, h.run_id, status="cancelled", fact=cancelled_fact(h.run_id, "worker"),
                attempt_id=h.attempt_id,
            )  # fmt: skip
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "cancelled", None)

        await self.db.transaction(settle)
        bound.info("run.cancelled")
        return "cancelled"
