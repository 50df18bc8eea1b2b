"""Every error lane-worker raises on purpose, under one base class; and the exit codes.

``exit_code_for`` is the one map from an error to the exit code of a process it
ends: the CLI's commands and the daemon's boot both ask it.
"""

from __future__ import annotations

# Exit codes, for the daemon and every command (README "Exit codes").
EXIT_OK = 0
EXIT_FAILURE = 1  # the work failed, or the database stayed away
EXIT_USAGE = 2  # the request itself is unusable
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: what orchestrators read as "fix the config"

SHOWN_CHARS = 100


def printable(text: str) -> str:
    """Escape what has no UTF-8 form (an undecodable byte from the environment or a file)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def counted(n: int, noun: str) -> str:
    """Return ``n`` and ``noun``, the noun plural unless ``n`` is 1 ("1 machine", "2 machines")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def shown(value: str) -> str:
    """Quote a value someone typed for a message: at most 100 characters of it, as shown.

    Cut after quoting, so escapes (a backslash shows as two) count towards the 100.
    """
    text = repr(value)
    if len(text) <= SHOWN_CHARS + 2:
        return text
    return f"{text[: SHOWN_CHARS + 1]}...{text[0]}"


class LaneWorkerError(Exception):
    """Base of every error lane-worker raises deliberately."""


class LaneConfigError(LaneWorkerError, ValueError):
    """The lane configuration (environment, release id, queue) is unusable."""

    def __init__(self, message: str, *, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class LaneMismatchError(LaneWorkerError, ValueError):
    """A run was claimed by a worker that does not serve the run's release lane."""

    def __init__(
        self, message: str, *, run_id: str, run_release_id: str, worker_release_id: str
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.run_release_id = run_release_id
        self.worker_release_id = worker_release_id


class UnknownBoundaryError(LaneWorkerError, ValueError):  # fatal for a run: see runtime
    """A checkpoint records a boundary kind this build cannot replay."""

    def __init__(self, message: str, *, boundary_id: str, kind: object) -> None:
        super().__init__(message)
        self.boundary_id = boundary_id
        self.kind = kind


class EngineSchemaError(LaneWorkerError):
    """The database's engine schema cannot be used by this build (too new, no upgrade path)."""

    def __init__(self, message: str, *, found: str, expected: str) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected


class LeaseLostError(LaneWorkerError):
    """An engine run is no longer held by this worker; its writes must stop."""

    def __init__(self, message: str, *, engine_run_id: object) -> None:
        super().__init__(message)
        self.engine_run_id = engine_run_id


class RunCancelledError(LeaseLostError):
    """The run's engine task was cancelled while this worker held it."""


class RunNotRunningError(LeaseLostError):
    """The engine run is not running under this worker any more (lease expired, failed)."""


class StoreSchemaError(LaneWorkerError):
    """The run-state store holds a migration this build cannot run against."""

    def __init__(self, message: str, *, found: int, known: int) -> None:
        super().__init__(message)
        self.found = found
        self.known = known


class StoreSchemaConflictError(StoreSchemaError):
    """The store schema holds objects another system made, named like the store's own."""

    def __init__(self, message: str, *, schema: str, objects: tuple[str, ...]) -> None:
        super().__init__(message, found=0, known=0)
        self.schema = schema
        self.objects = objects


class FatalRunError(LaneWorkerError):
    """The run cannot make progress on this build: it fails for good, with no retry."""


class PlayValueError(FatalRunError, ValueError):
    """A play handed the play API a value that can never be right (a sleep of NaN seconds).

    Fails the run for good at once: a retry replays the same checkpoints and computes
    the same value. Still a ``ValueError``, which a play may catch as before.
    """


class UnknownPlayError(FatalRunError):
    """The run names a play this app does not register."""


class RunNotFoundError(LaneWorkerError):
    """No run with this id exists in the store."""


class HealthPortError(LaneWorkerError):
    """The health, readiness and metrics port cannot be bound."""


class NotJsonError(LaneWorkerError, TypeError):
    """A step result, play output or payload cannot be stored as JSON."""


class InvalidRequestError(LaneWorkerError, ValueError):
    """A client call's arguments are unusable: an input that is no JSON object, a key too long."""


class IdempotencyConflict(LaneWorkerError):
    """An idempotency key already names a run of another play, input or lane."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class SchemasMissingError(LaneWorkerError):
    """The database lacks lane-worker's schemas or holds older ones: ``lane-worker migrate``."""


class UnknownLaneError(LaneWorkerError):
    """No lane has ever had this release id (``--force`` / ``force=True`` creates it)."""

    def __init__(self, message: str, *, known: tuple[str, ...]) -> None:
        super().__init__(message)
        self.known = known


# -- the daemon's boot -------------------------------------------------------------


class AppLoadError(LaneWorkerError):
    """``--app`` names no importable lane-worker ``App``."""


class DatabaseUnreachableError(LaneWorkerError):
    """The database did not answer within the boot's retry window."""


class LaneDrainedError(LaneWorkerError):
    """This release's lane is retired and drained: its worker must not start."""


# -- operator remedies -------------------------------------------------------------


class RunStillOpenError(LaneWorkerError):
    """A retry of a run that has not ended: fail or cancel it first."""


class NoClaimingLaneError(LaneWorkerError):
    """No release lane claims new runs, so nothing could run a retry."""


class ReleasesHeldError(LaneWorkerError):
    """A deploy or rollback refused while the registry is held (`releases hold`)."""


class RetryRefusedError(LaneWorkerError):
    """A retry the run's state does not allow without saying so (a completed run)."""


# -- the daemon's health port ------------------------------------------------------


class NotBootedError(Exception):
    """A lanes report asked for before the worker has booted (/lanes answers 503)."""


class SharedReadCancelledError(Exception):
    """The shared read a caller was waiting for was cancelled (its owner is closing)."""


class ReportClosedError(Exception):
    """The report was asked for after the daemon closed its report pool (it is stopping)."""


# -- what a process exits with -----------------------------------------------------

# 78: the environment or the schemas must change; 2: the request itself is wrong.
_EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (LaneConfigError, EXIT_CONFIG),
    (EngineSchemaError, EXIT_CONFIG),
    (StoreSchemaError, EXIT_CONFIG),
    (LaneDrainedError, EXIT_CONFIG),
    (InvalidRequestError, EXIT_USAGE),
    (AppLoadError, EXIT_USAGE),
)


def exit_code_for(exc: BaseException) -> int:
    """Return the exit code of a process that ``exc`` ends: 78, 2, or else 1 (a failure)."""
    return next((code for kind, code in _EXIT_CODES if isinstance(exc, kind)), EXIT_FAILURE)


def sole_error(exc: Exception) -> Exception:
    """Return the one error a task group wrapped (``exc`` itself when it wraps none or several)."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
