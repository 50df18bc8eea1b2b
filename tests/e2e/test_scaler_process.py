"""A rolling deploy driven by the scaler with the process backend: real machines, real daemons.

Release A runs on two machines with parked and waiting runs; B is deployed: the
scaler starts B's machine, retires A only once B is ready, B adopts A's parked runs,
and A's machines are stopped and removed once A is drained. Every run completes
once. A second scaler waits as a standby; a machine the scaler did not create is
never touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support import REPO
from support.daemon import base_env
from support.db import fetch
from support.runtime import SCHEMA, eventually, open_client
from worker.client import LaneClient
from worker.scaler.process import ProcessBackend

APP = "support.apps.basic:app"


def start_scaler(database_url: str, state_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "3"}
    env.pop("DEEPLINE_RUNTIME_DEPLOY_VERSION")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "scaler", "--backend", "process",
             "--state-dir", str(state_dir), "--health-port", "0"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def events(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


async def roles(client: LaneClient) -> dict[str, tuple[str, int, int]]:
    views, _ = await client.releases.list()
    return {v.release_id: (v.role, v.live_workers, v.ready_workers) for v in views}


async def test_a_rolling_deploy_with_the_process_backend(database_url: str, tmp_path: Path) -> None:
    """Deploy A (2), runs parked on A, deploy B: retire after B is ready, A removed once drained."""
    state = tmp_path / "machines"
    log = tmp_path / "scaler.log"
    backend = ProcessBackend(state, os.environ)
    scaler = start_scaler(database_url, state, log)
    standby = start_scaler(database_url, state, tmp_path / "standby.log")
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "roll-a"}) as c:
            await c.releases.deploy("roll-a", image=APP, machines=2)

            async def a_ready() -> bool:
                return (await roles(c)).get("roll-a", ("", 0, 0))[2] == 2

            await eventually(a_ready, timeout_s=60, what="A's two machines ready")
            sleepers = [(await c.submit("sleeper", {"seconds": 10})).run_id for _ in range(3)]
            waiter = (await c.submit("waiter", {})).run_id

            async def parked() -> bool:
                return all([(await c.status(r)).status == "waiting" for r in [*sleepers, waiter]])

            await eventually(parked, timeout_s=30, what="A's runs parked")

            await c.releases.deploy("roll-b", image=APP, machines=1)
            state_now = await c.releases.wait_rolled_out("roll-b", timeout_s=60)
            assert state_now.done, state_now.reason
            await c.signal(waiter, "go", {"by": "test"})
            for run_id in [*sleepers, waiter]:
                final = await c.wait(run_id, 60)
                assert final.status == "completed", (run_id, final)
            finals = [await c.status(r) for r in sleepers]

            async def a_removed() -> bool:
                return not [m for m in await backend.list() if m.release_id == "roll-a"]

            await eventually(a_removed, timeout_s=60, what="A's machines removed")
            assert [m.release_id for m in await backend.list()] == ["roll-b"]
        record = await fetch(
            database_url,
            f"select release_id, action from {SCHEMA}.deployment_events order by event_id",
        )
    finally:
        for process in (scaler, standby):
            process.send_signal(signal.SIGTERM)
        for process in (scaler, standby):
            process.wait(timeout=30)
        for m in await ProcessBackend(state, os.environ).list():
            await ProcessBackend(state, os.environ).destroy(m)
    steps = [(e["release_id"], e["action"]) for e in record]
    b_created = steps.index(("roll-b", "machine_created"))
    a_retired = steps.index(("roll-a", "retired"))
    assert b_created < a_retired  # retired only after B's machine was started (and ready)
    a_stops = [i for i, s in enumerate(steps) if s[0] == "roll-a" and s[1] == "machine_stopped"]
    assert len(a_stops) == 2
    assert min(a_stops) > a_retired
    assert [f.output["after"] for f in finals] == ["roll_b"] * 3, [
        (f.adopted_release_id, f.attempts) for f in finals
    ]  # B adopted A's parked runs
    assert all(f.output["before"] == "roll_a" for f in finals)
    # One of the two was active, the other waited as a standby.
    said = [[e.get("event") for e in events(p)] for p in (log, tmp_path / "standby.log")]
    assert sorted("scaler.standby" in s for s in said) == [False, True], said


async def test_a_release_whose_machines_cannot_boot_is_reported_and_not_recreated_every_pass(
    database_url: str, tmp_path: Path
) -> None:
    """An image (app) that does not load: deploy --wait says why; machines are retried slower."""
    state = tmp_path / "machines"
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, state, log)
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "bad"}) as c:
            await c.releases.deploy("roll-bad", image="support.apps.nowhere:app", machines=1)
            rolled = await c.releases.wait_rolled_out("roll-bad", timeout_s=12)
        created = await fetch(
            database_url,
            f"select count(*) as n from {SCHEMA}.deployment_events"
            " where action = 'machine_created'",
        )
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        for m in await ProcessBackend(state, os.environ).list():
            await ProcessBackend(state, os.environ).destroy(m)
    assert not rolled.done
    assert rolled.reason is not None
    assert "a machine refused to boot: machine m-" in rolled.reason, rolled.reason
    assert "exited 2 (its worker could not start" in rolled.reason
    said = [e for e in events(log) if e.get("event") == "scaler.machine_destroyed"]
    assert said, log.read_text()[-2000:]
    assert all(e["exit_code"] == 2 for e in said)  # the app did not load: usage error
    # 12 s of passes every 2 s would be 6 machines; doubling waits (2, 4, 8 s) allow 4.
    assert 1 <= created[0]["n"] <= 4, created
