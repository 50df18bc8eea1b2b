"""A failed attempt keeps its play's traceback (issue 31): bounded, masked, shown everywhere.

The attempt's error, the run's, ``run_status``, ``status`` (text and ``--json``),
the run page and the failure's log event carry it; the ``run.failed`` ledger
fact keeps the app's shape (name and message).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import structlog

from support.cli import lane_worker
from support.db import attempt_rows
from support.runtime import SCHEMA, open_client, open_runtime, work_once
from worker import App, TaskContext
from worker.daemon.run_page import render_run
from worker.ops.run_view import RunView, read_run
from worker.run.tracebacks import MAX_CHARS, MAX_FRAMES

RELEASE = "trace-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE, "LANE_WORKER_MAX_ATTEMPTS": "1"}
PASSWORD = "Tr4ceS3cret"


def traced_app() -> App:
    """Plays failing in a step, outside one, in a deep recursion, and quoting the password."""
    app = App()

    @app.play("in-step")
    async def in_step(ctx: TaskContext, params: Any) -> None:
        def fetch_upstream() -> None:
            raise RuntimeError("upstream <b>down</b>")

        await ctx.step("fetch", fetch_upstream)

    @app.play("outside")
    async def outside(ctx: TaskContext, params: Any) -> None:
        raise KeyError("no-such-key")

    @app.play("deep")
    async def deep(ctx: TaskContext, params: Any) -> None:
        def descend(n: int) -> int:
            return descend(n + 1) + 1

        descend(0)

    @app.play("leaky")
    async def leaky(ctx: TaskContext, params: Any) -> None:
        raise ConnectionError("could not log in as postgres:Tr4ceS3cret@db")

    return app


async def fail_once(database_url: str, play: str, *, url: str | None = None) -> dict[str, Any]:
    """Run ``play`` once on its own (one attempt: it fails); return what each place says."""
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(url or database_url, traced_app(), RELEASE) as rt,
    ):
        run_id = (await client.submit(play)).run_id
        with structlog.testing.capture_logs() as logs:
            assert await work_once(rt) == ["failed"]
        status = await client.status(run_id)
        api = json.loads(
            await rt.db.fetchval(f"select {SCHEMA}.run_status($1::uuid)::text", run_id)
        )
        fact = json.loads(
            await rt.db.fetchval(
                f"select fact::text from {SCHEMA}.ledger where run_id = $1::uuid", run_id
            )
        )
        stored = await rt.db.fetchval(
            f"select error::text from {SCHEMA}.attempts where run_id = $1::uuid", run_id
        )
        store = client.store

        async def read(conn: Any) -> RunView | None:
            return await read_run(conn, store, uuid.UUID(run_id))

        view = await client.db.run(read)
    assert view is not None
    [failed] = [e for e in logs if e["event"] == "run.failed"]
    [attempt] = await attempt_rows(database_url, run_id)
    return {
        "run_id": run_id,
        "error": status.error,
        "attempt": attempt["error"],
        "api": api["error"],
        "fact": fact["error"],
        "log": failed["error"],
        "stored": stored,
        "page": render_run(view),
    }


async def test_a_step_failure_keeps_its_traceback_everywhere_and_the_fact_its_shape(
    database_url: str,
) -> None:
    said = await fail_once(database_url, "in-step")
    traceback = said["error"]["traceback"]
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert ', in in_step\n    await ctx.step("fetch", fetch_upstream)\n' in traceback
    assert ", in fetch_upstream\n    raise RuntimeError(" in traceback
    assert traceback.endswith("RuntimeError: upstream <b>down</b>\n")
    assert __file__ in traceback  # the play's file, and its line
    # Only the play's frames: none of the worker's that ran the step between them.
    frames = [line for line in traceback.splitlines() if line.startswith('  File "')]
    assert all(__file__ in line for line in frames), traceback
    assert "frames of lane-worker's own left out)\n" in traceback
    assert said["error"]["name"] == "RuntimeError"
    assert said["error"]["message"] == "upstream <b>down</b>"
    assert said["attempt"] == said["api"] == said["log"] == said["error"]
    assert said["fact"] == {"name": "RuntimeError", "message": "upstream <b>down</b>"}
    # The run page shows it as text, in a <pre>, escaped.
    assert "<pre>Traceback (most recent call last):\n" in said["page"]
    assert "RuntimeError: upstream &lt;b&gt;down&lt;/b&gt;\n</pre>" in said["page"]
    assert "<b>down" not in said["page"]
    # `status` prints it under its own heading; --json as stored.
    text = await lane_worker(database_url, "status", said["run_id"])
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    at = lines.index("traceback")
    assert lines[at + 1] == "  Traceback (most recent call last):"
    assert lines[-1] == "  RuntimeError: upstream <b>down</b>"
    as_json = await lane_worker(database_url, "status", said["run_id"], "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["error"]["traceback"] == traceback


async def test_a_failure_outside_a_step_names_the_play_and_its_line(database_url: str) -> None:
    said = await fail_once(database_url, "outside")
    traceback = said["error"]["traceback"]
    # From the play's frame on: the worker's frames that ran it are left out.
    assert traceback.splitlines()[1].startswith(f'  File "{__file__}", line ')
    assert ', in outside\n    raise KeyError("no-such-key")\n' in traceback
    assert traceback.endswith("KeyError: 'no-such-key'\n")


async def test_a_deep_recursion_is_cut_to_the_innermost_frames_with_a_marker(
    database_url: str,
) -> None:
    said = await fail_once(database_url, "deep")
    traceback = said["error"]["traceback"]
    assert said["error"]["name"] == "RecursionError"
    assert len(traceback) <= MAX_CHARS
    assert " outer frames left out)\n" in traceback
    assert traceback.count('  File "') <= MAX_FRAMES
    assert ", in descend\n" in traceback
    assert traceback.endswith("RecursionError: maximum recursion depth exceeded\n")


async def test_the_database_password_in_a_failure_is_masked_in_store_log_and_status(
    database_url: str,
) -> None:
    with_password = database_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    assert with_password != database_url
    said = await fail_once(database_url, "leaky", url=with_password)
    said_in = "could not log in as postgres:***@db"
    assert said["error"]["message"] == said_in
    # The frame's source line quotes the password too: masked there as well.
    assert f'    raise ConnectionError("{said_in}")\n' in said["error"]["traceback"]
    assert said["error"]["traceback"].endswith(f"ConnectionError: {said_in}\n")
    for where in ("stored", "error", "attempt", "api", "log", "fact", "page"):
        assert PASSWORD not in json.dumps(said[where]), where
    as_json = await lane_worker(database_url, "status", said["run_id"], "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert PASSWORD not in as_json.stdout
    assert said_in in json.loads(as_json.stdout)["error"]["traceback"]
