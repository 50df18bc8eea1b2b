"""A worker whose claims keep failing is not ready, and says so on /readyz, /metrics and the report.

The supervisor runs in this process against a real database; the claim function
is replaced with one that raises, as an older build's install did (issue 29),
then put back. The threshold is cut to 1 s here; the real daemon's 20 s is
tested in ``tests/e2e/test_claim_failing.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from support.apps.basic import app
from support.claims import BROKEN_REASON, break_claims, restore_claims
from support.runtime import connect, eventually, open_client
from worker.config.settings import Settings
from worker.daemon.supervisor import Supervisor
from worker.run import claim_health
from worker.version import VERSION

RELEASE = "rel-a"
QUEUE = "runs_rel_a"


@asynccontextmanager
async def supervisor(database_url: str, release: str = RELEASE) -> AsyncIterator[Supervisor]:
    """A daemon of ``release`` in this process, ready; drained on the way out."""
    settings = Settings.from_env({
        "WORKFLOW_RUNTIME_POSTGRES": database_url,
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": release,
        "LANE_WORKER_HEALTH_PORT": "0",
        "LANE_WORKER_HEALTH_HOST": "127.0.0.1",
        "LANE_WORKER_POLL_INTERVAL": "0.5",
        "LANE_WORKER_DRAIN_SECONDS": "1",
    })  # fmt: skip
    sup = Supervisor(settings, app)
    main = asyncio.ensure_future(sup.main())

    async def ready() -> bool:
        assert not main.done(), main.result()
        return sup.ready.is_set()

    try:
        await eventually(ready, what="the worker to be ready")
        yield sup
    finally:
        sup.request_stop()
        await asyncio.wait_for(main, 30)


async def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on the health port; return the status and the body."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """GET /readyz; return its status and JSON body."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return response.status, await response.json()


async def own_worker(database_url: str) -> dict[str, Any]:
    """The one live worker of RELEASE's lane, as `lanes --json` lists it."""
    async with open_client(database_url) as client:
        [lane] = [v.as_json() for v in await client.lanes() if v.queue == QUEUE]
    [worker] = lane["workers"]
    return {**worker, "lane": lane}


def gauge(text: str, name: str) -> float | None:
    """The value of the own loop's sample of ``name`` in a /metrics page."""
    prefix = f'{name}{{loop="own",queue="{QUEUE}"}} '
    values = [line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)]
    return float(values[0]) if values else None


async def test_a_loop_whose_claims_keep_failing_is_not_ready_until_a_claim_succeeds(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/readyz 503 with the loop and reason, the worker row says not claiming, the gauge is 1."""
    monkeypatch.setattr(claim_health, "FAILING_AFTER_S", 1.0)
    conn = await connect(database_url)
    try:
        async with supervisor(database_url) as sup:
            assert sup.health_port is not None
            port = sup.health_port
            status, body = await readyz(port)
            assert (status, body["notClaiming"]) == (200, [])
            worker = await own_worker(database_url)
            assert (worker["version"], worker["claiming"]) == (VERSION, True)

            originals = await break_claims(conn)

            async def unready() -> dict[str, Any] | None:
                sup.wakeups.poke(QUEUE)  # claim now rather than at the end of the backoff
                status, body = await readyz(port)
                return body if status == 503 else None

            body = await eventually(unready, what="/readyz to turn 503")
            [failing] = body["notClaiming"]
            assert (failing["queue"], failing["loop"]) == (QUEUE, "own")
            assert failing["failures"] >= claim_health.FAILING_AFTER_CLAIMS
            assert BROKEN_REASON in failing["reason"]
            assert body["ready"] is False
            assert body["database"] is True

            async def stuck() -> dict[str, Any] | None:
                worker = await own_worker(database_url)
                return None if worker["claiming"] else worker

            worker = await eventually(stuck, what="the worker row to say not claiming")
            [said] = worker["notClaiming"]
            assert (said["queue"], said["loop"]) == (QUEUE, "own")
            assert BROKEN_REASON in said["reason"]
            assert said["failingForSeconds"] >= 0
            lane = worker["lane"]
            assert (lane["liveWorkers"], lane["claimingWorkers"]) == (1, 0)
            _, metrics = await get(port, "/metrics")
            assert gauge(metrics, "lane_worker_loop_claim_failing") == 1
            seconds = gauge(metrics, "lane_worker_loop_claim_failing_seconds")
            assert seconds is not None
            assert seconds >= 1
            _, text = await get(port, "/lanes?format=text")
            said_of = (
                f"{lane['releaseId']}: worker {worker['workerId']} ({VERSION}) is not claiming"
            )
            assert said_of in text

            await restore_claims(conn, originals)

            async def ready_again() -> bool:
                sup.wakeups.poke(QUEUE)
                status, body = await readyz(port)
                return status == 200 and body["notClaiming"] == []

            await eventually(ready_again, what="/readyz to recover")

            async def claiming() -> bool:
                return bool((await own_worker(database_url))["claiming"])

            await eventually(claiming, what="the worker row to say claiming again")
            _, metrics = await get(port, "/metrics")
            assert gauge(metrics, "lane_worker_loop_claim_failing") == 0
            assert gauge(metrics, "lane_worker_loop_claim_failing_seconds") == 0
    finally:
        await conn.close()


async def test_a_continuation_loop_that_cannot_claim_counts_too(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B's loop on retired A's queue fails like its own: both are listed, both recover."""
    monkeypatch.setattr(claim_health, "FAILING_AFTER_S", 1.0)
    async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}) as client:
        await client.activate_release(RELEASE, force=True)  # A's lane, older than B's
        await client.submit("plain")
        await client.retire_release(RELEASE)
    conn = await connect(database_url)
    try:
        async with supervisor(database_url, "rel-b") as sup:
            assert sup.health_port is not None
            port = sup.health_port

            async def attached() -> bool:
                return QUEUE in sup.loops.continuations()

            await eventually(attached, what="B's continuation loop on A's queue")
            originals = await break_claims(conn)

            async def both_failing() -> list[tuple[str, str]] | None:
                for queue in (QUEUE, "runs_rel_b"):
                    sup.wakeups.poke(queue)
                _, body = await readyz(port)
                loops = sorted((f["queue"], f["loop"]) for f in body["notClaiming"])
                return loops if len(loops) == 2 else None

            loops = await eventually(both_failing, what="both loops to be not claiming")
            assert loops == [(QUEUE, "continuation"), ("runs_rel_b", "own")]
            await restore_claims(conn, originals)

            async def ready_again() -> bool:
                for queue in (QUEUE, "runs_rel_b"):
                    sup.wakeups.poke(queue)
                status, body = await readyz(port)
                return status == 200 and body["notClaiming"] == []

            await eventually(ready_again, what="/readyz to recover")
    finally:
        await conn.close()
