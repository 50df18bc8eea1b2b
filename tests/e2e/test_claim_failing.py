"""A real daemon whose claim function breaks: not ready, `lanes` says why, and it recovers.

The claim function is replaced with one that raises, as an older build's
install replaced it (issue 29): every claim of the daemon's own loop fails. The
daemon's threshold is its own (20 s after the first failure); every wait here
is on a condition.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from support.claims import BROKEN_REASON, break_claims, restore_claims
from support.cli import lane_worker, lane_worker_json
from support.daemon import Daemons, queue_of
from support.runtime import connect, eventually, open_client
from worker.version import VERSION

RELEASE = "rel-a"
QUEUE = queue_of(RELEASE)
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
GAUGE = f'lane_worker_loop_claim_failing{{loop="own",queue="{QUEUE}"}}'


async def get(port: int, path: str) -> tuple[int, str, Any]:
    """GET ``path`` on the health port: status, text, and JSON when it is JSON."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        text = await response.text()
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, text, body


async def lane(database_url: str) -> dict[str, Any]:
    """The daemon's lane in `lane-worker lanes --json`."""
    report = await lane_worker_json(database_url, "lanes")
    [found] = [row for row in report["lanes"] if row["queue"] == QUEUE]
    return dict(found)


def gauge(metrics: str) -> float | None:
    """The own loop's lane_worker_loop_claim_failing sample."""
    values = [line.split()[-1] for line in metrics.splitlines() if line.startswith(GAUGE + " ")]
    return float(values[0]) if values else None


async def test_a_daemon_whose_claims_keep_failing_is_not_ready_until_they_succeed_again(
    database_url: str,
) -> None:
    """/readyz 503 with the reason, `lanes` shows the worker not claiming, the gauge is 1."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        daemon = pool.start(RELEASE)
        await daemon.ready()
        port = daemon.health_port

        async def ready() -> bool:
            status, _, body = await get(port, "/readyz")
            return status == 200 and body["notClaiming"] == []

        await eventually(ready, what="the daemon to be ready")
        [worker] = (await lane(database_url))["workers"]
        assert (worker["workerId"], worker["version"]) == (daemon.worker_id, VERSION)
        assert (worker["claiming"], worker["notClaiming"]) == (True, [])

        conn = await connect(database_url)
        try:
            originals = await break_claims(conn)
            # Its NOTIFY wakes the loop, whose claim then fails, and fails again.
            run = await client.submit("plain", {"while": "broken"})

            async def unready() -> Any:
                status, _, body = await get(port, "/readyz")
                return body if status == 503 else None

            body = await eventually(unready, timeout_s=60, what="/readyz to turn 503")
            [failing] = body["notClaiming"]
            assert (failing["queue"], failing["loop"]) == (QUEUE, "own")
            assert BROKEN_REASON in failing["reason"]
            assert failing["failingForSeconds"] >= 20
            assert body["database"] is True

            async def not_claiming() -> dict[str, Any] | None:
                shown = await lane(database_url)
                return None if shown["workers"][0]["claiming"] else shown

            shown = await eventually(not_claiming, what="lanes --json to say not claiming")
            [worker] = shown["workers"]
            [said] = worker["notClaiming"]
            assert (said["queue"], said["loop"]) == (QUEUE, "own")
            assert BROKEN_REASON in said["reason"]
            # A live worker that claims nothing: the lane's fresh run is stranded.
            assert (shown["liveWorkers"], shown["claimingWorkers"]) == (1, 0)
            assert shown["stranded"] is True
            [fresh] = [b for b in shown["blockedBy"] if b["reason"] == "fresh"]
            assert "not claiming" in fresh["remedy"]
            assert run.run_id in fresh["runIds"]
            table = await lane_worker(database_url, "lanes")
            assert f"worker {daemon.worker_id} ({VERSION}) is not claiming" in table.stdout
            assert BROKEN_REASON in table.stdout
            _, metrics, _ = await get(port, "/metrics")
            assert gauge(metrics) == 1
            assert (await client.status(run.run_id)).status == "queued"

            await restore_claims(conn, originals)
            # The loop's next try (its backoff is at most 15 s) claims and runs it.
            await daemon.wait_for("run.completed", run_id=run.run_id, timeout_s=40)
            await eventually(ready, what="/readyz to turn 200 again")

            async def claiming() -> bool:
                shown = await lane(database_url)
                return bool(shown["workers"][0]["claiming"]) and not shown["stranded"]

            await eventually(claiming, what="lanes --json to say claiming again")
            _, metrics, _ = await get(port, "/metrics")
            assert gauge(metrics) == 0
        finally:
            await conn.close()
