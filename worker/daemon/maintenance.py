"""Maintenance: a bounded engine cleanup pass and the reconciler, in small transactions.

A pass reads the engine's queues and the lane registry in one short transaction
of its own, then cleans at most ``CLEANUP_PER_PASS`` queues, ``CLEANUP_BATCH`` to
a transaction, and reconciles at most ``RECONCILE_PER_PASS`` lanes,
``RECONCILE_GROUP`` to a transaction. A ``Rotation`` carries on where the last
pass stopped, so with more queues than one pass takes, each comes round within
a few passes. No transaction locks more than one batch's queues' tables: a
single transaction over every queue held ~30 locks per queue until it committed
and ran PostgreSQL out of shared memory at 700 queues (issue 35).

Cleanup deletes only what lane-worker created (issue 29): it takes only queues
a lane row or a run of this store names, and there only this store's finished
tasks and events (the store's ``clean_own``, by lane-worker's own retention of 6
hours, whatever the queue's policy: that is its creator's). Another
system on Absurd may share a queue (the TypeScript app, when release ids
coincide) or keep queues of its own: its tasks and events are its own to clean.

Every queue is maintained on its own: a queue that fails is logged
(``maintenance.queue_failed``) and counted (``lane_worker_maintenance_errors_total``),
and the pass goes on with the next one. A database outage ends the pass (it
raises), since every other queue would fail the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

import asyncpg
import structlog

from worker.db import engine, role_check
from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store
from worker.db.store.rows import MaintainedLane
from worker.db.tasks import LANES_CHANNEL
from worker.metrics import Metrics
from worker.ops.prune import LanePruning
from worker.run.reconcile import RECONCILE_BATCH, reconcile_queue, settle_batch
from worker.states import LaneStatus

log = structlog.get_logger("lane_worker.maintenance")

# pg_try_advisory_xact_lock key of a cleanup batch ("lwmaint"), the key older builds
# held for their whole pass: one worker cleans at a time, and under PgBouncer too.
_MAINTENANCE_LOCK_KEY = 0x6C77_6D61_696E_7400
# Open attempts of dead workers closed per pass (a chaos roll leaves a handful).
ATTEMPT_SWEEP_BATCH = 1000
# A queue's cleanup locks ~34 relations (5 tables and their indexes) until commit: a
# batch holds ~700 of the ~7,800 slots of PostgreSQL's default lock table
# (max_locks_per_transaction 64 x its ~120 backends), a pass of 1,000 queues held 34,000.
CLEANUP_BATCH = 20
# Cleanup deletes what ended 6 hours ago: every queue within 17 minutes (at 1,000
# queues) is plenty, and a pass stays three transactions however many queues there are.
CLEANUP_PER_PASS = 60
# A lane's reconcile read locks ~10 relations (its task and run tables and their indexes).
# It is the safety net under the claim's own settling (a lease that expired on the last
# attempt, a cancellation policy): two transactions a pass, each lane with open runs
# every ceil(lanes / 100) minutes. Per pass, not per lane: idle cost must not grow with
# the lanes a week of deploys leaves (issue 35).
RECONCILE_GROUP = 50
RECONCILE_PER_PASS = 100
# Retired lanes old enough to prune that a pass looks at (each: three reads, then one
# transaction if it goes). Drained lanes come at the pace of deploys: ten a minute is plenty.
PRUNE_CHECKS_PER_PASS = 10


@dataclass
class Rotation:
    """Where each step of the next pass starts: after the last queue the step took."""

    after: dict[str, str] = field(default_factory=dict)

    def take(self, step: str, names: Sequence[str], most: int) -> list[str]:
        """Return up to ``most`` of ``names``, starting after the last one ``step`` took."""
        ordered = sorted(names)
        last = self.after.get(step, "")
        later = [n for n in ordered if n > last]
        return (later + [n for n in ordered if n <= last])[:most]

    def done(self, step: str, name: str) -> None:
        """Record that ``step`` has dealt with ``name``: the next pass starts after it."""
        self.after[step] = name


def _batches(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


async def maintain(
    db: Database,
    store: Store,
    *,
    worker_id: str,
    metrics: Metrics | None = None,
    rotation: Rotation | None = None,
    prune_after_s: float = 0.0,
    dev_idle_after_s: float = 0.0,
) -> bool:
    """Run one pass; return False when another worker was cleaning (nothing done).

    ``prune_after_s`` (``LANE_WORKER_PRUNE_AFTER``; 0: never): retired lanes with
    nothing unfinished, retired at least that long ago, are pruned as ``lanes
    prune`` prunes them, at most ``PRUNE_CHECKS_PER_PASS`` looked at a pass.
    ``dev_idle_after_s`` (``LANE_WORKER_DEV_LANE_IDLE_AFTER``; 0: never): dev lanes
    (a worktree's) with no live worker for that long and no open run are retired
    first (``retire_idle_dev_lanes``), so the prune takes them in turn.
    """
    rotation = rotation if rotation is not None else Rotation()

    async def read(conn: Connection) -> tuple[list[tuple[str, bool]], list[MaintainedLane]]:
        return await store.lanes.maintained_queues(conn), await store.lanes.for_maintenance(conn)

    queues, registry = await db.transaction(read)
    own = [queue for queue, ours in queues if ours]
    picked = rotation.take("cleanup", own, CLEANUP_PER_PASS)
    cleaned = 0
    for index, batch in enumerate(_batches(picked, CLEANUP_BATCH)):
        failed = await db.transaction(lambda c, b=batch: _clean(c, store, b))  # type: ignore[misc]
        if failed is None:
            # Another worker is cleaning: this batch waits for the next pass.
            if index == 0:
                return False
            break
        # Logged once the transaction committed: a retried transaction must not count twice.
        for queue, error in failed:
            _queue_failed(metrics, queue, worker_id, "cleanup", error)
        rotation.done("cleanup", batch[-1])
        cleaned += len(batch)
    lanes = {lane.queue: lane for lane in registry}
    chosen = rotation.take("reconcile", list(lanes), RECONCILE_PER_PASS)
    await reconcile_lanes(
        db, store, [lanes[q] for q in chosen], worker_id=worker_id, metrics=metrics
    )
    if chosen:
        rotation.done("reconcile", chosen[-1])
    # After the reconcile: a run it just ended may leave a dead worker's attempt open.
    closed = await db.run(lambda c: store.attempts.close_abandoned(c, limit=ATTEMPT_SWEEP_BATCH))
    if closed:
        log.info("maintenance.attempts_closed", worker_id=worker_id, attempts=len(closed))
    retired = (
        await retire_idle_dev_lanes(db, store, rotation, dev_idle_after_s, worker_id)
        if dev_idle_after_s
        else 0
    )
    pruned = await _prune(db, store, rotation, prune_after_s, worker_id) if prune_after_s else 0
    # What this pass covered: with more queues than a pass takes, the rest come next.
    log.info(
        "maintenance.passed",
        worker_id=worker_id,
        engine_queues=len(queues),
        own_queues=len(own),
        cleaned=cleaned,
        lanes=len(registry),
        reconciled=len(chosen),
        dev_retired=retired,
        pruned=pruned,
    )
    return True


async def _prune(
    db: Database, store: Store, rotation: Rotation, prune_after_s: float, worker_id: str
) -> int:
    """Prune this pass's share of the lanes retired over ``prune_after_s`` ago; return how many.

    A lane the checks keep (a live worker, an unfinished task of any kind, a
    pending sandbox cleanup, another system's task or queue) comes round again
    later: the rotation bounds a pass whatever the number kept.
    """

    async def nothing() -> None:
        return None  # the daemon checked the schemas at boot

    pruning = LanePruning(db, store, check_schemas=nothing)
    candidates = {r.queue: r for r in await pruning.candidates(prune_after_s)}
    picked = rotation.take("prune", list(candidates), PRUNE_CHECKS_PER_PASS)
    if not picked:
        return 0
    if not await db.run(role_check.may_drop_queues):
        # A worker's own role (issue 33) may not drop the owner's engine tables: the
        # prune would fail each pass. Said once a pass while lanes wait for it.
        log.warning(
            "maintenance.prune_skipped",
            worker_id=worker_id,
            lanes=len(candidates),
            after_s=prune_after_s,
            hint="this worker's database role may not drop engine queues: prune as the "
            "store's owner (`lane-worker lanes prune`, on a schedule), or set "
            "LANE_WORKER_PRUNE_AFTER=0 on workers that connect with their own role",
        )
        return 0
    pruned = await pruning.prune_rows([candidates[q] for q in picked])
    rotation.done("prune", picked[-1])
    for queue in pruned:
        log.info("lane.pruned", worker_id=worker_id, queue=queue, after_s=prune_after_s)
    return len(pruned)


async def _say_lane_changed(conn: Connection, *, queue: str) -> None:
    await conn.execute("select pg_notify($1, $2)", LANES_CHANNEL, queue)


async def retire_idle_dev_lanes(
    db: Database, store: Store, rotation: Rotation, idle_after_s: float, worker_id: str
) -> int:
    """Retire this pass's share of the dev lanes idle over ``idle_after_s``; return how many.

    A worktree deleted leaves its lane claiming with no worker for ever. Only a lane
    every spelling of which is a dev one (never a release's), with no live worker
    seen for that long, no open run or pending sandbox cleanup, on a queue no other
    system uses (the TypeScript app's shares the dev queue names): each re-checked
    under the lane row's lock. One with open runs stays (``lanes`` shows it idle).
    Its worker booting again activates it (boot: ``activate_dev``).
    """
    rows = await db.run(lambda c: store.lanes.idle_dev(c, idle_after_s=idle_after_s))
    lanes = {r.queue: r for r in rows if not r.busy}
    picked = rotation.take("dev-retire", list(lanes), PRUNE_CHECKS_PER_PASS)
    if not picked:
        return 0

    async def nothing() -> None:
        return None  # the daemon checked the schemas at boot

    pruning = LanePruning(db, store, check_schemas=nothing)
    retired = 0
    for queue in picked:
        if await pruning.another_systems(queue):
            continue
        if not await db.run(
            lambda c, q=queue: store.lanes.retire_idle_dev(  # type: ignore[misc]
                c, queue=q, idle_after_s=idle_after_s
            )
        ):
            continue  # a worker came back, or a run arrived, meanwhile
        # As `lanes retire` does: a worker of the lane that is alive after all (a laptop
        # that slept) reads it at once, and makes it claim again, not at its next poll.
        await db.run(partial(_say_lane_changed, queue=queue))
        retired += 1
        log.info(
            "lane.dev_retired",
            worker_id=worker_id,
            queue=queue,
            release_id=lanes[queue].release_id,
            last_seen=lanes[queue].last_seen.isoformat(),
            idle_after_s=idle_after_s,
        )
    rotation.done("dev-retire", picked[-1])
    return retired


async def _clean(conn: Connection, store: Store, queues: list[str]) -> list[tuple[str, str]] | None:
    """Clean one batch of queues under the cleanup lock; None when another worker holds it."""
    if not await conn.fetchval("select pg_try_advisory_xact_lock($1)", _MAINTENANCE_LOCK_KEY):
        return None
    failed: list[tuple[str, str]] = []
    for queue in queues:
        try:
            # A savepoint per queue: a broken queue's error leaves the others' cleanup.
            async with conn.transaction():
                # Deletes at most 1,000 of each per call (lane-worker's own limit).
                tasks, events = await store.lanes.clean_own(conn, queue=queue)
                if tasks or events:
                    log.info("maintenance.cleaned", queue=queue, tasks=tasks, events=events)
        except Exception as exc:
            if is_transient(exc):
                raise
            if await engine.queue_exists(conn, queue):
                failed.append((queue, repr(exc)))
            # else `lanes prune` dropped it since the list was read: nothing to clean.
    return failed


@dataclass
class _Settled:
    """What one reconcile group found: failed queues, dropped ones, ones with more to settle."""

    failed: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    more: list[str] = field(default_factory=list)


async def reconcile_lanes(
    db: Database,
    store: Store,
    registry: list[MaintainedLane],
    *,
    worker_id: str,
    metrics: Metrics | None = None,
) -> None:
    """Reconcile the queue of each lane in ``registry`` (maintenance's second step)."""
    ready: list[str] = []
    for lane in registry:
        if lane.engine_queue:
            ready.append(lane.queue)
            continue
        # Left by a `lanes retire` of an older build (usually a mistyped release
        # id): there are no engine tables, so nothing can end there.
        command = "retire" if lane.status == LaneStatus.RETIRED else "activate"
        release_id = lane.release_id or lane.queue
        _queue_failed(
            metrics,
            lane.queue,
            worker_id,
            "reconcile",
            "the lane has no engine queue",
            remedy=f"`lane-worker lanes {command} {release_id}` creates it",
        )
    for group in _batches(ready, RECONCILE_GROUP):
        outcome = await db.transaction(
            lambda c, g=group: _settle_group(c, store, g, worker_id)  # type: ignore[misc]
        )
        for queue, error in outcome.failed:
            _queue_failed(metrics, queue, worker_id, "reconcile", error)
        for queue in outcome.dropped:
            # `lanes prune` dropped the queue since the registry was read: its
            # runs were all settled, so there is nothing to reconcile.
            log.info("maintenance.queue_dropped", queue=queue, worker_id=worker_id)
        for queue in outcome.more:
            # A mass lease expiry: the rest of this queue's batches, one transaction each.
            try:
                await reconcile_queue(db, store, queue, worker_id=worker_id)
            except Exception as exc:
                if is_transient(exc):
                    raise
                _queue_failed(metrics, queue, worker_id, "reconcile", repr(exc))


async def _settle_group(
    conn: Connection, store: Store, queues: list[str], worker_id: str
) -> _Settled:
    outcome = _Settled()
    for queue in queues:
        try:
            async with conn.transaction():  # a savepoint: one queue's error is its own
                found, settled = await settle_batch(conn, store, queue, worker_id=worker_id)
        except asyncpg.UndefinedTableError as exc:
            if await engine.queue_exists(conn, queue):
                outcome.failed.append((queue, repr(exc)))
            else:
                outcome.dropped.append(queue)
            continue
        except Exception as exc:
            if is_transient(exc):
                raise
            outcome.failed.append((queue, repr(exc)))
            continue
        if found == RECONCILE_BATCH and settled:
            outcome.more.append(queue)
    return outcome


def _queue_failed(
    metrics: Metrics | None, queue: str, worker_id: str, step: str, error: str, **extra: str
) -> None:
    if metrics is not None:
        metrics.maintenance_errors.labels(queue=queue).inc()
    log.error(
        "maintenance.queue_failed",
        queue=queue,
        worker_id=worker_id,
        step=step,
        error=error,
        **extra,
    )
