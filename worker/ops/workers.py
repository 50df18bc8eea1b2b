"""A lane's live workers as the report shows them: build, machine, and whether each claims.

The worker writes both with its heartbeat (store migration 0021): its version,
and each claim loop whose claims keep failing, since when and why. Any
machine's ``lanes`` and lanes page read them from there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from worker.jsonvalue import decode_json, unreadable_in

# What a worker that recorded no version runs: builds before 0.2.0 had no column for it.
NO_VERSION = "before 0.2.0"

# A worker's claim health (``claimHealth``): every loop claims, some loop does not, or
# its build (before 0.2.0) reports neither, so nobody can tell (issue 29).
CLAIMING = "claiming"
NOT_CLAIMING = "notClaiming"
UNKNOWN = "unknown"
UNKNOWN_HEALTH = f"claim health unknown: lane-worker {NO_VERSION} does not report it"


# What a worker's claim report is said to be when it cannot be read: a newer build
# may write another shape, and a worker this build cannot vouch for is not called healthy.
UNREADABLE_REPORT = "unreadable claim report"


def _unreadable(why: str) -> dict[str, Any]:
    return {
        "queue": None,
        "loop": None,
        "since": None,
        "failingForSeconds": None,
        "failures": None,
        "reason": f"{UNREADABLE_REPORT}: {why}",
        "unreadable": True,
    }


def _shown(value: Any) -> str:
    text = " ".join(json.dumps(value, default=str).split())
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


_SHOWN = 100


def _failing_for(since: Any, now: datetime) -> float | None:
    """Seconds since ``since`` (an ISO time with its zone), None when it is not one."""
    if not isinstance(since, str):
        return None
    try:
        at = datetime.fromisoformat(since)
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    return round((now - at).total_seconds(), 1)


def not_claiming_of(report: Any, now: datetime) -> list[dict[str, Any]]:
    """Read a worker's stored claim report (``claim_failures``): one entry per loop not claiming.

    A report of any other shape (or one Python cannot decode) is one entry saying
    so: the worker shows as not claiming, everything else of it (and of the lane) shown.
    """
    if report is None or report == []:
        return []
    unreadable = unreadable_in("the report", report)
    if unreadable is not None:
        return [_unreadable(unreadable)]
    if not isinstance(report, list):
        return [_unreadable(f"not a list: {_shown(report)}")]
    entries = []
    for failure in report:
        if not isinstance(failure, dict):
            entries.append(_unreadable(f"an entry is not an object: {_shown(failure)}"))
            continue
        since = failure.get("since")
        entries.append(
            {
                "queue": failure.get("queue"),
                "loop": failure.get("loop"),
                "since": since,
                "failingForSeconds": _failing_for(since, now),
                "failures": failure.get("failures"),
                "reason": failure.get("reason"),
            }
        )
    return entries


def worker_json(raw: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Return one live worker of the report's read as ``lanes --json`` shows it."""
    report = raw.get("claimFailures")
    # The report's read gives it as its JSON text, decoded here for this worker alone.
    not_claiming = not_claiming_of(decode_json(report) if isinstance(report, str) else report, now)
    version = raw.get("version")
    # Store migration 0021 gave builds both columns at once: a worker that writes no
    # version writes no claim report either, so its silence says nothing.
    health = UNKNOWN if version is None and not not_claiming else _health(not not_claiming)
    return {
        "workerId": raw["workerId"],
        "plays": raw.get("plays") or [],
        "machineId": raw.get("machineId"),
        "version": version,  # null: a build before 0.2.0
        "claiming": None if health == UNKNOWN else not not_claiming,  # null: unknown
        "claimHealth": health,
        "notClaiming": not_claiming,
    }


def _health(claims: bool) -> str:
    return CLAIMING if claims else NOT_CLAIMING


def claim_health(worker: dict[str, Any]) -> str:
    """Return a live worker's claim health; a worker without the field claims (as before 0021)."""
    claims = worker.get("claiming", True)
    return UNKNOWN if claims is None else _health(bool(claims))


def _text(value: Any) -> str:
    """A stored value as one line of text, cut: it came from another build's report."""
    text = " ".join(str(value).split())
    return text if len(text) <= 3 * _SHOWN else text[: 3 * _SHOWN] + "..."


def version_of(worker: dict[str, Any]) -> str:
    """Return the build a worker runs, in words."""
    return str(worker.get("version") or NO_VERSION)


def with_health(workers: Sequence[dict[str, Any]], health: str) -> list[dict[str, Any]]:
    """Return the workers whose claim health is ``health``."""
    return [w for w in workers if claim_health(w) == health]


def why_not(worker: dict[str, Any]) -> str:
    """Say which loops of a worker do not claim, since how long, and why."""
    parts = []
    for f in worker.get("notClaiming") or ():
        if f.get("unreadable"):
            parts.append(_text(f.get("reason")))
            continue
        seconds = f.get("failingForSeconds")
        since = "" if seconds is None else f" for {seconds:.0f} s"
        parts.append(
            f"{_text(f.get('loop'))} loop on {_text(f.get('queue'))} failing{since}: "
            f"{_text(f.get('reason'))}"
        )
    return "; ".join(parts)


def not_claiming_lines(release: str, workers: Sequence[dict[str, Any]]) -> list[str]:
    """One line per live worker of ``release`` that does not claim, with the reason."""
    return [
        f"{release}: worker {w['workerId']} ({version_of(w)}) is not claiming: {why_not(w)}"
        for w in with_health(workers, NOT_CLAIMING)
    ]


def stuck_remedy(release: str, workers: Sequence[dict[str, Any]]) -> str:
    """What to do when every live worker of ``release`` is up but none claims."""
    stuck = with_health(workers, NOT_CLAIMING)
    first = why_not(stuck[0]) if stuck else ""
    return (
        f"{release}'s {len(stuck)} live worker(s) are not claiming ({first}): fix the cause "
        "(their /readyz says it too), then they resume by themselves"
    )
