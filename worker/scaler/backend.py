"""What a scaler backend is: something that lists, creates, stops and destroys machines.

A machine runs ``lane-worker run`` for one release. The scaler touches only
machines whose metadata names a release (``lane_worker_release``), the mark it
puts on every machine it creates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from worker.config.dburl import url_secrets
from worker.config.env import DATABASE_URL_ENV, MACHINE_URL_ENV, Problems
from worker.config.stopping import longest_stop_s
from worker.config.tuning import read_tuning
from worker.masking import joined, secret_forms


def scaler_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    """What a scaler of environment ``env`` masks wherever it says or keeps something: the
    database's passwords, and the API token (the Fly backend sends it) in every spelling
    an echo of it may take. Its machines inherit that environment, so whatever is shown
    of their output is masked with these too."""
    url = (env.get(DATABASE_URL_ENV) or "").strip()
    # The machines' own URL (the process backend's LANE_WORKER_MACHINE_POSTGRES) too.
    machines = (env.get(MACHINE_URL_ENV) or "").strip()
    return joined(
        url_secrets(url),
        url_secrets(machines),
        secret_forms((env.get("FLY_API_TOKEN") or "").strip()),
    )


RELEASE_METADATA = "lane_worker_release"
# The image as the scaler asked for it (a backend may list it normalised: a
# registry host or a digest added), to tell a machine on an outdated image.
IMAGE_METADATA = "lane_worker_image"

# Which store a machine serves (an id the store keeps, migration 0013): two
# scalers of different databases sharing one Fly app or state folder never list,
# stop or destroy each other's machines.
STORE_METADATA = "lane_worker_store"

# The key of the create that made a machine: a create tried again after a lost
# answer finds its machine by it instead of making a second one.
CREATE_METADATA = "lane_worker_create"

# Machine states, as the scaler reads them. STOPPING: the stop was sent and the
# worker is draining; it is never sent again (a second stop signal makes a
# worker exit at once) and the machine is not destroyed while it drains.
STARTING, STARTED, STOPPING = "starting", "started", "stopping"
STOPPED, FAILED = "stopped", "failed"
RUNNING_STATES = frozenset({STARTING, STARTED})

# The longest a backend that says "rate limited, retry after N s" is left alone: as
# long as the longest backoff after a refusal (a header asking for a day must not
# leave releases without machines for a day; one listing a minute does not hurt).
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True)
class Machine:
    """One machine of a release, as the backend lists it."""

    machine_id: str
    release_id: str
    image: str
    state: str  # starting, started, stopping, stopped, failed
    age_s: float  # since it was created
    exit_code: int | None = None  # how its worker exited, when the backend knows
    stopping_s: float | None = None  # since its stop was sent, when the backend knows
    health_port: int | None = None  # its worker's health port on this host, when the backend knows
    last_line: str | None = None  # a dead machine's last line of output, when the backend has it

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES


# Which of two listings of one machine is believed: the more alive (a stale "stopped"
# must not get a running machine destroyed; one pass later the listing agrees).
_ALIVE_FIRST = {STARTED: 0, STARTING: 1, STOPPING: 2, STOPPED: 3, FAILED: 4}


def one_per_id(machines: list[Machine]) -> list[Machine]:
    """One entry per machine id (a listing may name a machine twice): the more alive one."""
    best: dict[str, Machine] = {}
    for m in machines:
        had = best.get(m.machine_id)
        if had is None or _ALIVE_FIRST.get(m.state, 5) < _ALIVE_FIRST.get(had.state, 5):
            best[m.machine_id] = m
    return list(best.values())


def machine_stop_s(env: Mapping[str, str]) -> float:
    """The longest a machine's worker takes to stop on SIGTERM, with the drain window that
    ``env`` sets (``LANE_WORKER_DRAIN_SECONDS``; what the machines get must match)."""
    return longest_stop_s(read_tuning(env, Problems()).drain_s)


class BackendError(Exception):
    """The backend refused or failed an action; the message says which and why."""


class Backend(Protocol):
    """The machines of one deployment target."""

    name: str
    # The store this scaler serves (set once it has read it, before any call):
    # machines are created with it and only machines carrying it are listed.
    store_id: str
    # How long a stopped machine may take to stop before it is destroyed: above
    # its worker's longest stop, so a draining worker is never cut off.
    stop_deadline_s: float

    async def list(self) -> list[Machine]:
        """Every machine of ``store_id`` carrying the scaler's release metadata (others
        are never listed)."""
        ...

    async def create(self, release_id: str, image: str) -> Machine:
        """Create and start a machine of ``release_id`` running ``image``."""
        ...

    async def stop(self, machine: Machine) -> None:
        """Stop a machine (its worker drains on the stop signal); sent once per machine."""
        ...

    async def destroy(self, machine: Machine) -> None:
        """Remove a stopped machine."""
        ...

    def where_logs(self, machine_id: str) -> str:
        """Where an operator reads what a machine's worker printed."""
        ...
