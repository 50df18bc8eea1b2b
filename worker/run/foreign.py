"""Tasks lane-worker did not create, met on a queue it claims: left for their owner.

A lane queue is shared whenever release ids coincide: the TypeScript system of
the seed (its own workers, its own store) spawns ``play-run`` and other tasks
on ``runs``, ``runs_<suffix>`` or ``runs_<release>`` exactly as lane-worker
does. A task is lane-worker's when this store names it (a run row with its
task id, or a sandbox cleanup row); any other is foreign. The claim is meant to
skip foreign tasks, but an older claim path (or a race with a task whose store
row commits later) still hands some over. Such a task is put back as it was
(``absurd.schedule_run`` keeps its attempt number: nothing spent), never run,
failed or cancelled, and due again after a back-off per task (1 s doubling to
30 s), so a task no owner takes costs one claim per 30 s. Each queue's first
one is logged once (``run.foreign_left``); ``lanes --json`` counts them.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict

import structlog

from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store import Store

log = structlog.get_logger("lane_worker.runtime")

FOREIGN_BACKOFF_FIRST_S = 1.0
FOREIGN_BACKOFF_MAX_S = 30.0
# Tasks whose back-off is remembered; the oldest is forgotten first (it starts again at 1 s).
_REMEMBERED = 10_000


def backoff_s(times_met: int) -> float:
    """Return how long a foreign task met ``times_met`` times (1, 2, ...) is put back for."""
    exponent = min(max(times_met, 1) - 1, 16)
    return min(FOREIGN_BACKOFF_FIRST_S * 2.0**exponent, FOREIGN_BACKOFF_MAX_S)


class ForeignTasks:
    """Puts back the tasks of other systems a claim handed to this worker; says so once a queue."""

    def __init__(self, db: Database, store: Store) -> None:
        self.db, self.store = db, store
        self._met: OrderedDict[uuid.UUID, int] = OrderedDict()
        self._said: set[str] = set()

    async def owned(self, task_id: uuid.UUID) -> bool:
        """Tell whether this store created engine task ``task_id`` (a run's or a cleanup's)."""
        return await self.db.run(lambda c: self.store.lanes.owns_task(c, task_id=task_id))

    async def leave(self, claimed: engine.ClaimedRun, worker_id: str) -> bool:
        """Put the task back for its owner, untouched but for its due time; say if it was.

        Fenced by the engine lease: a task no longer held by ``worker_id`` (its
        lease expired and someone else took it) is left as it is.
        """
        times = self._met.pop(claimed.task_id, 0) + 1
        self._met[claimed.task_id] = times
        while len(self._met) > _REMEMBERED:
            self._met.popitem(last=False)
        delay_s = backoff_s(times)

        async def put_back(conn: Connection) -> bool:
            if not await engine.lock_if_held(conn, claimed.queue, claimed.run_id, worker_id):
                return False
            await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
            return True

        left: bool = await self.db.transaction(put_back)
        if claimed.queue not in self._said:
            self._said.add(claimed.queue)
            log.warning(
                "run.foreign_left",
                queue=claimed.queue,
                task_id=str(claimed.task_id),
                task_name=claimed.task_name,
                due_in_s=delay_s,
                detail="a task this store did not create (another system shares this queue): "
                "left for its owner, never run, failed or cancelled; logged once per queue, "
                "counted as foreignTasks in `lane-worker lanes --json`",
            )
        return left
