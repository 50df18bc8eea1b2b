"""The daemon (`python -m worker run`) as a real process: boot, health, wake-up, stop, crash."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from support.daemon import Daemons, base_env, one_sentence, queue_of
from support.runtime import eventually, open_client
from worker.client import RunReport

RELEASE = "rel-a"  # as deployed (the launch stamp); the worker calls itself by it too
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
WORKER_RELEASE = RELEASE  # not the segment rel_a (issue 31 §1)
QUEUE = "runs_rel_a"


def lines_in(path: Path) -> int:
    """Return how many lines a step-execution file has (0 when missing)."""
    return len(path.read_text().splitlines()) if path.exists() else 0


async def step_started(path: Path) -> None:
    """Wait until the step recorded in ``path`` has started once."""

    async def started() -> bool:
        return lines_in(path) >= 1

    await eventually(started, what=f"{path.name} to be written")


async def http_get(port: int, path: str) -> tuple[int, str, str]:
    """GET ``path`` on the health port; return status, content type and body."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, response.content_type, await response.text()


async def test_isolated_schema_without_suffix_exits_78_before_connecting(
    database_url: str,
) -> None:
    """An isolated schema without a queue suffix is refused (78) without touching the database."""
    connections: list[object] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer.get_extra_info("peername"))  # never answers: a client hangs

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    env = {
        **base_env(f"postgresql://lane@127.0.0.1:{port}/runtime", RELEASE),
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "pr_1",
        # An hour of boot retry: a daemon that tried the database first shows.
        "LANE_WORKER_BOOT_RETRY": "3600",
    }
    env.pop("DEEPLINE_ABSURD_QUEUE_SUFFIX", None)
    try:
        async with Daemons(database_url) as pool:
            started = time.monotonic()
            daemon = pool.start_raw("isolated-no-suffix", env)
            code = await daemon.wait_exit(timeout_s=90)
            elapsed = time.monotonic() - started
            assert code == 78, daemon.tail()
            assert "DEEPLINE_ABSURD_QUEUE_SUFFIX" in one_sentence(daemon.stderr)
            # Generous: the defect (the database's boot retry first, against a server
            # that never answers) takes an hour; a busy machine only seconds.
            assert elapsed < 45, f"took {elapsed:.1f} s"
            assert not daemon.events("worker.ready")
    finally:
        server.close()
        await server.wait_closed()
    assert connections == [], "the daemon connected to the database before refusing"


@pytest.mark.timeout(150)
async def test_unreachable_database_exits_1_with_one_sentence(database_url: str) -> None:
    """A database that never answers: exit 1 with one sentence, once the boot retry is over."""
    url = "postgresql://lane:s3cret-pass@127.0.0.1:1/runtime"
    async with Daemons(database_url) as pool:
        started = time.monotonic()
        # The retry window is a setting (default 60 s): one second here.
        env = {**base_env(url, RELEASE), "LANE_WORKER_BOOT_RETRY": "1"}
        daemon = pool.start_raw("no-database", env)
        code = await daemon.wait_exit(timeout_s=120)
        elapsed = time.monotonic() - started
        print(f"unreachable database: exit {code} after {elapsed:.1f} s")
        assert code == 1, daemon.tail()
        sentence = one_sentence(daemon.stderr)
        assert "s3cret-pass" not in daemon.stderr
        assert "s3cret-pass" not in "\n".join(json.dumps(r) for r in daemon.records)
        assert "after 1 s" in sentence, sentence
        assert not daemon.events("worker.ready")


