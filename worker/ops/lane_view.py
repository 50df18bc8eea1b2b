"""A lane as the drain report shows it (``LaneView``) and what blocks its stop (``Blocker``).

The value every reader of the report takes: the CLI, the page, the health gauges,
the scaler. ``report.py`` fills it; ``blockers.py`` says what blocks it;
``lanes_text.py`` renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from worker import lane_kinds
from worker.db.store.rows import OpenRun
from worker.ops.workers import NOT_CLAIMING, UNKNOWN, claim_health, with_health

BUCKETS = ("inFlight", "fresh", "retrying", "handedBack", "parkedSleep", "parkedEvent")
PARKED = ("parkedSleep", "parkedEvent")
# The blocker of fresh runs waiting on workers that cannot say whether they claim:
# shown on a claiming lane too (the others of a claiming lane are its own workers' business).
UNKNOWN_BLOCKER = "claimHealthUnknown"
_SHOWN_SANDBOXES = 50


@dataclass(frozen=True)
class Blocker:
    """One reason a lane's machines may not stop yet, with what to do about it."""

    reason: str
    count: int
    remedy: str
    run_ids: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """Return the blocker as the report's JSON object."""
        return {
            "reason": self.reason,
            "count": self.count,
            "remedy": self.remedy,
            "runIds": list(self.run_ids),
        }


