"""One spelling of a release (issue 31 §1), with real daemons deployed as ``rel-a`` and ``rel-b``.

The app stamps ``rel-a`` (``launch_release_id``); before, the workers called themselves
by the lane's segment ``rel_a`` in ``lanes``, their logs, their metrics,
``adoptedReleaseId``, attempts and retries. Now every field that names a release
says ``rel-a`` / ``rel-b``, and the queue is named as a queue (``runs_rel_a``).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from support.cli import operator_env, run_cli_async
from support.daemon import Daemons
from support.db import sql, wake_nap
from support.runtime import SCHEMA, open_client

A, B = "rel-a", "rel-b"  # as deployed: DEEPLINE_RUNTIME_DEPLOY_VERSION
QUEUE_A, QUEUE_B = "runs_rel_a", "runs_rel_b"


async def http_get(port: int, path: str) -> str:
    """GET ``path`` on a daemon's health port; return the body."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return await response.text()


async def lanes_json(database_url: str) -> dict[str, dict[str, Any]]:
    """``lane-worker lanes --json``, by queue."""
    done = await run_cli_async(operator_env(database_url), "lanes", "--json")
    assert done.returncode == 0, done.stderr
    return {lane["queue"]: lane for lane in json.loads(done.stdout)["lanes"]}


async def test_every_output_names_the_release_as_deployed(database_url: str) -> None:
    """Logs, /readyz, /metrics, ``lanes --json``, ``run_status`` of an adopted run and a
    retry: ``rel-a`` and ``rel-b``, never ``rel_a``; queues stay ``runs_rel_a``."""
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A}) as client,
    ):
        a = pool.start(A, name="A")
        ready = await a.ready()
        assert (ready["release_id"], ready["queue"]) == (A, QUEUE_A)
        assert a.worker_id.startswith(f"{A}@")
        sleeper = await client.submit("sleeper", {"seconds": 3600})
        plain = await client.submit("plain", {"n": 1})
        assert (sleeper.release_id, sleeper.queue) == (A, QUEUE_A)
        started = await a.wait_for("run.started", run_id=plain.run_id)
        assert (started["release_id"], started["queue"]) == (A, QUEUE_A)
        await a.wait_for("run.completed", run_id=plain.run_id)
        await a.wait_for("run.parked", run_id=sleeper.run_id)
        assert (await client.status(plain.run_id)).output == {"input": {"n": 1}, "release": A}

        readyz = json.loads(await http_get(a.health_port, "/readyz"))
        assert (readyz["releaseId"], readyz["queue"]) == (A, QUEUE_A)
        metrics = await http_get(a.health_port, "/metrics")
        series = f'lane_worker_lane_status{{lane="{QUEUE_A}",release="{A}",status="claiming"}} 1.0'
        assert series in metrics, metrics[-3000:]
        assert 'release="rel_a"' not in metrics
        lanes = await lanes_json(database_url)
        assert lanes[QUEUE_A]["releaseId"] == A
        text = await run_cli_async(operator_env(database_url), "lanes")
        assert text.stdout.splitlines()[1].split()[:2] == [A, QUEUE_A], text.stdout

        # Roll forward: A stops and is retired, B adopts A's parked sleeper.
        a.terminate()
        assert await a.wait_exit(timeout_s=30) == 0
        # An operator who types the segment (as older builds showed it) gets the id as deployed.
        retired = await run_cli_async(
            operator_env(database_url), "lanes", "retire", "rel_a", "--json"
        )
        assert retired.returncode == 0, retired.stderr
        assert json.loads(retired.stdout)["releaseId"] == A
        b = pool.start(B, name="B")
        await b.ready()
        await b.wait_for("loop.attached", queue=QUEUE_A)
        await wake_nap(database_url, QUEUE_A, sleeper.run_id)
        adopted = await b.wait_for("run.adopted", run_id=sleeper.run_id)
        assert (adopted["release_id"], adopted["queue"]) == (B, QUEUE_A)
        assert adopted["from_release_id"] == A
        await b.wait_for("run.completed", run_id=sleeper.run_id)

        # The SQL API, as the TypeScript app reads it: adoptedReleaseId === myRelease.
        said = json.loads(
            await sql(database_url, f"select {SCHEMA}.run_status($1::uuid)::text", sleeper.run_id)
        )
        assert (said["releaseId"], said["adoptedReleaseId"], said["queue"]) == (A, B, QUEUE_A)
        assert [x["releaseId"] for x in said["attempts"]] == [A, B]
        assert [s["releaseId"] for s in said["steps"]] == [A, B]
        assert said["output"] == {"before": A, "after": B}

        # A retry goes to the claiming lane that runs its play, stamped as deployed.
        retried = await client.retry_run(plain.run_id, completed=True)
        assert (retried.release_id, retried.queue) == (B, QUEUE_B)
        await b.wait_for("run.completed", run_id=retried.run_id)
        again = await client.status(retried.run_id)
        assert again.release_id == B
        assert [x.release_id for x in again.attempts] == [B]

        lanes = await lanes_json(database_url)
        assert (lanes[QUEUE_A]["releaseId"], lanes[QUEUE_B]["releaseId"]) == (A, B)
        b.terminate()
        assert await b.wait_exit(timeout_s=30) == 0