async def test_busy_health_port_exits_1_naming_the_variable(database_url: str) -> None:
    """A health port another process holds: exit 1, one sentence naming the variable, not the DB."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 (the daemon binds all interfaces too)
        holder.listen()
        port = holder.getsockname()[1]
        async with Daemons(database_url) as pool:
            daemon = pool.start(RELEASE, LANE_WORKER_HEALTH_PORT=str(port))
            code = await daemon.wait_exit(timeout_s=60)
    assert code == 1, daemon.tail()
    sentence = one_sentence(daemon.stderr)
    assert "LANE_WORKER_HEALTH_PORT" in sentence
    assert str(port) in sentence
    assert "database" not in sentence
    assert not daemon.events("worker.ready")


async def test_ready_daemon_serves_health_readiness_and_metrics(empty_database_url: str) -> None:
    """/healthz 200, /readyz 200 with JSON, /metrics with lane_worker_ metrics, /lanes.

    On a database without the schemas: boot installs them before it is ready.
    """
    async with Daemons(empty_database_url) as pool:
        daemon = pool.start(RELEASE)
        ready = await daemon.ready()
        assert ready["release_id"] == WORKER_RELEASE
        assert ready["queue"] == QUEUE
        assert ready["schema"] == "runtime_scheduler"
        assert ready["concurrency"] == 8
        assert ready["worker_id"]
        assert isinstance(ready["health_port"], int)
        assert ready["health_port"] > 0
        assert ready["level"] == "info"
        assert ready["timestamp"]
        assert ready["event_loop"] == "uvloop"  # the default, where it can be imported

        status, _, _ = await http_get(daemon.health_port, "/healthz")
        assert status == 200
        status, content_type, body = await http_get(daemon.health_port, "/readyz")
        assert status == 200
        assert content_type == "application/json"
        print(f"/readyz: {body}")
        assert isinstance(json.loads(body), dict)
        status, content_type, body = await http_get(daemon.health_port, "/metrics")
        assert status == 200
        assert content_type.startswith("text/plain")
        names = {
            line.split("{")[0].split(" ")[0]
            for line in body.splitlines()
            if line and not line.startswith("#")
        }
        ours = {name for name in names if name.startswith("lane_worker_")}
        assert ours, f"no lane_worker_ metric in:\n{body[:2000]}"
        # The drain report per lane, as of this scrape: an operator can alert on it.
        for series in (
            f'lane_worker_lane_status{{lane="{QUEUE}",release="{WORKER_RELEASE}",'
            'status="claiming"} 1.0',
            f'lane_worker_lane_live_workers{{lane="{QUEUE}",release="{WORKER_RELEASE}"}} 1.0',
            f'lane_worker_lane_stranded{{lane="{QUEUE}",release="{WORKER_RELEASE}"}} 0.0',
            f'lane_worker_lane_open_runs{{bucket="fresh",lane="{QUEUE}",'
            f'release="{WORKER_RELEASE}"}} 0.0',
        ):
            assert series in body, (series, body[-3000:])
        assert 'lane_worker_build_info{version="' in body

        status, content_type, body = await http_get(daemon.health_port, "/lanes")
        assert status == 200
        assert content_type == "application/json"
        lane = {v["queue"]: v for v in json.loads(body)["lanes"]}[QUEUE]
        assert lane["status"] == "claiming"
        assert lane["liveWorkers"] == 1
        status, _, body = await http_get(daemon.health_port, "/lanes?format=text")
        assert status == 200
        assert body.splitlines()[0].split()[:3] == ["RELEASE", "QUEUE", "STATUS"]
        assert QUEUE in body

        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 0
        assert daemon.events("worker.stopped")


async def test_submit_wakes_an_idle_worker_at_once(database_url: str) -> None:
    """With an hour's poll interval, a submit starts the run: its NOTIFY woke the worker."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        # An hour, so a worker the submit did not wake shows as one that never starts
        # the run (the wait below fails), not as a second or two a busy machine adds.
        daemon = pool.start(RELEASE, LANE_WORKER_POLL_INTERVAL="3600")
        await daemon.ready()
        # The scenario, not synchronisation: let the worker go idle in its poll wait.
        await asyncio.sleep(1.5)
        submitted_at = time.monotonic()
        run = await client.submit("plain", {"n": 1})
        started = await daemon.wait_for("run.started", run_id=run.run_id, timeout_s=60)
        latency = started["_mono"] - submitted_at
        print(f"idle wake: run.started {latency * 1000:.0f} ms after submit")
        assert started["release_id"] == WORKER_RELEASE
        assert started["queue"] == QUEUE
        assert started["worker_id"] == daemon.worker_id
        await daemon.wait_for("run.completed", run_id=run.run_id)
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert status.output == {"input": {"n": 1}, "release": WORKER_RELEASE}
        # Counted once each, under the labels the alerts name.
        _, _, body = await http_get(daemon.health_port, "/metrics")
        for series in (
            'lane_worker_claims_total{disposition="own",loop="own"} 1.0',
            'lane_worker_attempts_total{outcome="completed"} 1.0',
            'lane_worker_runs_total{status="completed"} 1.0',
        ):
            assert series in body, (series, body[-3000:])
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 0


