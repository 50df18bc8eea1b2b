"""The lanes page (``/`` on the health port): the drain report as one small HTML page.

For people who would rather look than read JSON: one row per lane with its
status, counts, verdict and blockers, then each lane's newest open runs, each
linked to its run page (``worker/daemon/run_page.py``). No build step, no
script, no external asset; it refreshes itself. Every value is escaped: release
ids, plays and remedies come from the database and the environment.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from html import escape
from typing import Any

from worker.daemon.report_cache import PAGE_OPEN_RUNS
from worker.db.store.rows import OpenRun
from worker.ops.lane_view import BUCKETS, LaneView
from worker.ops.lanes_text import idle_dev_line, idle_since, mixed_line, shown_blockers
from worker.ops.remedies import MAX_LIST, OPEN
from worker.ops.report import collapsed
from worker.ops.workers import (
    NOT_CLAIMING,
    UNKNOWN,
    UNKNOWN_HEALTH,
    claim_health,
    version_of,
    why_not,
)

REFRESH_S = 5
# Past this many lanes, the quiet ones are counted and the rest paged this many to a page.
PAGE_LANES = 25
# The open runs a page lists in all (spread over its lanes), and at least per lane.
OPEN_RUNS_PER_PAGE = 150
MIN_OPEN_RUNS = 5
# /lanes (JSON and text) lists at most this many lanes to a page.
LANES_PER_PAGE = 100
MAX_PAGE = 1_000_000
BAD_PAGE = "page must be a whole number from 1 (?page=2)"
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#222}
h1{font-size:1.2rem;margin:0 0 .2rem}
p.note{color:#666;margin:0 0 1rem}
nav.top a{margin-right:.8rem}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #ddd;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#f4f4f4;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
h2{font-size:1rem;margin:1.2rem 0 .3rem}
.claiming{color:#0b5394}.draining{color:#b45f06}.drained{color:#38761d}
.unregistered{color:#990000}
tr.stranded td{background:#fde8e8}.stranded-note{color:#990000;font-weight:600}
.badge{display:inline-block;margin-left:.4rem;padding:0 .35rem;border-radius:.6rem;
 font-size:11px;background:#0b5394;color:#fff}
.scaler{color:#666;font-size:12px}
.worker{font-size:12px;white-space:nowrap}.not-claiming{color:#990000;font-weight:600;
 white-space:normal}
ul{margin:0;padding-left:1rem}
code{font-size:12px}
pre{font-size:12px;margin:0;white-space:pre-wrap;overflow-wrap:anywhere}
"""
COUNT_COLUMNS = (
    ("inFlight", "in flight"),
    ("fresh", "fresh"),
    ("retrying", "retrying"),
    ("handedBack", "handed back"),
    ("parkedSleep", "parked (sleep)"),
    ("parkedEvent", "parked (event)"),
    ("deferred", "deferred"),
)
BUCKET_WORDS = dict(COUNT_COLUMNS)


# Every page's way to the others (the lanes page, /runs, /deploys, /actions).
NAV = (
    '<nav class="top note" data-field="nav"><a href="/">lanes</a><a href="/runs">runs</a>'
    '<a href="/deploys">deploys</a><a href="/actions">actions</a></nav>'
)


