"""The identity of the attempt being executed: its run, its engine run, its fence, its clock."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from worker import lanes

# Step-key mappings (runs.step_keys). None: the first one, where a name with a
# '#' could meet a repeated name's key; kept for runs whose steps it wrote.
STEP_KEYS_LEGACY = None
STEP_KEYS_ESCAPED = 2
STEP_KEYS_CURRENT = STEP_KEYS_ESCAPED


@dataclass(frozen=True)
class DbClock:
    """The database's clock, read at the claim and advanced by this process's monotonic clock.

    The engine wakes runs by the database's clock; measuring a sleep or a
    timeout on the worker's wall clock would wake a skewed worker early or late.
    """

    db_ms: int
    monotonic_s: float = field(default_factory=time.monotonic)

    def now_ms(self) -> int:
        """Return the database's time now, in Unix milliseconds."""
        return self.db_ms + round((time.monotonic() - self.monotonic_s) * 1000)


def local_clock() -> DbClock:
    """Return a clock on this process's wall time (tests and tools without a claim)."""
    return DbClock(int(time.time() * 1000))


@dataclass
class RunHandle:
    """The engine and store identity of the run being executed, and its fence."""

    run_id: uuid.UUID
    queue: str
    task_id: uuid.UUID
    engine_run_id: uuid.UUID
    attempt: int
    attempt_id: int
    lease_s: int
    clock: DbClock = field(default_factory=local_clock)
    step_keys: int | None = STEP_KEYS_CURRENT


@dataclass(frozen=True)
class WorkerSeat:
    """This worker's identity on the lanes: its release, its own queue, its lease."""

    release_id: str
    own_queue: str
    worker_base: str
    lease_s: int

    @classmethod
    def of(
        cls, release_id: str, *, worker_base: str, lease_s: int, own_queue: str | None = None
    ) -> WorkerSeat:
        """Return the seat of worker ``worker_base`` of ``release_id`` (as deployed).

        ``own_queue`` is the lane the settings derived (``Settings.queue``); without it,
        the lane rules give it from ``release_id``.
        """
        queue = own_queue if own_queue is not None else lanes.queue_name_for_release(release_id)
        return cls(release_id, queue, worker_base, lease_s)

    def worker_id_for(self, queue: str) -> str:
        """Return the engine worker id this worker claims ``queue`` with."""
        if lanes.loop_kind(queue, self.own_queue) == "own":
            return self.worker_base
        return lanes.continuation_worker_id(self.worker_base, queue)
