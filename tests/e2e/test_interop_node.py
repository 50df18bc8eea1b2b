"""The SQL API from Node, with the `pg` package, as the TypeScript app calls it.

Runs ``tests/interop/sql_api.mjs`` (its ``package-lock.json`` pins ``pg``; the
fixture runs ``npm ci`` there when ``node_modules`` is missing) against a real
database, then checks what it saw against the store.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from support.db import fetch, run_row
from support.runtime import SCHEMA

INTEROP = Path(__file__).parent.parent / "interop"
TOKEN = "node-exec-token-51c2"  # looked for in every output


@pytest.fixture(scope="session")
def node() -> str:
    """Node with the interop package's pinned dependencies installed."""
    found = shutil.which("node")
    npm = shutil.which("npm")
    if found is None or npm is None:
        pytest.fail("the interop test needs Node 18+ and npm on PATH (CI installs them)")
    if not (INTEROP / "node_modules" / "pg" / "package.json").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=INTEROP, check=True, timeout=300,
        )  # fmt: skip
    return found


def run_script(node: str, database_url: str) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(INTEROP / "sql_api.mjs")],
        env={**os.environ, "DATABASE_URL": database_url, "STORE_SCHEMA": SCHEMA,
             "EXEC_TOKEN": TOKEN},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


async def test_node_submits_signals_reads_and_cancels_through_the_sql_api(
    node: str, database_url: str
) -> None:
    """Every call the README shows, from Node: results, SQLSTATEs, and the rows they wrote."""
    seen = run_script(node, database_url)

    assert seen["workerRelease"] == {"releaseId": "rel-node", "queue": "runs_rel_node"}
    assert seen["workerPreview"] == {"releaseId": "dev-pr_7", "queue": "runs_pr_7"}
    assert seen["workerRefused"]["code"] == "22023"
    assert "spelled like a dev lane" in seen["workerRefused"]["message"]
    submitted = seen["submitted"]
    assert submitted == {
        "runId": submitted["runId"], "queue": "runs_rel_node", "releaseId": "rel-node",
        "created": True, "served": False, "warning": submitted["warning"],
    }  # fmt: skip
    assert submitted["warning"].startswith("no worker serves lane runs_rel_node (release ")
    assert seen["resubmitted"] == {**submitted, "created": False}
    assert seen["conflict"]["code"] == "23505"
    assert seen["conflict"]["constraint"] == "idempotency_key"
    assert seen["conflict"]["detail"] == submitted["runId"]
    assert seen["badInput"]["code"] == "22023"
    assert "must be a JSON object, not a JSON array" in seen["badInput"]["message"]
    assert seen["badRelease"]["code"] == "22023"
    for refused, says in (
        ("deepInput", "the run's input nests deeper than 512 levels"),
        ("longNumber", "the run's input holds a number of 5001 digits"),
        ("deepSignal", "the event's payload nests deeper than 512 levels"),
    ):
        assert seen[refused]["code"] == "22023", seen[refused]
        assert says in seen[refused]["message"]
    assert seen["noSuchRun"]["code"] == "P0002"
    assert seen["noRunner"]["code"] == "P0002"
    assert "has no runner attempt 1" in seen["noRunner"]["message"]

    assert (seen["signalled"]["delivered"], seen["signalledAgain"]["duplicate"]) == (True, True)
    status = seen["status"]
    assert (status["runId"], status["play"], status["status"]) == (
        submitted["runId"], "greet", "queued",
    )  # fmt: skip
    assert seen["cancelled"] == {
        "runId": seen["other"]["runId"], "cancelled": True, "status": "cancelled",
    }  # fmt: skip

    many = seen["many"]
    assert many[0] == {**submitted, "created": False}
    assert (many[1]["queue"], many[1]["created"]) == ("runs_rel_node", True)
    assert seen["manyRefused"]["code"] == "22023"
    assert seen["manyRefused"]["message"].startswith("item 1: a run's input must be a JSON object")

    row = await run_row(database_url, submitted["runId"])
    assert (row["input"], row["status"], row["idempotency_key"]) == (
        {"name": "from-node"}, "queued", "node-order-1",
    )  # fmt: skip
    runs = await fetch(database_url, f"select count(*) as n from {SCHEMA}.runs")
    assert runs[0]["n"] == 3  # the repeats and the refusals wrote nothing
    signals = await fetch(
        database_url, f"select payload from {SCHEMA}.signals where run_id = $1",
        uuid.UUID(submitted["runId"]),
    )  # fmt: skip
    assert [s["payload"] for s in signals] == [{"by": "node"}]
    api = await fetch(database_url, f"select api from {SCHEMA}.run_runtime_api")
    assert [a["api"]["executorToken"] for a in api] == [TOKEN]
