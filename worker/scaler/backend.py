"""What a scaler backend is: something that lists, creates, stops and destroys machines.

A machine runs ``lane-worker run`` for one release. The scaler touches only
machines whose metadata names a release (``lane_worker_release``), the mark it
puts on every machine it creates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

RELEASE_METADATA = "lane_worker_release"

# Machine states, as the scaler reads them.
STARTING, STARTED, STOPPED, FAILED = "starting", "started", "stopped", "failed"
RUNNING_STATES = frozenset({STARTING, STARTED})


@dataclass(frozen=True)
class Machine:
    """One machine of a release, as the backend lists it."""

    machine_id: str
    release_id: str
    image: str
    state: str  # starting, started, stopped, failed
    age_s: float  # since it was created
    exit_code: int | None = None  # how its worker exited, when the backend knows

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES


class BackendError(Exception):
    """The backend refused or failed an action; the message says which and why."""


class Backend(Protocol):
    """The machines of one deployment target."""

    name: str

    async def list(self) -> list[Machine]:
        """Every machine carrying the scaler's release metadata (others are never listed)."""
        ...

    async def create(self, release_id: str, image: str) -> Machine:
        """Create and start a machine of ``release_id`` running ``image``."""
        ...

    async def stop(self, machine: Machine) -> None:
        """Stop a machine (its worker drains on the stop signal)."""
        ...

    async def destroy(self, machine: Machine) -> None:
        """Remove a stopped machine."""
        ...
