"""The drain report: every lane, what it holds, and whether its machines may stop.

Read in one repeatable-read transaction, so the counts, the verdict and the
blockers describe one moment. Only open runs are read (the store's partial
indexes), so a store with millions of finished runs answers as fast as an
empty one. Beside the runs it carries what else an operator reads per lane:
undelivered ledger facts, sandbox cleanups, the release registry's role and
machines, and the scaler's last word.

(About 540 lines: one view, its JSON, its blockers and their remedies, and the
one read that fills them; the remedies' sentences are most of it.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

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
from worker.ops.workers import (
    CLAIMING,
    NO_VERSION,
    NOT_CLAIMING,
    UNKNOWN,
    UNKNOWN_HEALTH,
    claim_health,
    not_claiming_lines,
    stuck_remedy,
    version_of,
    why_not,
    with_health,
    worker_json,
)

BUCKETS = ("inFlight", "fresh", "retrying", "handedBack", "parkedSleep", "parkedEvent")
PARKED = ("parkedSleep", "parkedEvent")
RUN_IDS_SHOWN = 20
# Open runs are read for at most this many lanes (those a listing shows in full).
OPEN_RUN_LANES = 200
# A fresh run a worker that claims takes within its poll: one this old on a lane whose
# live workers cannot say whether they claim (builds before 0.2.0) is worth a word.
UNKNOWN_QUEUED_S = 60.0
# The blocker that says so: shown on a claiming lane too (the others of a claiming
# lane are its own workers' business).
UNKNOWN_BLOCKER = "claimHealthUnknown"


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
        if self.role in ("current", "previous"):
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


_SHOWN_SANDBOXES = 50
# A scaler beats every few seconds; one silent this long is not active (the report's
# word on a release and `releases deploy --wait` both go by it).
SCALER_STALE_S = 20.0


def _registry_fields(d: Deployment | None, scaler: ScalerState | None) -> dict[str, Any]:
    if d is None:
        return {}
    said = None
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
    return {"role": d.role, "machines_desired": d.desired,
            "machines_live": len(d.live_machines), "scaler": said}  # fmt: skip


def _age_s(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else round((now - then).total_seconds(), 3)


@dataclass
class _Tally:
    """What the report's run rows say about one lane."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0))
    deferred: int = 0
    oldest_wait: datetime | None = None
    oldest_deferral: datetime | None = None
    # reason -> (count, the oldest (created_at, run id) pairs, plays)
    own: dict[str, tuple[int, list[tuple[datetime, str]], list[str]]] = field(default_factory=dict)
    release_id: str | None = None  # as its runs were stamped: for a lane no worker registered
    # Parked runs it adopted whose stamped lane claims again: stamped queue -> runs.
    claiming_stamps: dict[str, int] = field(default_factory=dict)

    def add(self, row: ReportRuns) -> None:
        bucket = row.bucket
        if row.needs_own and row.claiming_stamp is not None:
            stamp = row.claiming_stamp
            self.claiming_stamps[stamp] = self.claiming_stamps.get(stamp, 0) + row.runs
        self.release_id = self.release_id or row.release_id
        self.counts[bucket] += row.runs
        self.deferred += row.deferred
        if bucket in PARKED:
            self.oldest_wait = _earliest(self.oldest_wait, row.oldest_update)
        self.oldest_deferral = _earliest(self.oldest_deferral, row.oldest_deferral)
        if row.needs_own:
            reason = "parkedNotAdoptable" if bucket in PARKED else bucket
            count, oldest, plays = self.own.get(reason, (0, [], []))
            # Two buckets can feed one reason (sleeps and waits): keep the oldest overall.
            pairs = zip(row.run_created, (str(i) for i in row.run_ids), strict=True)
            oldest = sorted([*oldest, *pairs])[:RUN_IDS_SHOWN]
            self.own[reason] = (count + row.runs, oldest, sorted({*plays, *row.plays}))


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _stamps_claim(release: str, count: int, stamps: dict[str, str]) -> str:
    """The cause and remedy of adopted parked runs whose stamped lanes claim again."""
    names = ", ".join(sorted(stamps.values()))
    return (
        f"{count} of them {release} adopted from {names}, whose lane claims again (`lanes "
        "activate` after the adoption), so no newer release may adopt them from it: end them "
        "(lane-worker runs fail RUN_ID --reason TEXT) and run them again on a claiming release "
        f"(lane-worker runs retry RUN_ID), or keep {release}'s machines running: its workers "
        "resume them when they wake, as the lane drains"
    )


