"""The run page (``/runs/<runId>`` on the health port): one run, as an operator reads it.

What ``lane-worker status`` prints (status, play, releases, each claim numbered once
with its disposition, outcome, release, worker, machine and put-back reason or
error, steps and waits with the release that committed each, ledger facts), plus
its input, what the wait it is parked in waits for and its drain-report bucket.
Every value is escaped: plays, outputs and errors come from the app.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from html import escape
from typing import Any

import anyio

from worker import checkpoint
from worker.daemon.page import REFRESH_S, STYLE, age, bucket_html
from worker.jsonvalue import unreadable_in
from worker.ops.run_view import RunView, claims_line

# Output and error are cut to this many characters (the CLI prints them whole).
VALUE_CHARS = 2000

RunReport = Callable[[uuid.UUID], Awaitable[RunView | None]]


async def answer(read: RunReport, raw_id: str, *, timeout_s: float) -> tuple[int, str]:
    """Return (HTTP status, page) for ``/runs/<raw_id>``: 404 for a malformed or unknown
    run id, 503 while the run cannot be read within ``timeout_s``."""
    try:
        run_id = uuid.UUID(raw_id)
    except ValueError:
        return 404, render_not_found(f"{raw_id!r} is not a run id (a UUID).")
    try:
        with anyio.fail_after(timeout_s):
            view = await read(run_id)
    except Exception as exc:  # the database is away: say so, do not crash the page
        return 503, render_unavailable(type(exc).__name__)
    if view is None:
        return 404, render_not_found(f"the store has no run {run_id}.")
    return 200, render_run(view)


def _when(value: datetime | str | None) -> str:
    if value is None:
        return ""
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds()


def _from_ms(ms: Any) -> str:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return "no deadline"
    try:
        return _when(datetime.fromtimestamp(ms / 1000, UTC))
    except (OverflowError, ValueError, OSError):  # stored JSON: any number may stand there
        return f"an impossible time ({ms!r} ms)"


def waits_for(run_id: str, wait: Any) -> str:
    """Say what a parked run waits for: a sleep's end, an event, a detached runner.

    The wait is stored JSON: one this process cannot decode, or that is not an
    object, is named as such rather than failing the page.
    """
    if wait is None or wait == {}:
        return ""
    unreadable = unreadable_in("the stored wait", wait)
    if unreadable is not None:
        return unreadable
    if not isinstance(wait, dict):
        return f"the stored wait is not an object: {_cut(json.dumps(wait, default=str))}"
    kind = wait.get("kind")
    boundary = f" (boundary {wait.get('boundaryId')})" if wait.get("boundaryId") else ""
    if kind == checkpoint.SLEEP_BOUNDARY:
        return f"sleeps until {_from_ms(wait.get('wakeAtMs'))}{boundary}"
    if kind == checkpoint.INTEGRATION_EVENT_BOUNDARY:
        key = str(wait.get("eventKey"))
        return (
            f"event {key!r} (engine event {checkpoint.integration_event_name(run_id, key)}), "
            f"deadline: {_from_ms(wait.get('deadlineMs'))}{boundary}"
        )
    if kind == checkpoint.RUNNER_BOUNDARY:
        attempt = wait.get("runnerAttempt")
        return (
            f"detached runner attempt {attempt} to report (lane-worker runner-result), "
            f"deadline: {_from_ms(wait.get('deadlineMs'))}{boundary}"
        )
    return f"a wait of kind {kind!r}{boundary}"


def _cut(text: str) -> str:
    return text[:VALUE_CHARS] + f"... ({len(text)} characters)" if len(text) > VALUE_CHARS else text


# The page's database role may not read payloads (LANE_WORKER_PAGE_POSTGRES, a viewer).
HIDDEN = "not shown: this page's database role may not read runs' inputs, outputs or errors"


def _value(value: Any, what: str) -> str:
    unreadable = unreadable_in(what, value)
    if unreadable is not None:
        return f'<span data-unreadable="true">{escape(unreadable)}</span>'
    text = json.dumps(value, default=str, ensure_ascii=False)
    if len(text) > VALUE_CHARS:
        text = text[:VALUE_CHARS] + f"... ({len(text)} characters)"
    return f"<code>{escape(text)}</code>"


def _error(error: Any) -> list[tuple[str, str]]:
    """The error's row, and its traceback's (kept bounded and masked) as preformatted text."""
    text = error.get("traceback") if isinstance(error, dict) else None
    if not isinstance(text, str):
        return [("error", _value(error, "the error"))]
    rest = {k: v for k, v in error.items() if k != "traceback"}
    return [("error", _value(rest, "the error")), ("traceback", f"<pre>{escape(text)}</pre>")]


def _claim_error(error: Any) -> str:
    """A claim's put-back reason, or its failure's name and message (the run's error row
    shows the last failure's traceback)."""
    if error is None:
        return ""
    if isinstance(error, dict) and isinstance(error.get("reason"), str):
        return escape(_cut(error["reason"]))
    if isinstance(error, dict) and isinstance(error.get("name"), str):
        return escape(_cut(f"{error['name']}: {error.get('message', '')}"))
    return _value(error, "the claim's error")


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]], field: str) -> str:
    """A table of already escaped cells; ``field`` names it for readers of the DOM."""
    if not rows:
        return f'<p class="note" data-field="{field}">none.</p>'
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table data-field="{field}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _page(title: str, body: str, status_note: str = "") -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        f'<p class="note"><a href="/">all lanes</a> &middot; <a href="/runs">all runs</a>'
        f"{status_note}</p>{body}</body></html>"
    )


