"""The drain report as text: the ``lanes`` table and ``lanes show``'s detail."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

from worker import lane_kinds
from worker.ops.lane_view import UNKNOWN_BLOCKER, Blocker, LaneView
from worker.ops.workers import (
    NO_VERSION,
    NOT_CLAIMING,
    UNKNOWN,
    UNKNOWN_HEALTH,
    claim_health,
    not_claiming_lines,
    version_of,
    why_not,
)


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
    header = (
        "RELEASE",
        "QUEUE",
        "STATUS",
        "LIVE",
        "IN-FLIGHT",
        "FRESH",
        "RETRYING",
        "HANDED-BACK",
        "PARKED",
        "DEFERRED",
        "SAFE-TO-STOP",
    )
    rows = [header]
    for v in views:
        c = v.counts
        rows.append(
            (
                v.release_id,
                v.queue,
                v.status,
                str(v.live_workers),
                str(c["inFlight"]),
                str(c["fresh"]),
                str(c["retrying"]),
                str(c["handedBack"]),
                str(c["parkedSleep"] + c["parkedEvent"]),
                str(c["deferred"]),
                _yes(v.safe_to_stop),
            )
        )
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
        if v.mixed:
            lines.append(f"{v.release_id}: {mixed_line(v)}")
        if v.idle_dev:
            lines.append(f"{v.release_id}: {idle_dev_line(v)}")
    return lines


def mixed_line(view: LaneView) -> str:
    """Say that a release and a worktree share the lane's queue, and what to do about it."""
    ids = view.release_ids
    releases = ", ".join(repr(i) for i in ids if not lane_kinds.is_dev(i))
    worktrees = ", ".join(repr(i) for i in ids if lane_kinds.is_dev(i))
    return (
        f"mixed lane: release {releases} and worktree {worktrees} both registered {view.queue} "
        "(an older build let them), so it stands apart as a dev lane and new workers of "
        "either kind are refused; give the worktree another DEEPLINE_ABSURD_QUEUE_SUFFIX, "
        "deploy the release under another release id, and end the runs left here "
        "(lane-worker cancel RUN_ID, or runs fail and runs retry)."
    )


def idle_since(view: LaneView) -> str:
    """When a worker of the lane was last seen, in UTC to the minute (``ever``: never)."""
    if view.last_seen is None:
        return "ever"
    return view.last_seen.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def idle_dev_line(view: LaneView) -> str:
    """Say that a dev lane has no worker, since when, and how it goes (or comes back)."""
    since = idle_since(view)
    start = (
        "start its worker again (`lane-worker dev` in its worktree)"
        if view.release_id.lower() == "dev"
        else f"start its worker again (DEEPLINE_ABSURD_QUEUE_SUFFIX={view.release_id[4:]})"
    )
    if view.counts_open:
        return (
            f"idle dev lane: no worker since {since}, {view.counts_open} open run(s) wait "
            f"on it; {start}, or cancel them (`lane-worker cancel RUN_ID`), then "
            f"`lane-worker lanes retire {view.release_id}` and "
            "`lane-worker lanes prune --older-than 0`."
        )
    return (
        f"idle dev lane: no worker since {since}; maintenance retires it once idle past "
        f"LANE_WORKER_DEV_LANE_IDLE_AFTER and prunes it (its worker booting again brings "
        f"it back), or now: `lane-worker lanes retire {view.release_id}` then "
        "`lane-worker lanes prune --older-than 0`."
    )


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
        *[
            (
                f"  {w['workerId']}",
                f"build {version_of(w)}; plays: "
                + (", ".join(w["plays"]) or "(none)")
                + _health_said(w),
            )
            for w in view.workers
        ],
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
    ]
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