@pytest.mark.parametrize("how", ["asked for", "uvloop missing"])
async def test_the_daemon_runs_on_asyncios_loop_when_asked_or_without_uvloop(
    database_url: str, tmp_path: Path, how: str
) -> None:
    """LANE_WORKER_EVENT_LOOP=asyncio, or uvloop not importable: asyncio's loop runs the runs.

    Without uvloop (a platform with no wheel of it) the daemon says so once and runs.
    """
    env: dict[str, str] = {}
    if how == "asked for":
        env["LANE_WORKER_EVENT_LOOP"] = "asyncio"
    else:
        (tmp_path / "uvloop.py").write_text('raise ImportError("no uvloop here")\n')
        env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{base_env(database_url, RELEASE)['PYTHONPATH']}"
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        daemon = pool.start(RELEASE, **env)
        ready = await daemon.ready()
        assert ready["event_loop"] == "asyncio"
        fallback = daemon.events("event_loop.fallback")
        if how == "asked for":
            assert fallback == []
        else:
            (said,) = fallback
            assert (said["level"], said["wanted"], said["using"]) == (
                "warning",
                "uvloop",
                "asyncio",
            )
            assert "no uvloop here" in said["error"]
        run = await client.submit("plain", {"n": 2})
        await daemon.wait_for("run.completed", run_id=run.run_id, timeout_s=60)
        assert (await client.status(run.run_id)).status == "completed"
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 0


def engine_attempts(status: RunReport) -> list[int]:
    """Return the engine attempt number of every attempt row."""
    return [a.attempt for a in status.attempts]


async def test_sigterm_mid_step_hands_the_run_back_without_spending_an_attempt(
    database_url: str, tmp_path: Path
) -> None:
    """SIGTERM during a long step: exit 0 after the drain, run handed back, finished elsewhere."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        first = pool.start(RELEASE, name="first", LANE_WORKER_DRAIN_SECONDS="2")
        await first.ready()
        # The step would take an hour: a stop that waited for it shows as an hour.
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 3600})
        await step_started(tmp_path / "two.log")
        signalled = time.monotonic()
        first.terminate()
        await first.wait_for("worker.stopping", timeout_s=60)
        ready_status = await _readyz_or_none(first.health_port)
        assert await first.wait_exit(timeout_s=60) == 0
        took = time.monotonic() - signalled
        print(f"SIGTERM mid-step, drain 2 s: exit 0 after {took:.1f} s; /readyz {ready_status}")
        # The drain's promise, judged generously (30x its 2 s): the defect, a stop
        # that waits for the step, takes an hour, and wait_exit above fails first.
        assert took < 60
        assert ready_status in (None, 503), f"/readyz during the drain answered {ready_status}"
        handed = await first.wait_for("run.handed_back", run_id=run.run_id, timeout_s=1)
        assert handed["release_id"] == WORKER_RELEASE
        assert first.events("worker.stopped")

        status = await client.status(run.run_id)
        assert [(a.disposition, a.outcome) for a in status.attempts] == [("own", "handed_back")]
        assert status.status == "queued"

        second = pool.start(RELEASE, name="second")
        await second.ready()
        await second.wait_for("run.completed", run_id=run.run_id, timeout_s=60)
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert [(a.worker_id, a.disposition, a.outcome) for a in status.attempts] == [
            (first.worker_id, "own", "handed_back"),
            (second.worker_id, "own", "completed"),
        ]
        assert engine_attempts(status) == [1, 1]
        assert status.facts == ("run.completed",)
        assert lines_in(tmp_path / "one.log") == 1
        assert lines_in(tmp_path / "two.log") == 2
        second.terminate()
        assert await second.wait_exit(timeout_s=60) == 0
        assert first.malformed_lines() == []
        assert second.malformed_lines() == []


async def test_a_second_sigterm_exits_at_once_with_1(database_url: str, tmp_path: Path) -> None:
    """SIGTERM twice: the second cuts the drain short, exit 1, the run left to its lease."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        # An hour's drain and step: only the second signal can end the process within
        # the wait below, however busy the machine.
        daemon = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="3600")
        await daemon.ready()
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 3600})
        await step_started(tmp_path / "two.log")
        daemon.terminate()
        await daemon.wait_for("worker.stopping", timeout_s=60)
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 1
        assert daemon.events("worker.exit_now")
        assert not daemon.events("run.handed_back")
        assert not daemon.events("worker.stopped")
        status = await client.status(run.run_id)
    # Not handed back: the run stays claimed until its lease expires (as after SIGKILL).
    assert status.status == "running"
    assert [a.outcome for a in status.attempts] == [None]