def render_run(view: RunView) -> str:
    """Return the whole run page."""
    said, row = view.status, view.row
    claims = said["claims"]  # each time a worker took the run; "attempts" counts spent ones
    run_id = str(said["runId"])
    facts: list[tuple[str, str]] = [
        ("status", escape(str(said["status"]))),
        ("play", escape(str(said["play"]))),
        ("release", escape(str(said["releaseId"]))),
        ("adopted by release", escape(str(said["adoptedReleaseId"] or "(none)"))),
        ("queue", f"<code>{escape(str(said['queue']))}</code>"),
        ("attempts", f"{row.attempts} of {row.max_attempts}"),
        ("claims", escape(claims_line((a["disposition"], a["attempt"]) for a in claims))),
        ("created", f"{_when(row.created_at)} ({age(_seconds(row.as_of, row.created_at))} ago)"),
        ("updated", _when(row.updated_at)),
    ]
    if row.bucket is not None:
        facts.insert(1, ("bucket", bucket_html(row.bucket, row.defer_count)))
    if row.finished_at is not None:
        facts.append(("finished", _when(row.finished_at)))
    waiting = waits_for(run_id, row.current_wait)
    if waiting:
        facts.append(("waits for", escape(waiting)))
    if said.get("retryOf"):
        facts.append(
            (
                "retry of",
                f'<a href="/runs/{escape(str(said["retryOf"]))}">'
                f"{escape(str(said['retryOf']))}</a>",
            )
        )
    if row.payloads_hidden:
        facts.append(("input", f"<em>{escape(HIDDEN)}</em>"))
    else:
        facts.append(("input", _value(row.input, "the input")))
    if said["output"] is not None:
        facts.append(("output", _value(said["output"], "the output")))
    if said["error"] is not None:
        facts += _error(said["error"])
    rows = "".join(
        f'<tr><th>{escape(name)}</th><td data-field="{escape(name)}">{cell}</td></tr>'
        for name, cell in facts
    )
    attempts = _table(
        ("claim", "disposition", "outcome", "release", "worker", "machine", "engine attempt",
         "reason or error"),
        [
            (
                escape(str(a.get("claim", n))),
                escape(str(a["disposition"])),
                escape(str(a["outcome"] or "in progress")),
                escape(str(a["releaseId"])),
                f"<code>{escape(str(a['workerId']))}</code>",
                f"<code>{escape(str(a.get('machineId') or ''))}</code>",
                # A put-back ran nothing: the engine's number it repeats would mislead.
                escape(str(a["attempt"])) if a["disposition"] in ("own", "adopt") else "",
                _claim_error(a.get("error")),
            )
            for n, a in enumerate(claims, start=1)
        ],
        "claims",
    )  # fmt: skip
    steps = _table(
        ("checkpoint", "committed by release", "attempt", "worker", "when"),
        [
            (
                f"<code>{escape(str(s['name']))}</code>",
                escape(str(s["releaseId"] or "?")),
                escape(str(s["attempt"] or "")),
                f"<code>{escape(str(s['workerId'] or ''))}</code>",
                escape(_when(s["committedAt"])),
            )
            for s in said["steps"]
        ],
        "steps",
    )
    ledger = _table(
        ("fact", "written"),
        [(escape(str(f["type"])), escape(_when(f["createdAt"]))) for f in said["facts"]],
        "facts",
    )
    act = (
        f'<p class="note"><a href="/runs?run={escape(run_id)}" data-field="act">retry, cancel or '
        "move it from the run list</a></p>"
    )
    body = (
        f"<h1>run <code>{escape(run_id)}</code></h1>{act}"
        f'<table data-field="run"><tbody>{rows}</tbody></table>'
        f"<h2>claims</h2>{attempts}<h2>steps and waits (checkpoints)</h2>{steps}"
        f"<h2>ledger facts</h2>{ledger}"
    )
    note = f' &middot; as of <span data-field="asOf">{escape(_when(row.as_of))}</span>'
    return _page(f"lane-worker run {run_id}", body, note)


def render_not_found(what: str) -> str:
    """Return the small page of a run id that names no run (or is not a run id at all)."""
    return _page(
        "lane-worker: no such run",
        f'<h1>no such run</h1><p data-error="not-found">{escape(what)}</p>',
    )


def render_unavailable(reason: str) -> str:
    """Return the page shown while the run cannot be read (booting, database away)."""
    return _page(
        "lane-worker run",
        f'<p class="note" data-error="{escape(reason)}">The run cannot be read right now '
        f"({escape(reason)}); this page tries again every {REFRESH_S} s.</p>",
    )
