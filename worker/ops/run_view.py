"""One run as the run page (``/runs/<runId>`` on the health port) shows it.

The store's ``run_status`` (what ``lane-worker status --json`` prints: attempts
spent, claims,
steps with the release that committed each, ledger facts) plus what only the
page shows: the wait the run is parked in, its drain-report bucket while it is
open, and its clock. Both are read in one snapshot.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from worker.db.pool import Connection
from worker.db.store import Store
from worker.db.store.rows import RunPageRow


@dataclass(frozen=True)
class RunView:
    """A run's ``run_status`` object and the page's extra row."""

    status: dict[str, Any]
    row: RunPageRow


async def read_run(conn: Connection, store: Store, run_id: uuid.UUID) -> RunView | None:
    """Read one run in one read-only snapshot; None when the store has no such run."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        row = await store.runs.page(conn, run_id=run_id)
        if row is None:
            return None
        return RunView(status=await store.api.status(conn, run_id=run_id), row=row)


def claims_line(claims: Iterable[tuple[str, int]]) -> str:
    """Say what a run's claims were, given each one's (disposition, engine attempt).

    ``status`` and the run page both show it under "claims", beside "attempts" (the
    engine attempts spent, as max attempts counts them): a claim that resumed an
    engine attempt already begun (after a park) spends none, nor does a put-back.
    """
    began: set[int] = set()
    resumed = back = 0
    for disposition, attempt in claims:
        if disposition not in ("own", "adopt"):
            back += 1
        elif attempt in began:
            resumed += 1
        else:
            began.add(attempt)
    total = len(began) + resumed + back
    if not total:
        return "(none yet)"
    parts = [f"{len(began)} began an attempt"]
    if resumed:
        parts.append(f"{resumed} resumed after a park")
    if back:
        parts.append(f"{back} put back without running it")
    return f"{total} ({', '.join(parts)})"


def _at_ms(text: str | None) -> str:
    """A stored epoch-milliseconds value as UTC time ('?' when it is not one)."""
    try:
        at = datetime.fromtimestamp(float(text or "") / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return "?"
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def waits_line(wait: Mapping[str, str] | None) -> str:
    """Say what a parked run waits for (``status``): a sleep's end, an event, a runner."""
    if not wait:
        return ""
    kind = wait.get("kind")
    deadline = f" (deadline {_at_ms(wait['deadlineMs'])})" if wait.get("deadlineMs") else ""
    if kind == "sleep":
        return f"a sleep, until {_at_ms(wait.get('wakeAtMs'))}"
    if kind == "integration_event":
        return f"event {wait.get('eventKey')!r}{deadline}"
    if kind == "runner":
        return f"a detached runner's result (lane-worker runner-result){deadline}"
    return f"a wait of kind {kind!r}"