def _row(view: LaneView) -> str:
    counts = "".join(
        f'<td class="n" data-count="{key}">{view.counts.get(key, 0)}</td>'
        for key, _ in COUNT_COLUMNS
    )
    # A claiming lane is not blocked by anything an operator must act on (as
    # `lane-worker lanes` prints it): its own workers run what it holds, unless
    # none of them can say whether it claims and its runs wait long.
    shown = shown_blockers(view)
    blockers = "".join(
        f'<li data-reason="{escape(b.reason)}"><b>{escape(b.reason)}</b> ({b.count}): '
        f"{escape(b.remedy)}{_run_ids(b.run_ids, b.count)}</li>"
        for b in shown
    )
    verdict = "yes" if view.safe_to_stop else "no"
    status = escape(view.status)
    pruned = ' <span class="note" data-field="pruned">(pruned)</span>' if view.pruned else ""
    # A lane with work only its release may run and no live worker of it: nothing
    # will finish that work until one starts (apart from a normal drain).
    no_worker = "no live worker claims" if view.live_workers else "no live worker"
    stranded = (
        f' <span class="stranded-note" data-field="stranded">stranded: {no_worker}</span>'
        if view.stranded
        else ""
    )
    # Another system's tasks on the lane's queue: information, never a blocker.
    foreign = (
        f' <span class="note" data-field="foreignTasks" title="not created by lane-worker: left '
        f'for their owner">{view.foreign_tasks} foreign task(s)</span>'
        if view.foreign_tasks
        else ""
    )
    # A worktree's lane with no worker (deleted?): how it goes, or comes back.
    idle = (
        f' <span class="note" data-field="idleDev" title="{escape(idle_dev_line(view))}">'
        f"idle: no worker since {escape(idle_since(view))}</span>"
        if view.idle_dev
        else ""
    )
    # A release and a worktree both registered its queue (an older build let them).
    if view.mixed:
        idle += (
            f' <span class="note" data-field="mixed" title="{escape(mixed_line(view))}">'
            "mixed: release and worktree</span>"
        )
    # A drained lane's machines are safe to stop: whether they claim says nothing more.
    quiet_status = view.status == "drained"
    if not quiet_status and not view.stranded and view.live_workers and not view.claiming_workers:
        if view.unknown_workers:
            # Builds before 0.2.0 report nothing: they may claim, or fail every claim.
            stranded = (
                ' <span class="note" data-field="claimHealthUnknown">no live worker known to '
                "claim: claim health unknown (lane-worker before 0.2.0)</span>"
            )
        else:
            # Nothing waits yet, but nothing submitted to it would run either.
            stranded = (
                ' <span class="stranded-note" data-field="noClaims">no live worker claims</span>'
            )
    badge = ""
    if view.role is not None:
        label = {"current": "current", "previous": "superseded"}.get(view.role, view.role)
        badge = f'<span class="badge" data-field="role">{escape(label)}</span>'
    machines = (
        f"{view.machines_live}/{view.machines_desired}" if view.machines_desired is not None else ""
    )
    scaler = (
        f'<div class="scaler" data-field="scaler">{escape(view.scaler)}</div>'
        if view.scaler
        else ""
    )
    row_class = ' class="stranded"' if view.stranded else ""
    return (
        f'<tr data-queue="{escape(view.queue)}" data-status="{status}" '
        f'data-safe-to-stop="{verdict}"{row_class}>'
        f'<td data-field="releaseId">{escape(view.release_id)}{badge}</td>'
        f"<td><code>{escape(view.queue)}</code></td>"
        f'<td><span class="{status}" data-field="status">{status}</span>'
        f"{pruned}{stranded}{foreign}{idle}</td>"
        f'<td class="n" data-field="liveWorkers">{view.live_workers}</td>'
        f'<td class="n" data-field="machines">{machines}{scaler}</td>'
        f'<td data-field="workers">{"".join(_worker(w) for w in view.workers)}</td>'
        f"{counts}"
        f'<td data-field="safeToStop">{verdict}</td>'
        f"<td>{f'<ul>{blockers}</ul>' if blockers else ''}</td>"
        "</tr>"
    )


def _worker(worker: dict[str, Any]) -> str:
    """One live worker: its id, the build it runs, and why it does not claim if it does not."""
    health = claim_health(worker)
    said = ""
    if health == NOT_CLAIMING:
        said = (
            f'<div class="not-claiming" data-field="notClaiming">not claiming: '
            f"{escape(why_not(worker))}</div>"
        )
    elif health == UNKNOWN:
        said = f'<div class="note" data-field="claimHealth">{escape(UNKNOWN_HEALTH)}</div>'
    claims = {NOT_CLAIMING: "no", UNKNOWN: "unknown"}.get(health, "yes")
    return (
        f'<div class="worker" data-worker="{escape(str(worker["workerId"]))}" '
        f'data-version="{escape(str(worker.get("version") or ""))}" '
        f'data-claiming="{claims}"><code>{escape(str(worker["workerId"]))}'
        f'</code> <span data-field="version">{escape(version_of(worker))}</span>{said}</div>'
    )


