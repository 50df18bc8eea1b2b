"""A lane's live workers as the report shows them: build, machine, and whether each claims.

The worker writes both with its heartbeat (store migration 0021): its version,
and each claim loop whose claims keep failing, since when and why. Any
machine's ``lanes`` and lanes page read them from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

# What a worker that recorded no version runs: builds before 0.2.0 had no column for it.
NO_VERSION = "before 0.2.0"


def worker_json(raw: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Return one live worker of the report's read as ``lanes --json`` shows it."""
    not_claiming = []
    for failure in raw.get("claimFailures") or ():
        since = failure.get("since")
        at = datetime.fromisoformat(since) if isinstance(since, str) else None
        not_claiming.append({
            "queue": failure.get("queue"),
            "loop": failure.get("loop"),
            "since": since,
            "failingForSeconds": None if at is None else round((now - at).total_seconds(), 1),
            "failures": failure.get("failures"),
            "reason": failure.get("reason"),
        })  # fmt: skip
    return {
        "workerId": raw["workerId"],
        "plays": raw.get("plays") or [],
        "machineId": raw.get("machineId"),
        "version": raw.get("version"),  # null: a build before 0.2.0
        "claiming": not not_claiming,
        "notClaiming": not_claiming,
    }


def version_of(worker: dict[str, Any]) -> str:
    """Return the build a worker runs, in words."""
    return str(worker.get("version") or NO_VERSION)


def claiming(workers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the workers whose every claim loop claims."""
    return [w for w in workers if w.get("claiming", True)]


def why_not(worker: dict[str, Any]) -> str:
    """Say which loops of a worker do not claim, since how long, and why."""
    parts = []
    for f in worker.get("notClaiming") or ():
        seconds = f.get("failingForSeconds")
        since = "" if seconds is None else f" for {seconds:.0f} s"
        parts.append(f"{f.get('loop')} loop on {f.get('queue')} failing{since}: {f.get('reason')}")
    return "; ".join(parts)


def not_claiming_lines(release: str, workers: Sequence[dict[str, Any]]) -> list[str]:
    """One line per live worker of ``release`` that does not claim, with the reason."""
    return [
        f"{release}: worker {w['workerId']} ({version_of(w)}) is not claiming: {why_not(w)}"
        for w in workers
        if not w.get("claiming", True)
    ]


def stuck_remedy(release: str, workers: Sequence[dict[str, Any]]) -> str:
    """What to do when every live worker of ``release`` is up but none claims."""
    stuck = [w for w in workers if not w.get("claiming", True)]
    first = why_not(stuck[0]) if stuck else ""
    return (
        f"{release}'s {len(stuck)} live worker(s) are not claiming ({first}): fix the cause "
        "(their /readyz says it too), then they resume by themselves"
    )
