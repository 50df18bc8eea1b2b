"""The TypeScript client (``clients/typescript``) from Node, against a real store and daemon.

The fixture builds the client (``npm ci`` on a clean clone, ``tsc``: support.tsclient),
then each test runs compiled Node code on a fresh database: the client's own tests
(node:test), a script making every SQL API call through the client, checked here against
the store's rows, and an app's round trip that a real daemon completes.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from support import REPO
from support.cli import operator_env, run_cli
from support.daemon import Daemons
from support.db import attempt_rows, fetch, run_row
from support.runtime import SCHEMA
from support.tsclient import CLIENT, built_client, node_env, typecheck_snippets

TOKEN = "node-exec-token-51c2"  # looked for in every output
RELEASE = "rel-ts-app"
DETACHED_APP = "support.apps.detached:app"  # the basic plays and a detached runner
# Hang guards only: a test fails on what the scripts print, never on how long they took.
SCRIPT_TIMEOUT_S = 900
# The session's first test builds the client: `npm ci` on a clean clone, over the network.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="session")
def node() -> str:
    """Node, with the client and its tests built from this tree."""
    return built_client()


async def run_node(node: str, args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``node ARGS`` in the client's folder; return its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        node, *args, cwd=CLIENT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), SCRIPT_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_script(node: str, script: str, database_url: str, **env: str) -> dict[str, Any]:
    """Run a compiled script of ``build/test``; return the JSON object it printed."""
    code, out, err = await run_node(
        node, [f"build/test/{script}"], dict(node_env(database_url, SCHEMA, **env))
    )
    assert code == 0, err
    assert TOKEN not in out + err
    seen: dict[str, Any] = json.loads(out)
    return seen


async def test_the_clients_own_tests_pass_against_the_store(node: str, database_url: str) -> None:
    """`node --test` on the client's compiled tests, on a fresh migrated database."""
    built = CLIENT / "build" / "test"
    tests = sorted(str(p.relative_to(CLIENT)) for p in built.glob("*.test.js"))
    assert len(tests) >= 2, tests
    code, out, err = await run_node(node, ["--test", *tests], dict(node_env(database_url, SCHEMA)))
    assert code == 0, out[-6000:] + err[-2000:]
    assert "# fail 0" in out, out[-2000:]
    runs = await fetch(database_url, f"select count(*) as n from {SCHEMA}.runs")
    assert runs[0]["n"] > 0  # they wrote through the real API, not around it


