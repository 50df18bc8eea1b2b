"""``lanes prune``: drop the engine queues of lanes long retired and drained.

The lane rows and every run stay (history); only the engine tables go, and only
those lane-worker made and that hold nothing of another system's. One
transaction per lane, re-checked under the lane row's lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from worker.db import engine
from worker.db.store import Store
from worker.db.store.rows import PrunableLane
from worker.errors import InvalidRequestError

if TYPE_CHECKING:
    from worker.db.pool import Connection, Database


class LanePruning:
    """``lanes prune`` on one store, and the lanes it keeps with the reason for each.

    ``check_schemas`` refuses (run ``lane-worker migrate``) before anything is
    read from a database whose schemas are missing or old.
    """

    def __init__(
        self, db: Database, store: Store, check_schemas: Callable[[], Awaitable[None]]
    ) -> None:
        self.db = db
        self.store = store
        self.check_schemas = check_schemas

    async def prune_lanes(
        self,
        older_than_s: float,
        *,
        dry_run: bool = False,
    ) -> list[str]:
        """Drop the engine queues of lanes retired over ``older_than_s`` ago with no open run.

        The lane rows and every run stay (history: ``status``, ``runs``); only the
        engine tables go. A lane with a live worker is kept (its loops poll the
        queue: ``prune_kept_live`` names them), so is one whose engine queue
        lane-worker has no record of creating (``prune_kept_not_ours``, migration
        0024: the TypeScript app's when release ids coincide, or one an older
        build or a savepoint made),
        one whose queue holds an unfinished task (``prune_kept_busy``) or any task
        lane-worker did not create, finished or not (``prune_kept_foreign``:
        another system's queue too). One transaction per lane, re-checked under
        the lane row's lock. Returns the queues pruned (or, with ``dry_run``, that
        would be).
        """
        if not older_than_s >= 0:
            raise InvalidRequestError("--older-than must be a duration of 0 or more.")
        await self.check_schemas()
        rows = await self.db.run(
            lambda c: self.store.lanes.prunable(c, older_than_s=float(older_than_s))
        )
        return await self.prune_rows(rows, dry_run=dry_run)

    async def prune_rows(
        self, candidates: Sequence[PrunableLane], *, dry_run: bool = False
    ) -> list[str]:
        """Prune those of ``candidates`` (``prunable`` rows) the checks let go (see
        ``prune_lanes``); return their queues."""
        rows = [
            r
            for r in candidates
            if not r.live
            and not await self._not_ours(r.queue)
            and not await self._busy(r.queue)
            and not await self._foreign(r.queue)
        ]
        if dry_run:
            return [r.queue for r in rows]
        pruned = []
        for row in rows:
            queue = row.queue

            async def prune(conn: Connection, queue: str = queue) -> bool:
                if not await self.store.lanes.prune(conn, queue=queue):
                    return False  # work arrived, or it was activated, meanwhile
                created_here = await self.store.lanes.queue_created_here(conn, queue=queue)
                if created_here is None:
                    return True  # no engine queue (dropped by other means): nothing to drop
                if not created_here:
                    raise _PruneRace  # made again by another system since the check above
                # Dropping waits for any submit still writing to the queue's tables;
                # one that committed meanwhile makes the whole prune roll back.
                # With the queue's task writers held off (prune_lane), a task of
                # another system that came and finished since the check above.
                if await self._holds_foreign(conn, queue):
                    raise _PruneRace
                await engine.drop_queue(conn, queue)
                if await self.store.runs.queue_has_open(conn, queue=queue):
                    raise _PruneRace
                # Whoever creates the queue next owns it.
                await self.store.lanes.forget_created_queue(conn, queue=queue)
                return True

            try:
                if await self.db.transaction(prune):
                    pruned.append(queue)
            except _PruneRace:
                continue
        return pruned

    async def _not_ours(self, queue: str) -> bool:
        """Tell whether the engine has the queue and lane-worker has no record of creating it."""
        created_here = await self.db.run(
            lambda c: self.store.lanes.queue_created_here(c, queue=queue)
        )
        return created_here is False

    async def _busy(self, queue: str) -> bool:
        """Tell whether the queue holds an unfinished task of any kind (one queue a statement)."""
        open_tasks, _ = await self.db.run(lambda c: self.store.lanes.open_tasks(c, queue=queue))
        return open_tasks > 0

    async def another_systems(self, queue: str) -> bool:
        """Tell whether another system uses the queue: lane-worker has no record of creating
        it, or it holds a task lane-worker did not create (the TypeScript app's)."""
        return await self._not_ours(queue) or await self._foreign(queue)

    async def _holds_foreign(self, conn: Connection, queue: str) -> bool:
        return await engine.queue_exists(conn, queue) and await self.store.lanes.holds_foreign_task(
            conn, queue=queue
        )

    async def _foreign(self, queue: str) -> bool:
        """Tell whether the queue holds a task lane-worker did not create, finished or not."""
        return await self.db.run(lambda c: self._holds_foreign(c, queue))

    async def prune_kept_foreign(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps because their queue holds another system's task.

        Only finished ones (an unfinished one keeps it busy): dropping the queue
        would drop that system's history and the queue it still spawns on.
        """
        await self.check_schemas()
        rows = await self.db.run(
            lambda c: self.store.lanes.prunable(c, older_than_s=float(older_than_s))
        )
        return [
            r.queue
            for r in rows
            if not r.live
            and not await self._not_ours(r.queue)
            and not await self._busy(r.queue)
            and await self._foreign(r.queue)
        ]

    async def prune_kept_busy(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps because their queue holds an unfinished task."""
        await self.check_schemas()
        rows = await self.db.run(
            lambda c: self.store.lanes.prunable(c, older_than_s=float(older_than_s))
        )
        return [
            r.queue
            for r in rows
            if not r.live and not await self._not_ours(r.queue) and await self._busy(r.queue)
        ]

    async def prune_kept_not_ours(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps because lane-worker has no record of creating
        their queue.

        Another system's queue (the TypeScript app's, when release ids coincide)
        that a lane row names, or one lane-worker made without a record (a build
        before migration 0024, or inside a savepoint): `lanes prune` never drops
        it, whatever it holds, with no override (an operator who has checked
        drops it with ``absurdctl drop-queue``).
        """
        await self.check_schemas()
        rows = await self.db.run(
            lambda c: self.store.lanes.prunable(c, older_than_s=float(older_than_s))
        )
        return [r.queue for r in rows if not r.live and await self._not_ours(r.queue)]

    async def prune_kept_live(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps only because a worker of theirs is live."""
        await self.check_schemas()
        rows = await self.db.run(
            lambda c: self.store.lanes.prunable(c, older_than_s=float(older_than_s))
        )
        return [r.queue for r in rows if r.live]

    async def candidates(self, older_than_s: float) -> list[PrunableLane]:
        """The lanes maintenance may prune by itself: retired long enough, no open run, and
        no sandbox whose cleanup gave up (the report names it for an operator to delete by
        hand, and a pruned lane leaves the report: such a lane goes only by `lanes prune`)."""
        rows = await self.db.run(
            lambda c: self.store.lanes.prunable(c, older_than_s=float(older_than_s))
        )
        if not rows:
            return []
        counts = await self.db.run(self.store.sandboxes.counts)
        given_up = {c.queue for c in counts if c.failed}
        return [r for r in rows if r.queue not in given_up]


class _PruneRace(Exception):
    """A lane changed while it was being pruned (a run arrived, another system's task or
    queue came): the prune is undone."""
