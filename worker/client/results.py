"""What the client returns: a submitted run, a run's report, a signal's delivery."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from worker.states import TERMINAL_STATUSES

# What the store's warning (0046) says happens to a run of a play no live worker of its
# lane registers (run/decide.py: put back; PLAY_UNKNOWN past the grace if none ever did).
PLAY_WARNING_CLAUSE = (
    "a worker of the lane puts the run back (no attempt spent) until one that registers the "
    "play starts; if no worker of the lane ever registered it, the run fails for good as an "
    "unknown play after LANE_WORKER_UNKNOWN_PLAY_GRACE"
)


@dataclass(frozen=True)
class SubmittedRun:
    """A submitted run: its id, the release it was stamped with, its queue.

    ``served`` is False when nothing serves its lane (no worker registered it or
    is live there, and it is not the registry's current release): the run waits
    until a worker of that release starts; ``warning`` then says which would.
    ``play_served`` is False when the lane is served but none of its live workers
    registers the play (store migration 0038): a worker of the lane puts the run back
    until a worker whose app registers it starts; if none of the lane's workers ever
    registered it, the run fails for good as an unknown play after
    LANE_WORKER_UNKNOWN_PLAY_GRACE (0046); ``warning`` then names the plays they do
    register. Either way the run is accepted.
    """

    run_id: str
    release_id: str
    queue: str
    created: bool = True
    served: bool = True
    warning: str | None = None
    play_served: bool = True

    @classmethod
    def from_json(cls, said: dict[str, Any]) -> SubmittedRun:
        """Read one result of the store's ``submit_run`` / ``submit_runs``."""
        # Absent from a store before migration 0038, and when nothing is said of the play.
        play_served = bool(said.get("playServed", True))
        return cls(
            said["runId"],
            said["releaseId"],
            said["queue"],
            said["created"],
            said["served"],
            # Only when not served, or the play not served.
            said.get("warning"),
            play_served,
        )

    def as_json(self) -> dict[str, Any]:
        """Return ``submit --json``'s fields: the store's result (``warning`` when not served,
        ``playServed`` and ``warning`` when no live worker of the lane registers the play)."""
        said: dict[str, Any] = {
            "runId": self.run_id,
            "releaseId": self.release_id,
            "queue": self.queue,
            "created": self.created,
            "served": self.served,
        }
        if not self.play_served:
            said["playServed"] = False
        if self.warning is not None:
            said["warning"] = self.warning
        return said


@dataclass(frozen=True)
class WorkerRelease:
    """The release id a worker serves (as deployed: what a submit passes) and its queue."""

    release_id: str
    queue: str


@dataclass(frozen=True)
class AttemptView:
    """One claim of a run: ``claim`` numbers them 1, 2, ... once each; ``attempt`` is the
    engine's attempt number, which a defer, a hand-back or a resumed park repeats."""

    attempt: int
    worker_id: str
    release_id: str
    disposition: str
    outcome: str | None
    claim: int = 0  # 0: read from a run_status object, which has no claim numbers
    claimed_at: datetime | None = None
    finished_at: datetime | None = None
    machine_id: str | None = None  # the worker's machine (FLY_MACHINE_ID, the process backend's)
    # As stored: a failure's name, message and traceback, or a put-back's {"reason": ...}.
    error: Any = None


@dataclass(frozen=True)
class StepView:
    """One committed step (an engine checkpoint) and the attempt, so the release, that wrote it."""

    name: str
    release_id: str | None
    attempt: int | None
    worker_id: str | None
    committed_at: datetime


@dataclass(frozen=True)
class RunReport:
    """What ``status`` reports about a run (``status``: a ``worker.states.RunStatus`` value)."""

    run_id: str
    play: str
    status: str
    release_id: str
    adopted_release_id: str | None
    queue: str
    # Every claim of the run (the name is older than `claims`, which reads the same):
    # an attempt that began or resumed after a park, or a put-back. Not a count.
    attempts: tuple[AttemptView, ...]
    output: Any
    error: Any
    facts: tuple[str, ...] = field(default=())
    retry_of: str | None = None
    steps: tuple[StepView, ...] = ()
    # The ledger facts as run_status gives them (type, when written, delivery).
    ledger: tuple[dict[str, Any], ...] = ()
    # The engine attempts spent, as max attempts counts them: what `runs` and the run
    # page say (store migration 0036's attemptCount). A park and its resume are none.
    attempt_count: int = 0
    max_attempts: int | None = None
    # A parked run's wait: kind (sleep, integration_event, runner), eventKey, wakeAtMs,
    # deadlineMs (as text). None when the run is not waiting, or read as the app role.
    waits_for: dict[str, str] | None = None

    @property
    def claims(self) -> tuple[AttemptView, ...]:
        """Every claim of the run (``attempts``, under the name ``status`` shows)."""
        return self.attempts

    @classmethod
    def from_json(cls, said: dict[str, Any]) -> RunReport:
        """Read what the store's ``run_status`` returns (the ``status --json`` shape)."""
        return cls(
            run_id=said["runId"],
            play=said["play"],
            status=said["status"],
            release_id=said["releaseId"],
            adopted_release_id=said["adoptedReleaseId"],
            queue=said["queue"],
            attempts=tuple(
                AttemptView(
                    a["attempt"],
                    a["workerId"],
                    a["releaseId"],
                    a["disposition"],
                    a["outcome"],
                    claim=a.get("claim", 0),
                    claimed_at=_time(a.get("claimedAt")),
                    finished_at=_time(a.get("finishedAt")),
                    machine_id=a.get("machineId"),
                    error=a.get("error"),
                )
                for a in said.get("claims", said["attempts"])
            ),
            attempt_count=said.get("attemptCount", 0),
            waits_for=said.get("waitsFor"),
            max_attempts=said.get("maxAttempts"),
            output=said["output"],
            error=said["error"],
            facts=tuple(f["type"] for f in said["facts"]),
            ledger=tuple(said["facts"]),
            retry_of=said["retryOf"],
            steps=tuple(
                StepView(
                    s["name"],
                    s["releaseId"],
                    s["attempt"],
                    s["workerId"],
                    datetime.fromisoformat(s["committedAt"]),
                )
                for s in said["steps"]
            ),
        )

    @property
    def finished(self) -> bool:
        """Tell whether the run reached a terminal status."""
        return self.status in TERMINAL_STATUSES

    def as_json(self) -> dict[str, Any]:
        """Return the JSON object ``lane-worker status --json`` prints."""
        return {
            "runId": self.run_id,
            "play": self.play,
            "status": self.status,
            "releaseId": self.release_id,
            "adoptedReleaseId": self.adopted_release_id,
            "queue": self.queue,
            # One meaning everywhere (issue 31): the engine attempts spent, as `runs
            # --json` says; each time a worker took the run is a claim.
            "attempts": self.attempt_count,
            "maxAttempts": self.max_attempts,
            "claims": [
                {
                    "attempt": a.attempt,
                    "claim": a.claim,
                    "workerId": a.worker_id,
                    "machineId": a.machine_id,
                    "releaseId": a.release_id,
                    "disposition": a.disposition,
                    "outcome": a.outcome,
                    "claimedAt": a.claimed_at and a.claimed_at.isoformat(),
                    "finishedAt": a.finished_at and a.finished_at.isoformat(),
                    "error": a.error,
                }
                for a in self.attempts
            ],
            "waitsFor": self.waits_for,
            "output": self.output,
            "error": self.error,
            "retryOf": self.retry_of,
            # Provenance: the release whose code committed each step.
            "steps": [
                {
                    "name": s.name,
                    "releaseId": s.release_id,
                    "attempt": s.attempt,
                    "workerId": s.worker_id,
                    "committedAt": s.committed_at.isoformat(),
                }
                for s in self.steps
            ],
            "facts": list(self.ledger),
        }


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True)
class SignalResult:
    """Whether a signal was delivered, or ignored: a duplicate (first wins) or the run ended."""

    run_id: str
    event_key: str
    duplicate: bool
    run_ended: str | None = None  # the run's terminal status when it had already ended
    # The run that holds the event now: run_id itself, or the retry that replaced
    # it (`runs retry`); None when it was ignored (a completed run).
    delivered_to: str | None = None
    # Recorded on an ended run (failed or cancelled) for a retry of it to receive.
    kept_for_retry: bool = False

    @property
    def delivered(self) -> bool:
        """Return whether this call delivered the event to an open run."""
        return not self.duplicate and self.run_ended is None


@dataclass(frozen=True)
class RunnerReport:
    """What recording a detached runner's result did (the store's ``report_runner_result``)."""

    run_id: str
    runner_attempt: int
    recorded: bool  # stored now (False: this attempt had reported already)
    duplicate: bool
    woke: bool  # its run was waiting for this attempt, and resumes
    reason: str | None  # why it did not wake the run

    def as_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "runnerAttempt": self.runner_attempt,
            "recorded": self.recorded,
            "duplicate": self.duplicate,
            "woke": self.woke,
            "reason": self.reason,
        }


if TYPE_CHECKING:
    # Deprecated: ``RunReport``'s old name, kept so code written against it still imports
    # and type-checks, from here or from ``worker.client`` (``worker.states.RunStatus``
    # is the status enum).
    RunStatus = RunReport


def deprecated_name(module: str, name: str) -> Any:
    """Answer ``RunStatus`` (deprecated) with ``RunReport`` and a ``DeprecationWarning``."""
    if name == "RunStatus":
        warnings.warn(
            f"{module}.RunStatus is deprecated: use {module}.RunReport (the same class)",
            DeprecationWarning,
            stacklevel=3,
        )
        return RunReport
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    return deprecated_name(__name__, name)
