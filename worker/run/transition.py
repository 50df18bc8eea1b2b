"""How an attempt ends: one small value per way, given to ``Attempt.end``.

Each value says what happened (the play returned, failed, waits durably; the
run is not this worker's to run; a newer claim took it) and carries what that
end writes; ``Attempt.end`` (``worker/run/attempt.py``) routes each kind to its
fenced transaction. A completion goes through group commit, so with other runs
in flight it shares one set-based statement with their writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

from worker.db import engine
from worker.states import Outcome


@dataclass(frozen=True, slots=True)
class Complete:
    """The play returned ``output`` (checked by ``require_json``): complete the run."""

    output: Any


@dataclass(frozen=True, slots=True)
class Retry:
    """The play failed and attempts are left: fail the engine run, which retries it."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Fail:
    """The play failed on its last attempt: the engine run fails, the run settles failed."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class FailForGood:
    """No attempt could succeed (a fatal error, a wait this build cannot resume): no retry.

    The run settles failed first (fenced), then its engine task is cancelled.
    """

    error: Exception


@dataclass(frozen=True, slots=True)
class Park:
    """The play waits durably: park the run in ``wait`` if the engine suspends it.

    A sleep schedules the engine run at ``wake_at``; an event or a runner's
    report awaits engine event ``event_name`` for ``timeout_s`` (whole seconds,
    None: for ever). The store keeps ``wait`` and the armed ``envelope``.
    """

    kind: Literal["sleep", "event", "runner"]
    boundary_id: str
    wait: dict[str, Any]
    envelope: dict[str, Any]
    wake_at: datetime | None = None
    event_name: str = ""
    timeout_s: int | None = None


class Parked(NamedTuple):
    """What a park came to: suspended (the attempt ended), or the event already there."""

    suspended: bool
    delivered: bool = False  # not suspended: the engine delivered the event
    payload: Any = None  # its payload (None may be JSON null)


@dataclass(frozen=True, slots=True)
class PutBack:
    """Not run here (defer, refuse): reschedule ``delay_s`` from now, no attempt spent."""

    outcome: Literal[Outcome.DEFERRED, Outcome.REFUSED]
    delay_s: float
    note: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class HandBack:
    """The begin did not take the run over: end as the run's row reads, give the claim back."""


@dataclass(frozen=True, slots=True)
class CancelObserved:
    """The engine cancelled the run while it ran: settle it cancelled (if still ours)."""


@dataclass(frozen=True, slots=True)
class Lost:
    """A newer claim, a move or an operator took the run: end as a lost lease."""

    reason: dict[str, Any] | BaseException


# Every end but a park, which may not end the attempt (the event was there already).
Ends = Complete | Retry | Fail | FailForGood | PutBack | HandBack | CancelObserved | Lost
Transition = Ends | Park


def failure(error: BaseException, claimed: engine.ClaimedRun) -> Retry | Fail:
    """Return how a play's ``error`` ends the attempt: a retry, or the last attempt failed."""
    last = claimed.max_attempts is not None and claimed.attempt >= claimed.max_attempts
    return Fail(error) if last else Retry(error)
