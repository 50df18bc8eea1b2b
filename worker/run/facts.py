"""The terminal ledger fact of a settled run: built here, and only here.

A run that ends gets exactly one terminal fact (``run.completed``,
``run.failed`` or ``run.cancelled``), written by whoever settles it: a worker,
the reconciler, an operator's remedy or the client's cancel. Shapes are the
TypeScript app's (``absurdTerminalLedgerEvent``); ``source`` says who wrote it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from worker import checkpoint
from worker.errors import printable
from worker.states import RunStatus

Source = Literal["worker", "reconciler", "client", "operator"]


@dataclass(frozen=True)
class TerminalFact:
    """The one fact a run gets when it reaches a terminal status."""

    status: RunStatus
    run_id: uuid.UUID
    output: Any = None
    error: Any = None
    source: Source = "worker"

    @property
    def type(self) -> str:
        return f"run.{self.status}"

    def as_json(self) -> dict[str, Any]:
        """Return the ledger row's payload, as the app reads it."""
        if self.status == RunStatus.CANCELLED:
            return {
                "type": self.type,
                "runId": str(self.run_id),
                "occurredAt": int(time.time() * 1000),
                "source": self.source,
            }
        fact = checkpoint.terminal_ledger_event(
            {
                "status": str(self.status),
                "runId": str(self.run_id),
                "output": self.output,
                "error": self.error,
            }
        )
        if fact is None:
            raise ValueError(f"{self.status!r} is not a terminal status")
        if self.source != "worker":
            fact["source"] = self.source
        return fact


def completed(run_id: uuid.UUID, output: Any) -> TerminalFact:
    return TerminalFact(RunStatus.COMPLETED, run_id, output=output)


def failed(run_id: uuid.UUID, error: Any, *, source: Source = "worker") -> TerminalFact:
    """The ``run.failed`` fact: the error as the app's fact has it, without the traceback
    (the store, ``status`` and the logs keep that; the app's shape is name and message)."""
    if isinstance(error, dict) and "traceback" in error:
        error = {k: v for k, v in error.items() if k != "traceback"}
    return TerminalFact(RunStatus.FAILED, run_id, error=error, source=source)


def cancelled(run_id: uuid.UUID, source: Source) -> TerminalFact:
    return TerminalFact(RunStatus.CANCELLED, run_id, source=source)


# A stored error message is for people; a multi-megabyte one only bloats rows.
MAX_ERROR_MESSAGE_CHARS = 8000


def error_reason(exc: BaseException) -> dict[str, Any]:
    """Return how an error is stored: its class name and a printable message."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop the failure being recorded
        message = f"<{type(exc).__name__} whose message could not be read>"
    # jsonb refuses NUL characters, and UTF-8 lone surrogates (a file name decoded
    # with surrogateescape, say): escape both, so the failure can be stored.
    message = message.replace("\x00", "\\u0000")[:MAX_ERROR_MESSAGE_CHARS]
    return {"name": type(exc).__name__, "message": printable(message)}