def _remedy(reason: str, release: str, live: int, plays: list[str], tally: _Tally,
            names: dict[str, str], served: frozenset[str] = frozenset(),
            stuck: Sequence[dict[str, Any]] = ()) -> str:  # fmt: skip
    wait = f"wait for them (lane-worker lanes wait {release})"
    if reason == "claiming":
        return f"the lane still claims new runs: run `lane-worker lanes retire {release}` first"
    if reason == "current":
        return (
            f"{release} is the current release (lane-worker releases): it claims by design; "
            "deploy a newer release to retire it"
        )
    if reason == "parkedNotAdoptable":
        said = []
        stamped = sum(tally.claiming_stamps.values())
        if stamped:
            stamps = {q: names.get(q, q) for q in tally.claiming_stamps}
            said.append(_stamps_claim(release, stamped, stamps))
        if tally.own[reason][0] > stamped:
            rest = "the others: " if stamped else ""
            said.append(
                f"{rest}no live worker of a newer claiming release registers play "
                f"{', '.join(plays)}: start one that does, or keep {release}'s workers running "
                "to finish them"
            )
        return "; ".join(said)
    unserved = [p for p in plays if p not in served]
    if live and unserved and reason != "inFlight":
        # Machines of one release with different apps (a rollout): a play none
        # of the live ones registers waits for one that does.
        names_ = ", ".join(unserved)
        others = (
            f"; the others: {release}'s {live} live worker(s) will run them"
            if len(unserved) < len(plays)
            else ""
        )
        return (
            f"runs of play {names_}: no live worker of {release} registers it (they register: "
            f"{', '.join(sorted(served)) or 'none'}): start a machine of {release} whose app "
            "has it, or "
            + (
                f"move them to a claiming release (lane-worker lanes move {release} --to RELEASE)"
                if reason == "fresh"
                else "end them (lane-worker runs fail RUN_ID --reason TEXT) and run them again on "
                "a claiming release (lane-worker runs retry RUN_ID)"
            )
            + others
        )
    if live:
        what = "running" if reason == "inFlight" else "will run"
        return f"{release}'s {live} live worker(s) {what} them: {wait}"
    start = (
        stuck_remedy(release, stuck)
        if stuck
        else f"no live worker of {release}: start one of its machines (a draining lane's "
        "workers may boot)"
    )
    if reason == "fresh":
        # Never started: no step of them ran on this release's code.
        return (
            f"{start}, or move them to a claiming release "
            f"(lane-worker lanes move {release} --to RELEASE)"
        )
    expired = "; each is retried on it when its lease expires" if reason == "inFlight" else ""
    return (
        f"{start}{expired}; or end them (lane-worker runs fail RUN_ID --reason TEXT) and "
        "run them again on a claiming release (lane-worker runs retry RUN_ID)"
    )


def _status(registered: str | None, tally: _Tally) -> str:
    if registered is None:
        return "unregistered"
    if registered == "claiming":
        return "claiming"
    return "draining" if tally.own else "drained"


def _blockers(
    status: str,
    release: str,
    workers: Sequence[dict[str, Any]],
    tally: _Tally,
    names: dict[str, str],
    current: bool = False,
    now: datetime | None = None,
) -> tuple[Blocker, ...]:
    if status == "drained":
        return ()
    # Workers whose claims keep failing run nothing: they count as not there.
    stuck = with_health(workers, NOT_CLAIMING)
    live = len(workers) - len(stuck)
    served = frozenset(p for w in workers for p in w["plays"])
    found = []
    if status == "claiming" and (live or not tally.own):
        # Never "retire it" for the registry's current release: that would stop its lane.
        # A claiming lane with work and no live worker is stranded instead: its runs'
        # blockers below say what to do.
        why = "current" if current else "claiming"
        found.append(Blocker("claiming", 0, _remedy(why, release, live, [], tally, names)))
    order = [*BUCKETS, "parkedNotAdoptable"]
    for reason in sorted(tally.own, key=order.index):
        count, oldest, plays = tally.own[reason]
        if status == "claiming" and reason == "parkedNotAdoptable":
            continue  # a claiming lane's parked runs are its own to resume: not a blocker
        ids = tuple(run_id for _, run_id in oldest)
        remedy = _remedy(reason, release, live, plays, tally, names, served, stuck)
        found.append(Blocker(reason, count, remedy, ids))
    unknown = _unknown_blocker(release, workers, tally, now)
    return tuple(found) + ((unknown,) if unknown is not None else ())