async def test_the_clients_tests_pass_on_a_store_schema_of_its_own(
    node: str, empty_database_url: str
) -> None:
    """With `schema`, every call goes to that store (LANE_WORKER_STORE_SCHEMA's), none elsewhere."""
    own = "lane_worker_store"
    migrated = run_cli(operator_env(empty_database_url, LANE_WORKER_STORE_SCHEMA=own), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    code, out, err = await run_node(
        node, ["--test", "build/test/client.test.js"], dict(node_env(empty_database_url, own))
    )
    assert code == 0, out[-6000:] + err[-2000:]
    runs = await fetch(empty_database_url, f"select count(*) as n from {own}.runs")
    assert runs[0]["n"] > 0
    schemas = await fetch(
        empty_database_url,
        "select nspname from pg_namespace where nspname = 'runtime_scheduler'",
    )
    assert schemas == []


async def test_node_makes_every_call_through_the_client(node: str, database_url: str) -> None:
    """Every call the README shows, through the client: results, error classes, rows written."""
    seen = await run_script(node, "interop.js", database_url, EXEC_TOKEN=TOKEN)

    assert seen["workerRelease"] == {"releaseId": "rel-node", "queue": "runs_rel_node"}
    assert seen["workerPreview"] == {"releaseId": "dev-pr_7", "queue": "runs_pr_7"}
    assert (seen["workerRefused"]["error"], seen["workerRefused"]["code"]) == (
        "BadInputError", "22023",
    )  # fmt: skip
    assert "spelled like a dev lane" in seen["workerRefused"]["message"]
    submitted = seen["submitted"]
    assert submitted == {
        "runId": submitted["runId"], "queue": "runs_rel_node", "releaseId": "rel-node",
        "created": True, "served": False, "warning": submitted["warning"],
    }  # fmt: skip
    assert submitted["warning"].startswith("no worker serves lane runs_rel_node (release ")
    assert seen["resubmitted"] == {**submitted, "created": False}
    assert seen["conflict"]["error"] == "IdempotencyConflictError"
    assert seen["conflict"]["code"] == "23505"
    assert seen["conflict"]["existingRunId"] == submitted["runId"]
    for refused in ("badInput", "badRelease", "deepInput", "deepSignal", "manyRefused"):
        assert (seen[refused]["error"], seen[refused]["code"]) == ("BadInputError", "22023"), seen[
            refused
        ]
    assert "must be a JSON object, not a JSON array" in seen["badInput"]["message"]
    assert "the run's input nests deeper than 512 levels" in seen["deepInput"]["message"]
    assert "the event's payload nests deeper than 512 levels" in seen["deepSignal"]["message"]
    assert seen["manyRefused"]["message"].startswith("item 1: a run's input must be a JSON object")
    for unknown in ("noSuchRun", "noRunner"):
        assert (seen[unknown]["error"], seen[unknown]["code"]) == ("UnknownRunError", "P0002")
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
    cancelled = await run_row(database_url, seen["other"]["runId"])
    assert cancelled["status"] == "cancelled"


async def test_a_daemon_completes_what_the_client_submits_signals_reports_and_waits_for(
    node: str, database_url: str
) -> None:
    """The client submits, signals, reports a runner's result and waits; a real worker runs them."""
    async with Daemons(database_url) as pool:
        daemon = pool.start(RELEASE, app=DETACHED_APP)
        await daemon.ready()
        seen = await run_script(node, "daemon_run.js", database_url, RELEASE_ID=RELEASE)

    plain, waiter, detached = seen["plainEnded"], seen["waiterEnded"], seen["detachedEnded"]
    # `releaseId === myRelease` in TypeScript, for the run and each attempt (issue 31 §1).
    assert seen["oneSpelling"] is True, [plain["attempts"], waiter["attempts"]]
    assert (plain["runId"], plain["status"]) == (seen["plain"]["runId"], "completed")
    assert plain["output"]["input"] == {"hello": "from-node"}
    assert seen["signalled"]["deliveredTo"] == seen["waiter"]["runId"]
    assert (waiter["status"], waiter["output"]["resumed"], waiter["output"]["by"]) == (
        "completed", True, "node",
    )  # fmt: skip
    assert seen["reported"] == {
        "runId": seen["detached"]["runId"], "runnerAttempt": 1, "recorded": True,
        "duplicate": False, "woke": True, "reason": None,
    }  # fmt: skip
    assert (seen["reportedAgain"]["duplicate"], seen["reportedAgain"]["woke"]) == (True, False)
    assert detached["status"] == "completed"
    assert (detached["output"]["result"], detached["output"]["timedOut"]) == (
        {"built": "from-node"}, False,
    )  # fmt: skip
    for report in (plain, waiter, detached):
        row = await run_row(database_url, report["runId"])
        assert (row["status"], row["output"]) == ("completed", report["output"])
        attempts = await attempt_rows(database_url, report["runId"])
        assert {a["worker_id"] for a in attempts} == {daemon.worker_id}
    runner = await fetch(
        database_url, f"select result from {SCHEMA}.runner_attempts where run_id = $1",
        uuid.UUID(detached["runId"]),
    )  # fmt: skip
    assert [r["result"] for r in runner] == [{"built": "from-node"}]


def test_the_readmes_typescript_compiles_against_the_client(node: str, tmp_path: Path) -> None:
    """Every ```ts block of the two READMEs type-checks against the client (strict tsc)."""
    blocks = [
        block
        for readme in (REPO / "README.md", CLIENT / "README.md")
        for block in re.findall(r"```ts\n(.*?)```", readme.read_text(), re.DOTALL)
    ]
    assert len(blocks) >= 3
    checked = typecheck_snippets(blocks, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
