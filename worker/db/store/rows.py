"""The rows the store returns: small frozen dataclasses, one per query shape.

A row is built from the columns its dataclass names, so a compatible store
migration that adds a column (an older build running against a newer store)
changes nothing here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

R = TypeVar("R")


_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """Return the field names of dataclass ``cls`` (read once per class: rows are built per run)."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def row_of(cls: type[R], record: asyncpg.Record | Mapping[str, Any], prefix: str = "") -> R:
    """Return ``cls`` built from the columns of ``record`` it names, each after ``prefix``."""
    return cls(**{name: record[prefix + name] for name in field_names(cls)})


def args_of(params: Any) -> tuple[Any, ...]:
    """Return a statement's parameters dataclass as its values in field order ($1, $2, ...).

    Such a dataclass is built by keyword, so no call site orders values by hand;
    its fields are declared in the statement's order, once.
    """
    return tuple(getattr(params, name) for name in field_names(type(params)))


def columns_of(cls: type[Any], items: Sequence[Any]) -> list[list[Any]]:
    """Return ``items`` (of dataclass ``cls``) as one array per field, in field order.

    What a set-based statement takes: its typed arrays, declared once as ``cls``'s fields.
    """
    return [[getattr(item, name) for item in items] for name in field_names(cls)]


@dataclass(frozen=True)
class RunRow:
    """A run's row in the store (``runs``)."""

    run_id: uuid.UUID
    play: str
    input: Any
    launch: dict[str, Any]
    release_id: str
    queue: str
    task_id: uuid.UUID | None
    status: str
    current_wait: dict[str, Any] | None
    checkpoint: dict[str, Any]
    adopted_release_id: str | None
    adopted_queue: str | None
    output: Any
    error: Any
    idempotency_key: str | None
    attempts: int
    max_attempts: int
    current_attempt_id: int | None
    step_keys: int | None
    retry_of: uuid.UUID | None
    retried_by: uuid.UUID | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class ListedRun:
    """One line of ``lane-worker runs``."""

    run_id: uuid.UUID
    play: str
    status: str
    release_id: str
    queue: str
    adopted_release_id: str | None
    attempts: int
    created_at: datetime
    retry_of: uuid.UUID | None


@dataclass(frozen=True)
class AttemptRow:
    """One attempt of a run, as ``status`` shows it."""

    attempt: int
    worker_id: str
    release_id: str
    disposition: str
    outcome: str | None
    error: Any
    claimed_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class FactRow:
    """One ledger fact of a run."""

    type: str
    fact: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class StepRow:
    """Which attempt (and release) committed one of a task's checkpoints."""

    checkpoint_name: str
    updated_at: datetime
    attempt: int | None
    release_id: str | None
    worker_id: str | None


@dataclass(frozen=True)
class Begun:
    """What recording a claim returned (``begin_attempt``)."""

    attempt_id: int
    checkpoint: dict[str, Any] | None  # None: not taken over (defer, refuse, or too late)
    step_keys: int | None
    current_wait: dict[str, Any] | None
    engine_checkpoints: dict[str, Any] | None  # by name; None when not taken over
    db_now_ms: int


@dataclass(frozen=True)
class DeferralCount:
    """A run's deferral streak after one more deferral."""

    defer_count: int
    deferred_s: float
    alert_now: bool


@dataclass(frozen=True)
class ClaimedRunState:
    """What a loop needs to decide on a claimed run, and the play and input to run it."""

    run_id: uuid.UUID
    release_id: str
    adopted_release_id: str | None
    adopted_queue: str | None
    status: str
    current_wait: dict[str, Any] | None
    play: str
    input: Any
    lane_claiming: bool
    adopter_claiming: bool


@dataclass(frozen=True)
class PlayOnLane:
    """Whether a live worker of a lane registers a play, whether any ever did, and how long
    the run asking has been put back in a row (0: not put back)."""

    live: bool
    ever: bool
    deferred_s: float = 0.0


@dataclass(frozen=True)
class LaneRow:
    """A lane's registry row."""

    queue: str
    status: str
    release_ids: list[str]
    release_id: str | None = None  # as deployed (lane_release_id, migration 0030)


@dataclass(frozen=True)
class ClaimingLane:
    """A claiming lane with a live worker for some play."""

    queue: str
    release_id: str
    # Every spelling a worker registered for it (lane_is_dev reads them all).
    release_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RegistryLane:
    """A lane as a worker's registry refresh reads it (``lane_registry``)."""

    queue: str
    status: str
    release_ids: list[str]
    created_at: datetime
    older_than_mine: bool  # registered before the reading worker's lane (lane_older)
    has_open: bool  # non-terminal runs stamped on it
    mine_open: bool  # open runs on it adopted by the reading worker's lane
    foreign_adopted: bool  # open runs on it adopted by another lane
    draining_work: bool  # work only its own release may run


@dataclass(frozen=True)
class PrunableLane:
    """A retired lane ``lanes prune`` may drop, unless a worker of it is live."""

    queue: str
    release_ids: list[str]
    retired_at: datetime
    live: bool


@dataclass(frozen=True)
class IdleDevLane:
    """A claiming dev lane none of whose workers was live for a while (``idle_dev_lanes``)."""

    queue: str
    release_id: str
    last_seen: datetime  # its last heartbeat, else its last registration
    busy: bool  # an open run or a pending sandbox cleanup: kept, shown idle


@dataclass(frozen=True)
class MaintainedLane:
    """A lane a maintenance pass reconciles."""

    queue: str
    status: str
    release_ids: list[str]
    engine_queue: bool  # False: no engine tables (a retire by an older build, say)
    release_id: str | None = None  # as deployed (lane_release_id, migration 0030)


