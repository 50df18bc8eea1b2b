"""The drain report: every lane, what it holds, and whether its machines may stop.

Read in one repeatable-read transaction, so the counts, the verdict and the
blockers describe one moment. Only open runs are read (the store's partial
indexes), so a store with millions of finished runs answers as fast as an
empty one. Beside the runs it carries what else an operator reads per lane:
undelivered ledger facts, sandbox cleanups, the release registry's role and
machines, and the scaler's last word. The value is ``lane_view.py``'s, the
blockers and remedies ``blockers.py``'s, the text ``lanes_text.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from worker import lane_kinds
from worker.db.pool import Connection
from worker.db.store import Store
from worker.db.store.rows import (
    AdoptedCount,
    CleanupCount,
    DeliveryCount,
    Deployment,
    OpenRun,
    ReportLane,
    ReportRuns,
    ScalerState,
)
from worker.masking import mask_response
from worker.ops.blockers import LaneTally, blockers, lane_status
from worker.ops.lane_view import PARKED, LaneView
from worker.ops.workers import worker_json

# Open runs are read for at most this many lanes (those a listing shows in full).
OPEN_RUN_LANES = 200
# A scaler beats every few seconds; one silent this long is not active (the report's
# word on a release and `releases deploy --wait` both go by it).
SCALER_STALE_S = 20.0


def machines_wanted(desired: int, said: dict[str, Any] | None) -> int:
    """How many machines a release should run now: the active scaler's target (0 once its
    lane is drained), else its deployed count. The lanes page and `releases` both count
    with it (issue 31: the page showed a retired release's deployed count)."""
    target = (said or {}).get("target")
    return target if isinstance(target, int) and not isinstance(target, bool) else desired


def _registry_fields(d: Deployment | None, scaler: ScalerState | None) -> dict[str, Any]:
    if d is None:
        return {}
    said = None
    seen: dict[str, Any] = {}
    if scaler is None or scaler.age_s >= SCALER_STALE_S:
        said = "no active scaler"
    else:
        seen = scaler.releases.get(d.release_id) or {}
        parts = [*(seen.get("actions") or [])]
        for key in ("error", "bootRefused"):
            if seen.get(key):
                parts.append(str(seen[key]))
        said = "; ".join(parts) or f"{seen.get('running', 0)} of {seen.get('target', 0)} running"
        said = mask_response(said, ())  # a credential an older scaler kept is not shown
    return {
        "role": d.role,
        "machines_desired": machines_wanted(d.desired, seen),
        "machines_live": len(d.live_machines),
        "scaler": said,
    }


def _age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round((now - then).total_seconds(), 3)


async def read_report(
    conn: Connection, store: Store, *, include_pruned: bool = False, open_runs: int = 0
) -> list[LaneView]:
    """Read every lane's report in one consistent snapshot.

    A pruned lane that no open run names is left out unless ``include_pruned``.
    With ``open_runs``, each lane also carries that many of its newest open runs.
    """
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        now: datetime = await conn.fetchval("select now()")
        lanes = await store.report.lanes(conn)
        runs = await store.report.runs(conn)
        adopted = await store.report.adopted(conn)
        deliveries = {d.queue: d for d in await store.report.deliveries(conn)}
        cleanups = {c.queue: c for c in await store.sandboxes.counts(conn)}
        deployed = {d.queue: d for d in await store.registry.deployments(conn)}
        scaler = await store.registry.scaler_state(conn)
        views = _views(
            now,
            lanes=lanes,
            runs=runs,
            adopted=adopted,
            deliveries=deliveries,
            cleanups=cleanups,
            deployed=deployed,
            scaler=scaler,
            include_pruned=include_pruned,
        )
        # Drained lanes are left out: their number grows with every deploy, and the read
        # runs inside one transaction; `lanes prune` names their busy queues.
        active = [v.queue for v in views if v.status != "drained"]
        foreign = await _foreign_tasks(conn, store, active)
        views = [
            replace(v, foreign_tasks=foreign[v.queue]) if v.queue in foreign else v for v in views
        ]
        if open_runs <= 0:
            return views
        # Of a thousand lanes only the few a page shows in full need their open runs.
        wanted = [v.queue for v in collapsed(views, OPEN_RUN_LANES)[0] if v.counts_open][
            :OPEN_RUN_LANES
        ]
        listed = await _open_runs(conn, store, wanted, open_runs)
    return [replace(v, open_runs=tuple(listed[v.queue])) if v.queue in listed else v for v in views]


def collapsed(views: list[LaneView], keep: int) -> tuple[list[LaneView], list[LaneView]]:
    """Split ``views`` into the lanes a bounded listing shows and the quiet ones it only counts.

    Up to ``keep`` lanes, every lane is shown.
    """
    if len(views) <= keep:
        return list(views), []
    return [v for v in views if not v.quiet], [v for v in views if v.quiet]


def _views(
    now: datetime,
    lanes: Sequence[ReportLane],
    runs: Sequence[ReportRuns],
    adopted: Sequence[AdoptedCount],
    deliveries: dict[str, DeliveryCount],
    cleanups: dict[str, CleanupCount],
    deployed: dict[str, Deployment],
    scaler: ScalerState | None,
    *,
    include_pruned: bool,
) -> list[LaneView]:
    tallies: dict[str, LaneTally] = {}
    for counted in runs:
        tallies.setdefault(counted.lane, LaneTally()).add(counted)
    adopted_by: dict[str, dict[str, int]] = {}
    for pair in adopted:
        adopted_by.setdefault(pair.queue, {})[pair.adopted_queue] = pair.runs
    names = {row.queue: row.release_id or row.queue for row in lanes}
    registered = {row.queue: row for row in lanes if include_pruned or not row.hidden}
    hidden = {row.queue for row in lanes if row.hidden}
    views = []
    # Registered lanes in registration order, then lanes only open runs name, then
    # releases the registry deployed (current or superseded) whose lane no worker has
    # registered yet: they claim as soon as one boots, and an operator must see a
    # deploy whose machines have not come up (or cannot).
    unregistered = sorted(set(tallies) - set(registered))
    awaited = [
        d.queue
        for d in deployed.values()
        if d.role in ("current", "previous", "candidate")
        and d.queue not in registered
        and d.queue not in tallies
        and (include_pruned or d.queue not in hidden)
    ]
    for queue in [*registered, *unregistered, *awaited]:
        row = registered.get(queue)
        tally = tallies.get(queue, LaneTally())
        if row is not None and row.release_id:
            release = row.release_id  # as deployed (the store's lane_release_id)
        else:
            d = deployed.get(queue)
            release = tally.release_id or (d.release_id if d is not None else queue)
        workers = tuple(worker_json(w, now) for w in row.workers) if row is not None else ()
        status = "claiming" if queue in awaited else lane_status(row.status if row else None, tally)
        c = tally.counts
        views.append(
            LaneView(
                release_id=release,
                queue=queue,
                status=status,
                live_workers=len(workers),
                queued=c["fresh"] + c["handedBack"],
                running=c["inFlight"] + c["retrying"],
                waiting=c["parkedSleep"] + c["parkedEvent"],
                adoptable=sum(c[b] for b in PARKED) - tally.own.get("parkedNotAdoptable", (0,))[0]
                if status in ("draining", "drained")
                else 0,
                release_ids=tuple(row.release_ids) if row is not None else (),
                counts={**c, "deferred": tally.deferred},
                oldest_wait_s=_age_s(now, tally.oldest_wait),
                oldest_deferral_s=_age_s(now, tally.oldest_deferral),
                adopted_by=adopted_by.get(queue, {}),
                workers=workers,
                blocked_by=blockers(
                    status,
                    release,
                    workers,
                    tally,
                    names,
                    current=getattr(deployed.get(queue), "role", None) == "current",
                    now=now,
                    # Any spelling dev (the store's lane_is_dev): a worktree's, or mixed.
                    dev=lane_kinds.lane_is_dev(
                        row.release_ids if row and row.release_ids else (release,)
                    ),
                ),
                pruned=row is not None and row.pruned_at is not None,
                facts_pending=deliveries[queue].pending if queue in deliveries else 0,
                facts_failed=deliveries[queue].failed if queue in deliveries else 0,
                cleanups_pending=cleanups[queue].pending if queue in cleanups else 0,
                cleanups_failed=tuple(cleanups[queue].failed_sandboxes)
                if queue in cleanups
                else (),
                **_registry_fields(deployed.get(queue), scaler),
                as_of=now,
                last_seen=row.last_seen if row is not None else None,
                draining_s=_age_s(now, row.retired_at) or 0.0
                if status == "draining" and row is not None
                else 0.0,
            )
        )
    return views


FOREIGN_BATCH = 50  # queues per statement: its locks on engine tables end with it


async def _foreign_tasks(conn: Connection, store: Store, queues: list[str]) -> dict[str, int]:
    """Unfinished tasks lane-worker did not create, per queue that has any."""
    found: dict[str, int] = {}
    for at in range(0, len(queues), FOREIGN_BATCH):
        batch = queues[at : at + FOREIGN_BATCH]
        found.update(await store.report.foreign_tasks(conn, queues=batch))
    return found


async def _open_runs(
    conn: Connection, store: Store, lanes: list[str], limit: int
) -> dict[str, list[OpenRun]]:
    """The newest ``limit`` open runs of each of ``lanes`` that has any, by lane."""
    if not lanes:
        return {}
    found: dict[str, list[OpenRun]] = {}
    for run in await store.report.open_runs(conn, lanes=sorted(lanes), limit=limit):
        found.setdefault(run.lane, []).append(run)
    return found
