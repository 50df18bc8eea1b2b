"""What a scaler pass does: the typed actions ``plan.py`` decides and ``reconcile.py``
performs, in order, against the backend (each recorded)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Create:
    """Create and start a machine of the release on ``image``."""

    release_id: str
    image: str
    reason: str


@dataclass(frozen=True)
class Stop:
    """Send a running machine its stop (once): its worker drains."""

    release_id: str
    machine_id: str
    reason: str


@dataclass(frozen=True)
class Destroy:
    """Remove a machine (stopped first when ``stop_first``); recorded as destroyed or replaced."""

    release_id: str
    machine_id: str
    reason: str
    replaced: bool = False  # a dead machine: the plan's creates replace it
    stop_first: bool = False


@dataclass(frozen=True)
class Backoff:
    """A machine of the release's ``image`` died: none before ``until`` (``why`` says it).
    Its crash is noted (``machine_id``): the machine listed again is not a new death."""

    release_id: str
    machine_id: str
    image: str
    died: int  # in a row
    until: float
    why: str
    current: bool  # on the image the release records (an older image's death is not news)
    exit_code: int | None = None
    last_line: str | None = None  # the last line its worker printed


@dataclass(frozen=True)
class Recovered:
    """A machine of the release's image is ready: its backoff and last death are forgotten."""

    release_id: str
    image: str


@dataclass(frozen=True)
class Wait:
    """A machine is missing and the release's image is backing off."""

    release_id: str
    wait_s: float


@dataclass(frozen=True)
class Note:
    """A word on the release for ``releases`` (its scaler actions), not logged."""

    release_id: str
    text: str


@dataclass(frozen=True)
class Say:
    """Something the pass says: ``event`` is logged (an error with ``error``, else a
    warning) with ``fields``; ``error`` becomes the release's word."""

    release_id: str
    event: str | None
    error: str | None = None
    fields: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class Tally:
    """What the pass counted for the release (its word in ``scaler_state``)."""

    release_id: str
    target: int = 0
    running: int = 0
    ready: int = 0  # on the release's image
    outdated: int = 0  # running or stopping on an image the release no longer records
    stopping: int = 0
    unlisted: int = 0


@dataclass(frozen=True)
class Retire:
    """Retire what the current release supersedes (it has its count ready)."""

    release_id: str  # the current release, as the pass read it
    ready: int


@dataclass(frozen=True)
class Held:
    """The current release is ready, but the releases are held: nothing is retired."""

    release_id: str  # the current release


Action = Create | Stop | Destroy | Backoff | Recovered | Wait | Say | Note | Tally | Retire | Held
