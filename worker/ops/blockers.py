"""What blocks a lane's stop, and the remedy of each: the drain report's verdicts.

``LaneTally`` sums the report's run rows of one lane; ``blockers`` turns a tally and the
lane's live workers into ``Blocker`` values whose sentences say what to do (most of
this module is those sentences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from worker.db.store.rows import ReportRuns
from worker.ops.lane_view import BUCKETS, PARKED, UNKNOWN_BLOCKER, Blocker
from worker.ops.workers import (
    CLAIMING,
    NO_VERSION,
    NOT_CLAIMING,
    UNKNOWN,
    stuck_remedy,
    with_health,
)

RUN_IDS_SHOWN = 20
# A fresh run a worker that claims takes within its poll: one this old on a lane whose
# live workers cannot say whether they claim (builds before 0.2.0) is worth a word.
UNKNOWN_QUEUED_S = 60.0


@dataclass
class LaneTally:
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


def _move_away(release: str, dev: bool) -> str:
    """Where a lane's runs that never started may go: a release's, to another release;
    a worktree's (dev lane) nowhere: `lanes move` never crosses to a release."""
    if dev:
        return "cancel them (lane-worker cancel RUN_ID): a worktree's runs never go to a release"
    return f"move them to a claiming release (lane-worker lanes move {release} --to RELEASE)"


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


def _remedy(
    reason: str,
    release: str,
    live: int,
    plays: list[str],
    tally: LaneTally,
    names: dict[str, str],
    served: frozenset[str] = frozenset(),
    stuck: Sequence[dict[str, Any]] = (),
    dev: bool = False,
) -> str:
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
                f"{', '.join(plays)} (after a rollback there is no newer one): keep "
                f"{release}'s machines running, its workers resume them as they wake; or "
                "end them (lane-worker runs fail RUN_ID --reason TEXT) and run them again "
                "on the current release (lane-worker runs retry RUN_ID); or deploy a newer "
                "release that registers them"
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
                _move_away(release, dev)
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
        return f"{start}, or {_move_away(release, dev)}"
    expired = "; each is retried on it when its lease expires" if reason == "inFlight" else ""
    return (
        f"{start}{expired}; or end them (lane-worker runs fail RUN_ID --reason TEXT) and "
        "run them again on a claiming release (lane-worker runs retry RUN_ID)"
    )


def lane_status(registered: str | None, tally: LaneTally) -> str:
    if registered is None:
        return "unregistered"
    if registered == "claiming":
        return "claiming"
    return "draining" if tally.own else "drained"


def blockers(
    status: str,
    release: str,
    workers: Sequence[dict[str, Any]],
    tally: LaneTally,
    names: dict[str, str],
    current: bool = False,
    now: datetime | None = None,
    dev: bool = False,
) -> tuple[Blocker, ...]:
    """What blocks the lane's stop; ``dev``: it is a dev lane (any spelling, mixed too)."""
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
        remedy = _remedy(reason, release, live, plays, tally, names, served, stuck, dev)
        found.append(Blocker(reason, count, remedy, ids))
    unknown = _unknown_blocker(release, workers, tally, now, dev)
    return tuple(found) + ((unknown,) if unknown is not None else ())


def _unknown_blocker(
    release: str,
    workers: Sequence[dict[str, Any]],
    tally: LaneTally,
    now: datetime | None,
    dev: bool = False,
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
        f"0.2.0 or later, or {_move_away(release, dev)}",
        tuple(run_id for _, run_id in oldest),
    )
