"""The deploy timeline (``/deploys`` on the health port): each release's life, newest first.

From what the store already records, nothing added: the release registry's
deploy record and its events (deployed, rolled back, retired, each machine the
scaler created, replaced or destroyed, with who and when), the lane's own row
(first registered, retired, pruned), the machines its live workers report, and
the drain report's word now (claiming, draining, drained; runs of it that a
newer release adopted). The moment a lane became drained is not stored: the
page says it is drained now. Every value is escaped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from worker.daemon.runs_page import shell, when
from worker.db.store.page import TimelineRelease
from worker.db.store.rows import DeploymentEvent
from worker.ops.lane_view import LaneView

# The newest releases listed, and the newest registry events read for them.
RELEASES = 30
EVENTS = 1000
WORDS = {
    "deployed": "deployed: became current",
    "rolled_back": "rolled back to: became current again",
    "retired": "retired (superseded): its lane drains",
    "machine_created": "machine created",
    "machine_destroy": "machine destroyed",
    "machine_replace": "machine replaced",
    "boot_failed": "its machines cannot boot: the same exit (78 or 2) twice in a row",
    # A gated deploy (store migration 0050): the gate decides whether it becomes current.
    "gate_passed": "gate passed: became current",
    "gate_failed": "gate failed: never current, retired (its machines go)",
    "gate_abandoned": "gate abandoned (a later deploy): never current, retired",
}


@dataclass(frozen=True)
class Moment:
    """One line of a release's timeline."""

    at: datetime | None
    kind: str
    said: str
    actor: str = ""


def _event_text(event: DeploymentEvent) -> str:
    words = WORDS.get(event.action, event.action.replace("_", " "))
    detail: dict[str, Any] = dict(event.detail) if isinstance(event.detail, dict) else {}
    bits = []
    gate = detail.pop("gate", None)
    if isinstance(gate, list) and event.action == "deployed":
        words = "deployed as the candidate: current once its gate passes"
        plays = ", ".join(str(g.get("play")) for g in gate if isinstance(g, dict))
        bits.append(f"gated by {plays} within {detail.pop('gateTimeoutSeconds', None)} s")
        current = detail.pop("current", None) or []
        bits.append("current meanwhile: " + (", ".join(map(str, current)) or "none"))
    if event.action == "gate_failed":
        # Its error names the run (gate.py): said once.
        detail.pop("run", None)
        bits.append(str(detail.pop("error", None)))
    if detail.get("machine"):
        bits.append(f"machine {detail['machine']}")
    if event.action in ("deployed", "rolled_back"):
        bits.append(f"image {detail.get('image')}, {detail.get('desired')} machine(s)")
        if detail.get("previous"):
            bits.append("superseding " + ", ".join(map(str, detail["previous"])))
    if detail.get("reason"):
        bits.append(str(detail["reason"]))
    forced = detail.get("forcedThroughHold")
    if isinstance(forced, dict):
        why = f": {forced['reason']}" if forced.get("reason") else ""
        bits.append(f"FORCED through the hold of {forced.get('heldBy')}{why}")
    shown = {k: v for k, v in detail.items() if k not in ("machine", "image", "desired", "previous",
                                                          "queue", "reason",
                                                          "forcedThroughHold")}  # fmt: skip
    if isinstance(shown.get("exitCode"), int):
        bits.append(f"exit code {shown.pop('exitCode')}")
    # What no word above says, as it was recorded; a null says nothing.
    shown = {k: v for k, v in shown.items() if v is not None}
    if shown:
        bits.append(json.dumps(shown, default=str, sort_keys=True)[:300])
    return words + (f" ({'; '.join(bits)})" if bits else "")


def moments(release: TimelineRelease, events: list[DeploymentEvent]) -> list[Moment]:
    """The release's timeline, oldest first: its lane's rows and the registry's events.

    ``events`` holds its own events and those of the deploys that superseded it.
    """
    said = []
    for e in events:
        if e.release_id == release.release_id:
            said.append(Moment(e.at, e.action, _event_text(e), e.actor))
        else:  # a newer deploy (or a rollback) made it previous
            text = f"superseded by {e.release_id}: previous, claims until that one is ready"
            said.append(Moment(e.at, "superseded", text, e.actor))
    if release.registered_at is not None:
        said.append(Moment(release.registered_at, "registered", "lane registered by a worker"))
    if release.lane_retired_at is not None and not any(e.action == "retired" for e in events):
        said.append(Moment(release.lane_retired_at, "lane_retired", "lane retired"))
    if release.pruned_at is not None:
        said.append(Moment(release.pruned_at, "pruned", "pruned: its engine queue dropped"))
    return sorted(said, key=lambda m: (m.at is None, m.at or datetime.min))


