"""Rows a worker cannot read, written before the SQL API checked them, beside ordinary runs.

An input nested 3,000 levels deep, one holding a 5,001-digit number, and a
3,000-deep signal payload emitted straight to the engine for a parked run: each
is written directly (as an older store let them in), then a real daemon claims
them in one batch with ordinary runs. Each bad run fails alone, at once, saying
why; the ordinary runs complete; the operator's commands and the run page work
on the bad rows (issue 29 §3).
"""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp

from support.cli import lane_worker, lane_worker_json, one_error_line
from support.daemon import Daemons, queue_of
from support.db import execute, statuses
from support.runtime import SCHEMA, eventually, open_client

REL = "unreadable-1"
DEEP = "[" * 3000 + "]" * 3000
DIGITS = "1" * 5001


async def overwrite_input(database_url: str, run_id: str, text: str) -> None:
    """Write a run's input straight to its row, past submit_run's checks."""
    await execute(
        database_url,
        f"update {SCHEMA}.runs set input = $2::text::jsonb where run_id = $1",
        uuid.UUID(run_id),
        '{"v": ' + text + "}",
    )


async def status_of(database_url: str, run_id: str) -> dict[str, Any]:
    """`lane-worker status RUN --json`, which must succeed."""
    status: dict[str, Any] = await lane_worker_json(database_url, "status", run_id)
    return status


async def page(port: int, run_id: str) -> tuple[int, str]:
    """GET the run page of ``run_id``."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{port}/runs/{run_id}") as response,
    ):
        return response.status, await response.text()


async def test_unreadable_rows_fail_alone_and_every_remedy_works(database_url: str) -> None:
    """Bad rows fail their own runs with the reason; the batch beside them completes."""
    env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": REL, "LANE_WORKER_MAX_ATTEMPTS": "5"}
    async with Daemons(database_url) as pool, open_client(database_url, env) as client:
        # A run parked on an event, then an event emitted straight to the engine
        # with a payload no worker can read (and its signal row, as signal_run writes).
        first = pool.start(REL, LANE_WORKER_CONCURRENCY="16")
        waiter = (await client.submit("waiter", {})).run_id
        await first.wait_for("run.parked", run_id=waiter, timeout_s=60)
        first.terminate()
        assert await first.wait_exit() == 0
        await execute(
            database_url,
            f"insert into {SCHEMA}.signals (run_id, event_key, payload)"
            " values ($1, 'go', $2::text::jsonb)",
            uuid.UUID(waiter),
            DEEP,
        )
        await execute(
            database_url,
            "select absurd.emit_event($1, $2, $3::text::jsonb)",
            queue_of(REL),
            f"evt:{waiter}:go",
            DEEP,
        )
        ordinary = [(await client.submit("plain", {"n": n})).run_id for n in range(6)]
        deep = (await client.submit("plain", {})).run_id
        digits = (await client.submit("plain", {})).run_id
        await overwrite_input(database_url, deep, DEEP)
        await overwrite_input(database_url, digits, DIGITS)

        # One daemon claims them all in one batch.
        second = pool.start(REL, LANE_WORKER_CONCURRENCY="16")
        for run_id in ordinary:
            await second.wait_for("run.completed", run_id=run_id, timeout_s=60)
        for run_id in (deep, digits, waiter):
            await second.wait_for("run.failed_for_good", run_id=run_id, timeout_s=60)
        assert second.events("loop.claim_failed") == []
        found = await statuses(database_url, [*ordinary, deep, digits, waiter])
        assert [found[r] for r in ordinary] == ["completed"] * 6
        assert (found[deep], found[digits], found[waiter]) == ("failed", "failed", "failed")

        # Each says why, in `status --json`, on the one attempt that met the value
        # (the waiter's first attempt parked; the engine keeps the payload it woke
        # with among the run's checkpoints).
        reasons = {}
        for run_id, attempts in ((deep, 1), (digits, 1), (waiter, 2)):
            status = await status_of(database_url, run_id)
            assert len(status["claims"]) == attempts, status
            reasons[run_id] = status["error"]["message"]
        assert "its input cannot be read back" in reasons[deep]
        assert "nested too deeply" in reasons[deep]
        assert "integer of more than 4300 digits" in reasons[digits]
        assert "its checkpoints cannot be read back" in reasons[waiter]
        assert "nested too deeply" in reasons[waiter]

        # The run page reads the row and shows why it failed.
        code, html = await page(second.health_port, deep)
        assert code == 200
        assert "its input cannot be read back" in html

        # With no worker left, an open run with an unreadable input: listed,
        # failed by the operator, and a retry refused with a sentence (it would
        # fail the same way).
        second.terminate()
        assert await second.wait_exit() == 0
        idle = (await client.submit("plain", {})).run_id
        await overwrite_input(database_url, idle, DEEP)
        listed = await lane_worker_json(database_url, "runs")
        assert {deep, digits, waiter, idle} <= {r["runId"] for r in listed["runs"]}
        done = await lane_worker(database_url, "runs", "fail", idle, "--reason", "bad input")
        assert done.returncode == 0, done.stderr
        retried = await lane_worker(database_url, "runs", "retry", deep)
        assert retried.returncode == 1
        line = one_error_line(retried)
        assert "cannot be retried" in line
        assert "unexpected" not in line

        async def idle_failed() -> bool:
            return (await statuses(database_url, [idle]))[idle] == "failed"

        await eventually(idle_failed, what="the idle run failed by the operator")
