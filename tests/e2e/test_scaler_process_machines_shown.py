"""`lane-worker releases` shows each process machine's health port and log; the scaler's
/metrics has its own families only (issue 31).

The process backend's machines each pick a free health port: without it shown, an
operator had to read a machine's log to find its page. The scaler served every
family of a worker's too (claims, attempts, lanes), never set: zeros on a dashboard.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aiohttp

from support.cli import lane_worker, lane_worker_json
from support.db import execute
from support.machines import destroy_all, store_backend
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import events, machine_health_port, passes_seen, start_scaler
from worker.scaler.process import health_port_in

APP = "support.apps.basic:app"
RELEASE = "shown-a"


async def test_releases_shows_each_machines_health_port_and_logs(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    scaler = start_scaler(database_url, state, tmp_path / "scaler.log")
    try:
        async with open_client(database_url, {}) as c:
            await c.releases.deploy(RELEASE, image=APP, machines=1)
            rolled = await c.releases.wait_rolled_out(RELEASE, timeout_s=60)
            assert rolled.done, rolled.reason

            async def shown() -> dict[str, Any] | None:
                said = await lane_worker_json(database_url, "releases")
                [release] = said["releases"]
                machines = release["scaler"].get("machines") or []
                return machines[0] if machines and machines[0]["healthPort"] else None

            machine = await eventually(shown, timeout_s=60, what="the machine's port shown")
            assert machine["state"] == "started"
            assert machine["healthPort"] == machine_health_port(state, machine["id"])
            assert machine["logs"] == str(state / f"{machine['id']}.log")
            url = f"http://127.0.0.1:{machine['healthPort']}/healthz"
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                assert response.status == 200
            text = await lane_worker(database_url, "releases")
            assert text.returncode == 0, text.stderr
            line = (
                f"{RELEASE} machine {machine['id']}: started, health port "
                f"{machine['healthPort']}; logs: {machine['logs']}"
            )
            assert line in text.stdout.splitlines(), text.stdout
            metrics = await scaler_metrics(tmp_path / "scaler.log")
            families = {
                line.split()[2] for line in metrics.splitlines() if line.startswith("# TYPE")
            }
            assert "lane_worker_scaler_machines_running" in families, families
            assert f'lane_worker_scaler_machines_running{{release="{RELEASE}"}} 1.0' in metrics
            worker_only = {"lane_worker_claims", "lane_worker_attempts", "lane_worker_lanes",
                           "lane_worker_lane_open_runs", "lane_worker_runs_in_flight"}  # fmt: skip
            assert not families & worker_only, families
            assert families - {"lane_worker_build_info"} == {
                f for f in families if f.startswith("lane_worker_scaler_")
            }, families
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await destroy_all(state)


async def scaler_metrics(log: Path) -> str:
    """The scaler's /metrics page (its port from its `scaler.started` line)."""
    port = next(e["health_port"] for e in events(log) if e.get("event") == "scaler.started")
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return await response.text()


def test_the_port_is_read_from_a_json_or_a_console_log(tmp_path: Path) -> None:
    log = tmp_path / "m.log"
    assert health_port_in(log) is None  # not written yet
    log.write_text('{"event": "worker.starting", "health_port": 1}\n')
    assert health_port_in(log) is None  # not ready yet
    log.write_text('{"health_port": 8123, "event": "worker.ready"}\n')
    assert health_port_in(log) == 8123
    log.write_text("2026-01-01 [info] worker.ready  concurrency=8 health_port=45001 listen=True\n")
    assert health_port_in(log) == 45001


async def test_machines_left_running_by_a_stopped_scaler_are_shown(
    database_url: str, tmp_path: Path
) -> None:
    """The process backend's machines outlive the scaler by design (issue 31): its stop says
    which it leaves running, and `releases` keeps showing them as its last listing."""
    state = tmp_path / "machines"
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, state, log)
    try:
        async with open_client(database_url, {}) as c:
            await c.releases.deploy("left-a", image=APP, machines=1)
            rolled = await c.releases.wait_rolled_out("left-a", timeout_s=60)
            assert rolled.done, rolled.reason
            await passes_seen(database_url, 1)  # a pass that listed it started
            scaler.send_signal(signal.SIGTERM)
            assert scaler.wait(timeout=30) == 0
            backend = await store_backend(database_url, state)
            [machine] = [m for m in await backend.list() if m.running]
            # The scaler's word goes stale as if its last pass were a minute ago.
            await execute(
                database_url,
                f"update {SCHEMA}.scaler_state set beat_at = now() - interval '1 minute'",
            )
            text = await lane_worker(database_url, "releases")
            said = await lane_worker_json(database_url, "releases")
    finally:
        if scaler.poll() is None:
            scaler.send_signal(signal.SIGTERM)
            scaler.wait(timeout=30)
        await destroy_all(state)
    [stopped] = [e for e in events(log) if e.get("event") == "scaler.stopped"]
    assert stopped["machines_left_running"] == [machine.machine_id], stopped
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert any(
        line.startswith(f"left-a machine {machine.machine_id}: started (as the scaler last listed")
        for line in lines
    ), text.stdout
    assert "none active: the machines it started keep running" in text.stdout, text.stdout
    [release] = said["releases"]
    assert [m["id"] for m in release["scaler"]["machines"]] == [machine.machine_id]
    assert release["scaler"]["lastListedSecondsAgo"] >= 60
