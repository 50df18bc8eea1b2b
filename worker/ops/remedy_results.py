"""What the operator remedies return: a retry, a listed run, what a move did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class RetriedRun:
    """The retry of a run: new (``created``), or the one an earlier ``runs retry`` made."""

    run_id: str
    release_id: str
    queue: str
    retry_of: str
    created: bool = True
    status: str = "queued"  # the retry's status when this was read
    # Events of the old run left out of the retry: their payloads could not be read.
    dropped_signals: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSummary:
    """One run as ``lane-worker runs`` lists it."""

    run_id: str
    play: str
    status: str
    release_id: str
    queue: str
    adopted_release_id: str | None
    attempts: int
    created_at: datetime
    retry_of: str | None

    def as_json(self) -> dict[str, Any]:
        """Return the run as ``runs --json`` prints it."""
        return {
            "runId": self.run_id,
            "play": self.play,
            "status": self.status,
            "releaseId": self.release_id,
            "queue": self.queue,
            "adoptedReleaseId": self.adopted_release_id,
            "attempts": self.attempts,
            "createdAt": self.created_at.isoformat(),
            "retryOf": self.retry_of,
        }


@dataclass(frozen=True)
class MoveReport:
    """What ``lanes move`` did: runs moved, runs refused with the reason."""

    from_queue: str
    to_queue: str
    to_release_id: str
    moved: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
