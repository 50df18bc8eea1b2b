"""Store queries on lanes and workers: the registry, liveness, prune."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import (
    ClaimingLane,
    IdleDevLane,
    LaneRow,
    MaintainedLane,
    PlayOnLane,
    PrunableLane,
    RegistryLane,
    args_of,
)

# The first build whose boot makes its retired dev lane claim again (activate_dev_lane,
# 0.3.0). Maintenance never retires an idle dev lane whose last worker ran an older
# build (or recorded none: before 0.2.0): that worker, coming back, would find its lane
# retired and refuse to boot as a drained release's does.
DEV_LANE_RETURNS_FROM = "0.3.0"


@dataclass(frozen=True, slots=True)
class _Heartbeat:
    """``heartbeat``'s parameters, in its order ($1 ... $11)."""

    worker_id: str
    release_id: str
    queue: str
    hostname: str
    pid: int
    concurrency: int
    plays: list[str]
    machine_id: str | None
    ready: bool
    version: str | None
    not_claiming: list[dict[str, Any]]


class LaneQueries(Queries):
    """Lanes (``releases``) and the workers that serve them (``workers``)."""

    FILE = "lanes.sql"

    async def register(self, conn: Connection, *, queue: str, release_id: str) -> str | None:
        """Mark a lane claiming, never moving a retired one back; return its status.

        None: refused, written nothing: the lane holds a release id of the other kind
        (a release's and a worktree's, ``lane_kinds``).
        """
        status: str | None = await self._value(conn, "register_release", queue, release_id)
        return status

    async def set_status(
        self, conn: Connection, *, queue: str, status: str, release_id: str
    ) -> str | None:
        """Retire or activate a lane (``lanes retire`` / ``activate``); return its status.

        None: refused as ``register`` is (a spelling of the other kind holds the lane).
        """
        done: str | None = await self._value(conn, "set_release_status", queue, status, release_id)
        return done

    async def spellings(self, conn: Connection, *, queue: str) -> list[str]:
        """Every release id the lane is known by: registered, then deployed to it."""
        ids: list[str] = await self._value(conn, "lane_spellings", queue)
        return ids

    async def row(self, conn: Connection, *, queue: str) -> LaneRow | None:
        return await self._row(conn, LaneRow, "lane_row", queue)

    async def names(self, conn: Connection) -> list[str]:
        """Every registered lane's first spelling, then engine queues no lane row names."""
        return [r["name"] for r in await self._records(conn, "lane_names")]

    async def known(self, conn: Connection, *, queue: str) -> bool:
        """Tell whether anything ever used this queue (a lane row or the engine queue)."""
        return bool(await self._value(conn, "lane_known", queue))

    async def owns_task(self, conn: Connection, *, task_id: uuid.UUID) -> bool:
        """Tell whether this store created engine task ``task_id`` (a run's or a cleanup's)."""
        return bool(await self._value(conn, "owns_task", task_id))

    async def registry(self, conn: Connection, *, own_queue: str) -> list[RegistryLane]:
        """Every lane with what a worker of ``own_queue`` needs to follow it."""
        return await self._rows(conn, RegistryLane, "lane_registry", own_queue)

    async def draining_work(self, conn: Connection, *, queue: str) -> bool:
        """Tell whether the lane holds an open run only its own release may run."""
        return bool(await self._value(conn, "lane_draining_work", queue))

    async def claiming_for_play(self, conn: Connection, *, play: str) -> list[ClaimingLane]:
        """Claiming lanes, newest first, with a live worker whose app registers ``play``."""
        return await self._rows(conn, ClaimingLane, "claiming_lanes_for_play", play)

    async def live_plays(self, conn: Connection, *, queue: str) -> list[str]:
        """The plays the live workers of the lane register."""
        plays: list[str] = await self._value(conn, "live_plays", queue)
        return plays

    async def play_on_lane(
        self, conn: Connection, *, queue: str, play: str, run_id: uuid.UUID
    ) -> PlayOnLane:
        """Whether a live worker of the lane registers ``play``, whether one ever did, and how
        long ``run_id`` has been put back in a row."""
        found = await self._row(conn, PlayOnLane, "lane_play_registered", queue, play, run_id)
        return found if found is not None else PlayOnLane(live=False, ever=False)

    async def prunable(self, conn: Connection, *, older_than_s: float) -> list[PrunableLane]:
        return await self._rows(conn, PrunableLane, "prunable_lanes", older_than_s)

    async def idle_dev(self, conn: Connection, *, idle_after_s: float) -> list[IdleDevLane]:
        """Claiming dev lanes with no live worker seen for over ``idle_after_s`` seconds
        (none whose last worker's build predates ``DEV_LANE_RETURNS_FROM``)."""
        return await self._rows(
            conn, IdleDevLane, "idle_dev_lanes", idle_after_s, DEV_LANE_RETURNS_FROM
        )

    async def retire_idle_dev(self, conn: Connection, *, queue: str, idle_after_s: float) -> bool:
        """Retire an idle dev lane, re-checked under its row lock; say whether it was."""
        done = await self._value(
            conn, "retire_idle_dev_lane", queue, idle_after_s, DEV_LANE_RETURNS_FROM
        )
        return done is not None

    async def activate_dev(self, conn: Connection, *, queue: str) -> bool:
        """Make a retired dev lane claim again (its worker boots); say whether it was retired."""
        return await self._value(conn, "activate_dev_lane", queue) is not None

    async def open_tasks(self, conn: Connection, *, queue: str) -> tuple[int, int]:
        """Return the queue's unfinished engine tasks, and how many this store did not create."""
        row = await self._records(conn, "queue_tasks", queue)
        return int(row[0]["open_tasks"]), int(row[0]["foreign_tasks"])

    async def holds_foreign_task(self, conn: Connection, *, queue: str) -> bool:
        """Tell whether the queue holds a task this store did not create, finished or not.

        The engine must have the queue (its task table is named in the statement).
        """
        found = await conn.fetchval(self._on_queue("queue_holds_foreign_task", queue))
        return bool(found)

    async def record_created_queue(self, conn: Connection, queue: str) -> None:
        """Record that this store created engine ``queue``, in the creating transaction."""
        await self._run(conn, "record_created_queue", queue)

    async def prepare_queue_as_owner(self, conn: Connection, queue: str) -> None:
        """Have the store's owner make engine ``queue`` and its NOTIFY trigger (0042)."""
        await self._value(conn, "prepare_lane_queue", queue)

    async def queue_created_here(self, conn: Connection, *, queue: str) -> bool | None:
        """Tell whether this store recorded creating engine ``queue``; None: no such queue."""
        found: bool | None = await self._value(conn, "queue_created_by_store", queue)
        return found

    async def forget_created_queue(self, conn: Connection, *, queue: str) -> None:
        """Drop the record of ``queue`` (``lanes prune`` dropped the queue)."""
        await self._run(conn, "forget_created_queue", queue)

    async def prune(self, conn: Connection, *, queue: str) -> bool:
        """Mark the lane pruned, re-checked under its row lock; say whether it was."""
        return await self._value(conn, "prune_lane", queue) is not None

    async def heartbeat(
        self,
        conn: Connection,
        *,
        worker_id: str,
        release_id: str,
        queue: str,
        hostname: str,
        pid: int,
        concurrency: int,
        plays: list[str],
        machine_id: str | None = None,
        ready: bool = False,
        version: str | None = None,
        not_claiming: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record (or refresh) a live worker: its plays, machine, build and loops not claiming."""
        params = _Heartbeat(
            worker_id=worker_id,
            release_id=release_id,
            queue=queue,
            hostname=hostname,
            pid=pid,
            concurrency=concurrency,
            plays=plays,
            machine_id=machine_id,
            ready=ready,
            version=version,
            not_claiming=not_claiming or [],
        )
        await self._run(conn, "heartbeat", *args_of(params))

    async def for_maintenance(self, conn: Connection) -> list[MaintainedLane]:
        """The lanes a maintenance pass reconciles, each with whether its engine queue exists."""
        return await self._rows(conn, MaintainedLane, "maintenance_lanes")

    async def maintained_queues(self, conn: Connection) -> list[tuple[str, bool]]:
        """Every engine queue, with whether it is lane-worker's to clean (a lane's or a run's)."""
        return [(r["queue"], r["own"]) for r in await self._records(conn, "maintained_queues")]

    async def clean_own(self, conn: Connection, *, queue: str) -> tuple[int, int]:
        """Delete one batch of what this store created that ended 6 hours ago on ``queue``.

        Return the finished tasks and the events deleted; another system's stay.
        """
        row = await self._records(conn, "clean_own", queue)
        return int(row[0]["tasks_deleted"]), int(row[0]["events_deleted"])

    async def worker_stopped(self, conn: Connection, *, worker_id: str) -> None:
        await self._run(conn, "worker_stopped", worker_id)