async def test_sigterm_lets_a_short_run_finish_and_claims_nothing_new(
    database_url: str, tmp_path: Path
) -> None:
    """SIGTERM with a run finishing inside the drain window: it completes here, then exit 0."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        # A drain far longer than the 2 s step, so a busy machine cannot run it out.
        daemon = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="300")
        await daemon.ready()
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 2})
        await step_started(tmp_path / "two.log")
        daemon.terminate()
        await daemon.wait_for("worker.stopping", timeout_s=60)
        late = await client.submit("plain", {"late": True})
        assert await daemon.wait_exit(timeout_s=60) == 0
        stopping = daemon.index_of("worker.stopping")
        completed = daemon.index_of("run.completed", run_id=run.run_id)
        assert 0 <= stopping < completed, "the in-flight run did not finish during the drain"

        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert [(a.worker_id, a.outcome) for a in status.attempts] == [
            (daemon.worker_id, "completed")
        ]
        late_status = await client.status(late.run_id)
        assert late_status.status == "queued", "a draining worker claimed a new run"
        assert late_status.attempts == ()


async def test_sigkill_mid_step_resumes_elsewhere_from_the_last_committed_step(
    database_url: str, tmp_path: Path
) -> None:
    """SIGKILL during step two: the lease expires, another daemon re-runs only step two."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        victim = pool.start(RELEASE, name="victim", LANE_WORKER_CLAIM_TIMEOUT="5")
        await victim.ready()
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 60})
        await step_started(tmp_path / "two.log")
        victim.kill()
        assert await victim.wait_exit(timeout_s=60) == -9
        killed = time.monotonic()

        survivor = pool.start(RELEASE, name="survivor", LANE_WORKER_CLAIM_TIMEOUT="5")
        await survivor.ready()
        await survivor.wait_for("run.completed", run_id=run.run_id, timeout_s=60)
        print(f"SIGKILL: run completed by another daemon {time.monotonic() - killed:.1f} s later")
        status = await client.status(run.run_id)
        assert status.status == "completed"
        assert status.output == {"one": WORKER_RELEASE, "two": WORKER_RELEASE}
        assert status.facts == ("run.completed",)
        assert lines_in(tmp_path / "one.log") == 1
        assert lines_in(tmp_path / "two.log") == 2
        assert status.attempts[-1].worker_id == survivor.worker_id
        assert status.attempts[-1].outcome == "completed"
        assert status.attempts[0].worker_id == victim.worker_id
        survivor.terminate()
        assert await survivor.wait_exit(timeout_s=60) == 0


async def test_retired_own_lane_refuses_boot(database_url: str) -> None:
    """A daemon of a retired release exits 78 and names `lane-worker lanes activate`."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        assert await client.retire_release(RELEASE, force=True) == queue_of(RELEASE)
        daemon = pool.start(RELEASE)
        code = await daemon.wait_exit(timeout_s=60)
        assert code == 78, daemon.tail()
        sentence = one_sentence(daemon.stderr)
        assert any(f"lane-worker lanes activate {r}" in sentence for r in (RELEASE, WORKER_RELEASE))
        assert not daemon.events("worker.ready")
        by_queue = {lane.queue: lane for lane in await client.lanes()}
        assert by_queue[QUEUE].status in ("retired", "drained")


async def _readyz_or_none(port: int) -> int | None:
    """Return the /readyz status, or None when the server is already gone."""
    try:
        status, _, _ = await http_get(port, "/readyz")
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    return status