@dataclass(frozen=True)
class LaneView:
    """One release lane as ``lanes`` reports it."""

    release_id: str
    queue: str
    # claiming; draining (retired, with runs only its release may run); drained;
    # unregistered (open runs on a lane no worker ever registered)
    status: str
    live_workers: int
    queued: int
    running: int
    waiting: int
    adoptable: int
    release_ids: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    oldest_wait_s: float | None = None
    oldest_deferral_s: float | None = None
    adopted_by: dict[str, int] = field(default_factory=dict)
    workers: tuple[dict[str, Any], ...] = ()
    blocked_by: tuple[Blocker, ...] = ()
    # `lanes prune` dropped its engine queue (a retired, drained lane's history).
    pruned: bool = False
    # Ledger facts of its runs not delivered to their runtime API: waiting, given up.
    facts_pending: int = 0
    facts_failed: int = 0
    # Sandbox cleanups on its queue: waiting (or running), and the given-up sandboxes.
    cleanups_pending: int = 0
    cleanups_failed: tuple[str, ...] = ()
    # The release registry's word on it (None: deployed by hand), and the scaler's.
    role: str | None = None  # current, previous, retired
    machines_desired: int | None = None
    machines_live: int = 0
    scaler: str | None = None  # what the active scaler last did or said about it
    as_of: datetime | None = None  # when the report was read (the database's clock)
    # Seconds since `lanes retire` while the lane is draining; 0 in any other status.
    draining_s: float = 0.0
    # Its newest open runs, when the read asked for them (the lanes page does).
    open_runs: tuple[OpenRun, ...] = ()
    # Unfinished tasks on its queue that lane-worker did not create (another system's).
    foreign_tasks: int = 0
    # When a worker of it was last seen (its newest heartbeat, else its registration).
    last_seen: datetime | None = None

    @property
    def dev(self) -> bool:
        """Tell whether it is a dev lane only (a worktree's: every spelling dev / dev-...)."""
        ids = self.release_ids or (self.release_id,)
        return all(lane_kinds.is_dev(i) for i in ids)

    @property
    def mixed(self) -> bool:
        """Tell whether a release and a worktree both registered it (older builds let them):
        the store treats it as a dev lane (no adoption); workers of both kinds are refused."""
        return lane_kinds.is_mixed(self.release_ids)

    @property
    def idle_dev(self) -> bool:
        """Tell whether it is a claiming dev lane with no live worker (a worktree gone?)."""
        return self.dev and self.status == "claiming" and not self.live_workers

    @property
    def claiming_workers(self) -> int:
        """Return how many live workers claim (every loop of theirs does: migration 0021)."""
        return self.live_workers - sum(
            1 for w in self.workers if claim_health(w) in (NOT_CLAIMING, UNKNOWN)
        )

    @property
    def unknown_workers(self) -> int:
        """Return how many live workers cannot say whether they claim (builds before 0.2.0)."""
        return len(with_health(self.workers, UNKNOWN))

    @property
    def counts_open(self) -> int:
        """Return how many open runs the lane holds (every bucket)."""
        return sum(self.counts.get(b, 0) for b in BUCKETS)

    @property
    def stranded(self) -> bool:
        """Tell whether it holds work only its release may run and no live worker that claims.

        A claiming lane counts too: its open runs are its own (a release rolled back
        to, or scaled to 0, whose machines do not run, or whose claims keep failing).
        A live worker of a build before 0.2.0 may claim: it is not counted as stranded
        (its ``claimHealthUnknown`` blocker says when its runs wait long).
        """
        if self.claiming_workers or self.unknown_workers:
            return False
        if self.status == "claiming":
            return any(self.counts.get(key, 0) for key in BUCKETS)
        return self.status in ("draining", "unregistered")

    @property
    def quiet(self) -> bool:
        """Tell whether there is nothing here to watch: drained or idle, no live worker, no failure.

        A listing of many lanes folds these into a count (``collapsed``): a week
        of deploys leaves hundreds of drained lanes until they are pruned.
        """
        if self.live_workers or self.stranded or self.facts_failed or self.cleanups_failed:
            return False
        if self.role in ("current", "previous", "candidate"):
            return False
        if self.status == "drained":
            return True
        return self.status == "claiming" and not any(self.counts.get(b, 0) for b in BUCKETS)

    @property
    def safe_to_stop(self) -> bool:
        """Tell whether this lane's machines may stop: it is retired and drained."""
        return self.status == "drained"

    def as_json(self) -> dict[str, Any]:
        """Return the JSON object of one lane in ``lane-worker lanes --json``."""
        return {
            "releaseId": self.release_id,
            "queue": self.queue,
            "status": self.status,
            "liveWorkers": self.live_workers,
            "claimingWorkers": self.claiming_workers,
            "claimHealthUnknownWorkers": self.unknown_workers,
            "queued": self.queued,
            "running": self.running,
            "waiting": self.waiting,
            "adoptable": self.adoptable,
            "workers": list(self.workers),
            "counts": {
                **self.counts,
                "oldestWaitSeconds": self.oldest_wait_s,
                "oldestDeferralSeconds": self.oldest_deferral_s,
                "adoptedBy": self.adopted_by,
            },
            "safeToStop": self.safe_to_stop,
            "blockedBy": [b.as_json() for b in self.blocked_by],
            "pruned": self.pruned,
            # Information only: delivery never keeps a lane from draining.
            "ledger": {"pending": self.facts_pending, "failed": self.facts_failed},
            "stranded": self.stranded,
            "release": {
                "role": self.role,
                "machinesDesired": self.machines_desired,
                "machinesLive": self.machines_live,
                "scaler": self.scaler,
            },
            "asOf": self.as_of.isoformat() if self.as_of else None,
            "drainingSeconds": self.draining_s,
            # Information only: another system's tasks never keep a lane draining.
            "foreignTasks": self.foreign_tasks,
            "dev": self.dev,
            "mixed": self.mixed,
            "lastSeen": self.last_seen.isoformat() if self.last_seen else None,
            "sandboxCleanup": {
                "pending": self.cleanups_pending,
                "failed": len(self.cleanups_failed),
                "failedSandboxes": list(self.cleanups_failed[:_SHOWN_SANDBOXES]),
                "remedy": (
                    "delete these sandboxes in Daytona by hand (its dashboard, or "
                    "`daytona sandbox delete ID`): their cleanup gave up after 20 attempts"
                    if self.cleanups_failed
                    else None
                ),
            },
        }