@dataclass(frozen=True)
class ReportLane:
    """A registered lane as the drain report reads it (``report_lanes``)."""

    queue: str
    status: str
    release_ids: list[str]
    pruned_at: datetime | None  # None also while a submit or a boot made its queue again
    hidden: bool  # pruned and no open run names it
    workers: list[dict[str, Any]]  # its live workers: {"workerId", "plays"}
    retired_at: datetime | None  # when `lanes retire` marked it (None while it claims)
    release_id: str | None = None  # as deployed (lane_release_id, migration 0030)
    last_seen: datetime | None = None  # its newest heartbeat, else its last registration


@dataclass(frozen=True)
class ReportRuns:
    """One group of a lane's open runs (``report_runs``): one bucket, one ``needs_own``."""

    lane: str  # the effective lane: the adopter's, else the run's queue
    bucket: str
    needs_own: bool  # only this lane's release may run them
    runs: int
    run_ids: list[uuid.UUID]  # the oldest, at most 20
    run_created: list[datetime]  # their created_at, in the same order
    plays: list[str]
    oldest_update: datetime
    deferred: int
    oldest_deferral: datetime | None
    release_id: str | None  # as stamped (shown as deployed), for runs not adopted
    claiming_stamp: str | None  # adopted, parked, and their stamped lane claims again


@dataclass(frozen=True)
class DeliveryCount:
    """Undelivered ledger facts of one stamped lane (``report_deliveries``)."""

    queue: str
    pending: int
    failed: int


@dataclass(frozen=True)
class OpenRun:
    """One of a lane's newest open runs (``report_open_runs``), as the lanes page lists it."""

    lane: str  # the effective lane: the adopter's, else the run's queue
    run_id: uuid.UUID
    play: str
    status: str
    bucket: str  # the drain report's: inFlight, fresh, retrying, handedBack, parked...
    attempts: int
    defer_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RunPageRow:
    """What the run page shows beside ``run_status`` (``run_page``)."""

    run_id: uuid.UUID
    input: Any  # stored JSON (Unreadable when this process cannot decode it)
    current_wait: Any  # stored JSON: an object, or Unreadable, or (written past the API) anything
    attempts: int
    max_attempts: int
    defer_count: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    as_of: datetime
    bucket: str | None  # the drain report's bucket while the run is open
    payloads_hidden: bool = False  # a role that may not read inputs (the viewer's)


@dataclass(frozen=True)
class AdoptedCount:
    """How many open runs of one stamped lane another lane adopted (``report_adopted``)."""

    queue: str
    adopted_queue: str
    runs: int


@dataclass(frozen=True)
class PendingFact:
    """A ledger fact the relay leased for delivery (``claim_deliveries``)."""

    fact_id: int
    run_id: uuid.UUID
    type: str
    # Stored JSON: an object, or Unreadable, or (written past the store's checks) anything.
    fact: Any
    delivery_attempts: int  # tries so far
    created_at: datetime
    api: Any  # the run's runtime API context, as `fact`: holds tokens, never logged


@dataclass(frozen=True)
class DeliveryBacklog:
    """Pending ledger deliveries of the whole store (``delivery_backlog``)."""

    pending: int
    oldest_s: float | None
    next_due_s: float | None


@dataclass(frozen=True)
class CleanupCount:
    """Sandbox cleanups of one lane queue (``cleanup_counts``)."""

    queue: str
    pending: int
    failed: int
    failed_sandboxes: list[str]


@dataclass(frozen=True)
class Deployment:
    """A release in the registry (``deployments``), with its lane and its live workers."""

    release_id: str
    queue: str
    image: str
    desired: int
    role: str  # current, previous, retired, candidate (gated, migration 0050)
    deployed_at: datetime
    deployed_by: str
    retired_at: datetime | None
    retired_by: str | None
    lane_status: str | None  # the lane row's: claiming, retired; None before a worker booted
    live_workers: int
    ready_workers: int
    live_machines: list[str]  # machines with a live worker of it
    ready_machines: list[str]  # those whose worker is ready
    live_builds: dict[str, int]  # live workers per build version ('': before 0.2.0)
    # The scaler's record that this deploy's machines fail to boot (0047), else None.
    boot_failed: dict[str, Any] | None = None
    # Its gate (migration 0050): [{"play", "input"}, ...], None when deployed without one.
    gate: list[dict[str, Any]] | None = None
    gate_timeout_s: float | None = None
    gate_age_s: float | None = None  # since the scaler first submitted its runs
    gate_outcome: str | None = None  # passed, failed, abandoned; None while undecided
    gate_reason: str | None = None
    gate_run: str | None = None  # the gate run that failed or timed out


@dataclass(frozen=True)
class DeploymentEvent:
    """Who did what to a release, and when (``deployment_events``)."""

    event_id: int
    at: datetime
    release_id: str
    action: str
    actor: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class ReleaseHold:
    """The registry's hold (``release_hold``, migration 0033): who, since when, why."""

    held_by: str
    held_at: datetime
    reason: str | None

    def as_json(self) -> dict[str, Any]:
        return {"heldBy": self.held_by, "heldAt": self.held_at.isoformat(), "reason": self.reason}


@dataclass(frozen=True)
class ScalerState:
    """What the active scaler last saw and did (``scaler_state``)."""

    holder: str
    backend: str
    beat_at: datetime
    age_s: float
    releases: dict[str, Any]


@dataclass(frozen=True)
class ScalerCreate:
    """A create the scaler sent (``scaler_creates``, migration 0026), as remembered."""

    create_key: str
    release_id: str
    image: str
    machine_id: str | None  # None: the scaler was cut off before the backend answered
    listed: bool
    age_s: float  # since it was sent, on the database's clock