def _run_ids(run_ids: tuple[str, ...], count: int) -> str:
    if not run_ids:
        return ""
    more = f" (first {len(run_ids)} of {count})" if count > len(run_ids) else ""
    ids = " ".join(f"<code>{escape(i)}</code>" for i in run_ids)
    return f'<details data-field="runIds"><summary>runs{more}</summary>{ids}</details>'


def age(seconds: float) -> str:
    """Say a duration the way the page does: ``42 s``, ``5 min``, ``3 h 20 min``, ``2 d 4 h``."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def bucket_html(bucket: str, defer_count: int) -> str:
    """The bucket in the report's words, and how often the run was deferred if it was."""
    said = (
        f'<span data-field="bucket" data-bucket="{escape(bucket)}">'
        f"{escape(BUCKET_WORDS.get(bucket, bucket))}</span>"
    )
    if defer_count:
        said += f', <span data-field="deferred">deferred {defer_count}x</span>'
    return said


def _open_run(run: OpenRun, now: datetime) -> str:
    run_id = escape(str(run.run_id))
    bucket = bucket_html(run.bucket, run.defer_count)
    return (
        f'<tr data-run="{run_id}"><td><a href="/runs/{run_id}"><code>{run_id}</code></a></td>'
        f'<td data-field="play">{escape(run.play)}</td><td>{bucket}</td>'
        f'<td class="n" data-field="attempts">{run.attempts}</td>'
        f'<td class="n" data-field="age">{age((now - run.created_at).total_seconds())}</td></tr>'
    )


def _open_runs(view: LaneView, most: int) -> str:
    """The lane's newest open runs (``most`` at most), and how to list the rest."""
    total = sum(view.counts.get(b, 0) for b in BUCKETS)
    if not total:
        return ""
    now = view.as_of or datetime.now().astimezone()
    shown = view.open_runs[:most]
    rows = "".join(_open_run(r, now) for r in shown)
    more = ""
    if total > len(shown):
        command = (
            f"lane-worker runs --status {OPEN} --lane {shlex.quote(view.release_id)} "
            f"--limit {min(total, MAX_LIST)}"
        )
        more = (
            f'<p class="note" data-field="more">and {total - len(shown)} more: '
            f"<code>{escape(command)}</code> lists them all.</p>"
        )
    return (
        f'<section data-open-runs="{escape(view.queue)}">'
        f"<h2>Open runs of {escape(view.release_id)} (<code>{escape(view.queue)}</code>): "
        f"{total}, newest first</h2>"
        "<table><thead><tr><th>run</th><th>play</th><th>bucket</th><th>attempts</th>"
        f"<th>age</th></tr></thead><tbody>{rows}</tbody></table>{more}</section>"
    )