def _now_line(release: TimelineRelease, view: LaneView | None) -> str:
    if view is None:
        return '<span data-field="state">no lane in the report</span>'
    state = escape(view.status)
    since = ""
    if view.status == "draining" and view.draining_s:
        since = f" for {int(view.draining_s)} s"
    adopted = ""
    if view.adopted_by:
        parts = ", ".join(f"{escape(r)}: {n}" for r, n in sorted(view.adopted_by.items()))
        adopted = f'; open runs adopted by <span data-field="adoptedBy">{parts}</span>'
    return (
        f'now <span class="{state}" data-field="state">{state}</span>{since}'
        f"; {view.live_workers} live worker(s){adopted}"
    )


def _release(release: TimelineRelease, events: list[DeploymentEvent], view: LaneView | None) -> str:
    role = (
        f' <span class="badge" data-field="role">{escape(release.role)}</span>'
        if release.role
        else ' <span class="note">(not in the registry)</span>'
    )
    machines = ", ".join(f"<code>{escape(m)}</code>" for m in release.machines) or "none"
    image = (
        f"image <code>{escape(release.image or '')}</code>, {release.desired} machine(s) desired; "
        if release.role
        else ""
    )
    items = "".join(
        f'<li data-moment="{escape(m.kind)}"><span class="note">{escape(when(m.at))}</span> '
        f"{escape(m.said)}"
        f"{f' <span class=note>by {escape(m.actor)}</span>' if m.actor else ''}</li>"
        for m in moments(release, events)
    )
    return (
        f'<section data-release="{escape(release.release_id)}">'
        f"<h2>{escape(release.release_id)}{role} <code>{escape(release.queue)}</code></h2>"
        f'<p class="note">{image}live machines: <span data-field="machines">{machines}</span>; '
        f"{_now_line(release, view)}.</p>{_boot_failed(release)}"
        f'<ul data-field="timeline">{items}</ul></section>'
    )


def _boot_failed(release: TimelineRelease) -> str:
    """The scaler's record that this deploy's machines fail to boot (store 0047), if any."""
    failed = release.boot_failed
    if not isinstance(failed, dict):
        return ""
    return (
        '<p class="refused" data-field="bootFailed">its machines fail to boot: '
        f"{escape(str(failed.get('reason')))}; logs: <code>{escape(str(failed.get('logs')))}"
        "</code>. Submits to its lane say it is not served until a machine boots.</p>"
    )


def render(
    releases: list[TimelineRelease],
    events: list[DeploymentEvent],
    views: list[LaneView] | None,
) -> str:
    """The whole timeline page; ``views`` (the drain report) None while it cannot be read."""
    by_release: dict[str, list[DeploymentEvent]] = {}
    for event in events:
        by_release.setdefault(event.release_id, []).append(event)
        previous = event.detail.get("previous") if isinstance(event.detail, dict) else None
        if event.action in ("deployed", "rolled_back") and isinstance(previous, list):
            for superseded in previous:
                by_release.setdefault(str(superseded), []).append(event)
    by_queue = {v.queue: v for v in views or []}
    sections = (
        "".join(
            _release(r, by_release.get(r.release_id, []), by_queue.get(r.queue)) for r in releases
        )
        or '<p class="note" data-field="none">no release deployed or registered yet.</p>'
    )
    missing = (
        '<p class="refused" data-field="noReport">The drain report cannot be read right now: '
        "states are missing.</p>"
        if views is None
        else ""
    )
    body = (
        "<h1>deploys</h1>"
        '<p class="note">Each release, newest first: when it was deployed and became '
        "current, superseded and retired, rolled back to, its machines as the scaler made "
        "and removed them, its lane registered, retired and pruned, and where it stands now. "
        "The same records: <code>lane-worker releases</code>, <code>lane-worker lanes</code>. "
        f"The {RELEASES} newest releases.</p>{missing}{sections}"
    )
    return shell("lane-worker deploys", body)
