"""The vocabulary every part agrees on: run statuses, attempt outcomes, lane states.

Pure. Each member is a ``str`` whose value is what the store's check
constraints, ``--json`` output and log lines carry, so a member compares equal
to the text read back from the database and encodes to it unchanged.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A run's status in the store (``runs.status``)."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class Disposition(StrEnum):
    """What a worker decided for one claimed run (``attempts.disposition``)."""

    OWN = "own"
    ADOPT = "adopt"
    DEFER = "defer"
    REFUSE = "refuse"


class Outcome(StrEnum):
    """How one attempt ended (``attempts.outcome``)."""

    COMPLETED = "completed"
    FAILED = "failed"  # for good: no attempt follows
    RETRYING = "retrying"  # failed; the engine schedules the next attempt
    PARKED = "parked"  # a sleep or an event wait committed
    DEFERRED = "deferred"  # put back without spending an attempt
    HANDED_BACK = "handed_back"  # given back (a drain, an error) without spending one
    REFUSED = "refused"  # this worker's lane may not run it
    LEASE_LOST = "lease_lost"  # a newer claim, a move or an operator took the run
    CANCELLED = "cancelled"


class LaneStatus(StrEnum):
    """A lane's status in the registry (``lanes.status``)."""

    CLAIMING = "claiming"
    RETIRED = "retired"


class LaneState(StrEnum):
    """What the drain report says of a lane: claiming, or retired and draining or drained."""

    CLAIMING = "claiming"
    DRAINING = "draining"  # retired, still holding work only its own release may run
    DRAINED = "drained"  # retired, nothing left for it: its machines are safe to stop
