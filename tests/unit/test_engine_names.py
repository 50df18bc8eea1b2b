"""This build calls only engine-side objects whose names carry their contract version.

Older builds re-create their own unversioned ``lane_worker.*`` functions and triggers at
every boot ("Builds side by side" in docs/DESIGN.md); a call of one from this build runs
whatever body the last older build installed, or fails where none did. A merge once
brought back ``next_due_any`` and ``next_due_in`` in the loops' safety net, and every
sweep failed with "function does not exist" on a database no older build had touched.
"""

from __future__ import annotations

import re
from pathlib import Path

from support import REPO

WORKER = REPO / "worker"
# lane_worker.<name>( or a trigger name in quotes: every function or trigger this build names.
CALL = re.compile(r"lane_worker\.([a-z_0-9]+)\s*\(")
TRIGGER = re.compile(r"'(lane_worker_runnable[a-z_0-9]*)'")
VERSIONED = re.compile(r".+_v\d+")
# The ledger of contracts itself: one table every build from 0.2.0 on shares, whose
# columns may be added to and never changed.
SHARED = {"contracts"}
# Landed store migrations are history (their comments name what existed then).
HISTORY = re.compile(r"\d{4}_[a-z0-9_]+\.sql")


def sources() -> list[Path]:
    """Return this build's SQL and Python files, landed migrations aside."""
    files = [*WORKER.rglob("*.sql"), *WORKER.rglob("*.py")]
    return sorted(f for f in files if not HISTORY.fullmatch(f.name))


def test_every_engine_side_call_names_a_versioned_object() -> None:
    """No unversioned lane_worker function or trigger is called, created or looked up."""
    unversioned = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        for pattern in (CALL, TRIGGER):
            for match in pattern.finditer(text):
                if not VERSIONED.fullmatch(match[1]) and match[1] not in SHARED:
                    line = text.count("\n", 0, match.start()) + 1
                    unversioned.append(f"{path.relative_to(REPO)}:{line}: {match[1]}")
    assert unversioned == []


def test_the_check_sees_the_engine_files() -> None:
    """The scan reads the claim contract and the engine queries (a guard against a moved tree)."""
    names = {p.name for p in sources()}
    assert {"claim_v1.sql", "notify_v1.sql", "queries.sql"} <= names