def _unknown_blocker(
    release: str, workers: Sequence[dict[str, Any]], tally: _Tally, now: datetime | None
) -> Blocker | None:
    """Fresh runs waiting long on a lane none of whose live workers is known to claim.

    Its workers (builds before 0.2.0) report no claim health: their claims may fail
    for good (issue 29: ``unknown claim mode`` after a newer build's install), and
    only their own logs would say so.
    """
    unknown = with_health(workers, UNKNOWN)
    if now is None or not unknown or with_health(workers, CLAIMING):
        return None
    count, oldest, _ = tally.own.get("fresh", (0, [], []))
    if not oldest:
        return None
    queued_s = (now - oldest[0][0]).total_seconds()
    if queued_s < UNKNOWN_QUEUED_S:
        return None
    return Blocker(
        UNKNOWN_BLOCKER,
        count,
        f"runs queued for {queued_s:.0f} s; its {len(unknown)} live worker(s)' build "
        f"({NO_VERSION}) cannot say whether they claim: look for loop.claim_failed in their "
        "logs (a newer build's install can break an older build's claims), upgrade them to "
        f"0.2.0 or later, or move the runs to a claiming release (lane-worker lanes move "
        f"{release} --to RELEASE)",
        tuple(run_id for _, run_id in oldest),
    )


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
            now, lanes, runs, adopted, deliveries, cleanups, deployed, scaler,
            include_pruned=include_pruned,
        )  # fmt: skip
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
    tallies: dict[str, _Tally] = {}
    for counted in runs:
        tallies.setdefault(counted.lane, _Tally()).add(counted)
    adopted_by: dict[str, dict[str, int]] = {}
    for pair in adopted:
        adopted_by.setdefault(pair.queue, {})[pair.adopted_queue] = pair.runs
    names = {row.queue: (row.release_ids or [row.queue])[0] for row in lanes}
    registered = {row.queue: row for row in lanes if include_pruned or not row.hidden}
    hidden = {row.queue for row in lanes if row.hidden}
    views = []
    # Registered lanes in registration order, then lanes only open runs name, then
    # releases the registry deployed (current or superseded) whose lane no worker has
    # registered yet: they claim as soon as one boots, and an operator must see a
    # deploy whose machines have not come up (or cannot).
    unregistered = sorted(set(tallies) - set(registered))
    awaited = [d.queue for d in deployed.values() if d.role in ("current", "previous")
               and d.queue not in registered and d.queue not in tallies
               and (include_pruned or d.queue not in hidden)]  # fmt: skip
    for queue in [*registered, *unregistered, *awaited]:
        row = registered.get(queue)
        tally = tallies.get(queue, _Tally())
        if row is not None and row.release_ids:
            release = row.release_ids[0]
        else:
            d = deployed.get(queue)
            release = tally.release_id or (d.release_id if d is not None else queue)
        workers = tuple(worker_json(w, now) for w in row.workers) if row is not None else ()
        status = "claiming" if queue in awaited else _status(row.status if row else None, tally)
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
                blocked_by=_blockers(
                    status,
                    release,
                    workers,
                    tally,
                    names,
                    current=getattr(deployed.get(queue), "role", None) == "current",
                    now=now,
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


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Render rows of text cells as columns padded to their widest cell (the first: a header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def lanes_table(views: list[LaneView]) -> list[str]:
    """Render lanes as aligned text lines, then what blocks each lane that is not claiming."""
    if not views:
        return ["no lanes registered (a worker registers its lane at boot)."]
    header = ("RELEASE", "QUEUE", "STATUS", "LIVE", "IN-FLIGHT", "FRESH", "RETRYING",
              "HANDED-BACK", "PARKED", "DEFERRED", "SAFE-TO-STOP")  # fmt: skip
    rows = [header]
    for v in views:
        c = v.counts
        rows.append((
            v.release_id, v.queue, v.status, str(v.live_workers), str(c["inFlight"]),
            str(c["fresh"]), str(c["retrying"]), str(c["handedBack"]),
            str(c["parkedSleep"] + c["parkedEvent"]), str(c["deferred"]), _yes(v.safe_to_stop),
        ))  # fmt: skip
    lines = aligned(rows)
    for v in views:
        lines += not_claiming_lines(v.release_id, v.workers)
        if v.unknown_workers and not v.claiming_workers and v.status != "drained":
            lines.append(f"{v.release_id}: {unknown_line(v)}")
        if v.status != "claiming" or v.stranded:
            lines += [f"{v.release_id}: {line}" for line in _blocker_lines(v, ids=False)]
        else:  # a claiming lane's own workers run what it holds, unless nobody can tell
            lines += [f"{v.release_id}: {line}" for line in _listed(shown_blockers(v), ids=False)]
        if v.foreign_tasks:
            lines.append(f"{v.release_id}: {foreign_line(v)}")
    return lines


def foreign_line(view: LaneView) -> str:
    """Say what the lane's foreign tasks are and that they are left alone."""
    return (
        f"{view.foreign_tasks} unfinished task(s) on {view.queue} were not created by "
        "lane-worker (another system shares this queue): left for their owner, never run "
        "or cancelled, never counted above."
    )


def unknown_line(view: LaneView) -> str:
    """Say that none of the lane's live workers is known to claim, and why."""
    return (
        f"{view.unknown_workers} of its {view.live_workers} live worker(s) run lane-worker "
        f"{NO_VERSION}, which does not report whether it claims; none is known to claim"
    )


def shown_blockers(view: LaneView) -> tuple[Blocker, ...]:
    """The blockers a listing shows: a claiming lane's only when stranded, or the unknown one."""
    if view.status != "claiming" or view.stranded:
        return view.blocked_by
    return tuple(b for b in view.blocked_by if b.reason == UNKNOWN_BLOCKER)


def _blocker_lines(view: LaneView, *, ids: bool) -> list[str]:
    if not view.blocked_by:
        if view.pruned:
            return ["safe to stop its machines (drained; pruned: its engine queue is gone)."]
        return ["safe to stop its machines (drained)."] if view.safe_to_stop else []
    return _listed(view.blocked_by, ids=ids)


def _listed(blockers: Sequence[Blocker], *, ids: bool) -> list[str]:
    lines = []
    for b in blockers:
        lines.append(f"blocked by {b.reason} ({b.count}): {b.remedy}")
        if ids and b.run_ids:
            more = f" (first {len(b.run_ids)} of {b.count})" if b.count > len(b.run_ids) else ""
            lines.append(f"  runs{more}: {' '.join(b.run_ids)}")
    return lines


def lane_detail(view: LaneView) -> list[str]:
    """Render one lane in full (``lane-worker lanes show``)."""
    c = view.counts
    rows = [
        ("release", view.release_id),
        ("queue", view.queue),
        ("status", view.status + (" (pruned)" if view.pruned else "")),
        ("safe to stop", _yes(view.safe_to_stop)),
        ("live workers", str(view.live_workers)),
        *[(f"  {w['workerId']}", f"build {version_of(w)}; plays: "
           + (", ".join(w["plays"]) or "(none)")
           + _health_said(w))
          for w in view.workers],
        ("in flight", str(c["inFlight"])),
        ("fresh", str(c["fresh"])),
        ("retrying", str(c["retrying"])),
        ("handed back", str(c["handedBack"])),
        ("parked (sleep)", str(c["parkedSleep"])),
        ("parked (event)", str(c["parkedEvent"])),
        ("oldest wait", _seconds(view.oldest_wait_s)),
        ("deferred", str(c["deferred"])),
        ("oldest deferral", _seconds(view.oldest_deferral_s)),
        ("adopted by", ", ".join(f"{q}: {n}" for q, n in view.adopted_by.items()) or "(none)"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    foreign = [foreign_line(view)] if view.foreign_tasks else []
    return [f"{n.ljust(width)}  {v}" for n, v in rows] + _blocker_lines(view, ids=True) + foreign


def _health_said(worker: dict[str, Any]) -> str:
    health = claim_health(worker)
    if health == NOT_CLAIMING:
        return f"; NOT CLAIMING: {why_not(worker)}"
    return f"; {UNKNOWN_HEALTH}" if health == UNKNOWN else ""


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"