def render(views: list[LaneView], page: int = 1) -> str:
    """Return page ``page`` of the lanes page for ``views`` (the drain report).

    Its size is bounded whatever the number of lanes: past ``PAGE_LANES`` lanes the
    quiet ones (drained or idle, no live worker, nothing failed) are only counted,
    the rest are listed ``PAGE_LANES`` to a page, and the page lists at most about
    ``OPEN_RUNS_PER_PAGE`` open runs in all.
    """
    listed, quiet = collapsed(views, PAGE_LANES)
    pages = max(1, -(-len(listed) // PAGE_LANES))
    page = min(max(1, page), pages)
    on_page = listed[(page - 1) * PAGE_LANES : page * PAGE_LANES]
    head = "".join(f"<th>{escape(label)}</th>" for _, label in COUNT_COLUMNS)
    rows = "".join(_row(v) for v in on_page) or (
        '<tr><td colspan="15">no lanes registered (a worker registers its lane at boot).</td></tr>'
    )
    as_of = next((v.as_of for v in views if v.as_of is not None), None)
    when = (
        f' As of <span data-field="asOf">{escape(as_of.strftime("%Y-%m-%d %H:%M:%S %Z"))}</span>.'
        if as_of
        else ""
    )
    most = min(PAGE_OPEN_RUNS, max(MIN_OPEN_RUNS, OPEN_RUNS_PER_PAGE // max(1, len(on_page))))
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>lane-worker lanes</title><style>{STYLE}</style></head><body>{NAV}"
        "<h1>lane-worker lanes</h1>"
        f'<p class="note">The drain report, refreshed every {REFRESH_S} s.{when} A lane is safe '
        "to stop when it is drained. The same data: <a href=/lanes>/lanes</a> (JSON), "
        "<a href=/lanes?format=text>/lanes?format=text</a>. Every run, filtered: "
        "<a href=/runs>runs</a>; each release's life: <a href=/deploys>deploys</a>.</p>"
        f"{_pager(page, pages, len(listed))}"
        "<table><thead><tr><th>release</th><th>queue</th><th>status</th><th>live</th>"
        "<th>machines</th><th>workers</th>"
        f"{head}<th>safe to stop</th><th>blocked by</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>{_quiet(quiet)}"
        f"{''.join(_open_runs(v, most) for v in on_page)}</body></html>"
    )


def page_number(value: str | None) -> int | None:
    """Return the page asked for (1 when none), or None when ``value`` is not one."""
    if value is None:
        return 1
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE:
        return None
    return int(value)


def lanes_page(views: list[LaneView], page: int) -> tuple[list[LaneView], dict[str, object]]:
    """Return page ``page`` of ``/lanes`` and its paging fields (none up to LANES_PER_PAGE)."""
    if len(views) <= LANES_PER_PAGE:
        return views, {}
    pages = -(-len(views) // LANES_PER_PAGE)
    page = min(page, pages)
    shown = views[(page - 1) * LANES_PER_PAGE : page * LANES_PER_PAGE]
    following = f"/lanes?page={page + 1}" if page < pages else None
    return shown, {"page": page, "pages": pages, "lanesTotal": len(views), "next": following}


def _pager(page: int, pages: int, lanes: int) -> str:
    if pages == 1:
        return ""
    links = []
    if page > 1:
        links.append(f'<a href="/?page={page - 1}" data-field="previous">previous</a>')
    if page < pages:
        links.append(f'<a href="/?page={page + 1}" data-field="next">next</a>')
    return (
        f'<p class="note" data-field="pages" data-page="{page}" data-pages="{pages}">'
        f"Lanes {(page - 1) * PAGE_LANES + 1}-{min(lanes, page * PAGE_LANES)} of {lanes} "
        f"(page {page} of {pages}): {' '.join(links)}</p>"
    )


def _quiet(quiet: list[LaneView]) -> str:
    """The quiet lanes, counted: drained or idle, with no live worker and nothing failed."""
    if not quiet:
        return ""
    parked = sum(v.waiting for v in quiet)
    held = (
        f", holding {parked} parked runs that newer releases adopt as they come due"
        if parked
        else ""
    )
    return (
        f'<p class="note" data-field="quiet" data-count="{len(quiet)}">and {len(quiet)} '
        f"drained or idle lanes with no live worker{held}, not listed: "
        "<code>lane-worker lanes</code> lists every lane, <code>lane-worker lanes prune</code> "
        "drops the drained ones' queues.</p>"
    )


def render_error(reason: str) -> str:
    """Return the page shown while the report cannot be read (booting, database away)."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        f"<title>lane-worker lanes</title><style>{STYLE}</style></head><body>"
        "<h1>lane-worker lanes</h1>"
        f'<p class="note" data-error="{escape(reason)}">The report cannot be read right now '
        f"({escape(reason)}); this page tries again every {REFRESH_S} s.</p></body></html>"
    )
