"""What the scaler must never do, with real scalers and real machines (process backend).

A machine it stops drains its step in flight: the stop is sent once (a second
stop signal makes a worker exit at once). An active scaler that hangs loses its
lock to the standby within the lease, and when it wakes it acts on nothing and
writes nothing over what the new active scaler says.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support import REPO, step_logged
from support.daemon import base_env
from support.db import fetch
from support.machines import destroy_all
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import events, machine_events, scaler_running, start_scaler
from worker.scaler.run import LEASE_S

APP = "support.apps.basic:app"


async def test_a_machine_scaled_away_finishes_its_step_stopped_once(
    database_url: str, tmp_path: Path
) -> None:
    """Scale a release down while its machine runs a long step: the worker gets one stop
    signal over many passes, finishes the step once, and the run completes in one attempt."""
    state = tmp_path / "machines"
    steps = tmp_path / "steps"
    steps.mkdir()
    async with (
        scaler_running(database_url, state, tmp_path / "scaler.log",
                       LANE_WORKER_DRAIN_SECONDS="40"),
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "once"}) as c,
    ):  # fmt: skip
        await c.releases.deploy("once", image=APP, machines=1)
        rolled = await c.releases.wait_rolled_out("once", timeout_s=60)
        assert rolled.done, rolled.reason
        run_id = (await c.submit("slow", {"dir": str(steps), "seconds": 10})).run_id

        async def step_two_running() -> bool:
            return step_logged(steps / "two.log")

        await eventually(step_two_running, timeout_s=30, what="step two running")
        await c.releases.deploy("once", image=APP, machines=0)  # scaled away mid-step
        final = await c.wait(run_id, 60)
    created = await machine_events(database_url, "once", "machine_created")
    stopped = await machine_events(database_url, "once", "machine_stopped")
    assert final.status == "completed", final
    assert [(a.disposition, a.outcome) for a in final.attempts] == [("own", "completed")]
    assert len((steps / "two.log").read_text().splitlines()) == 1
    [machine] = created
    assert stopped == [machine]
    said = [e for e in events(state / f"{machine}.log") if e.get("event") == "worker.signal"]
    assert len(said) == 1, said  # one stop signal reached the worker


async def test_a_hung_active_scaler_loses_its_lock_to_the_standby(
    database_url: str, tmp_path: Path
) -> None:
    """SIGSTOP the active scaler: within the lease the standby is active and reporting; on
    SIGCONT the old one finds its lock gone and stands by, and its word is not written."""
    state = tmp_path / "machines"
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = start_scaler(database_url, state, logs[0])
    second = None
    try:

        async def said(log: Path, event: str) -> bool:
            return any(e.get("event") == event for e in events(log))

        await eventually(lambda: said(logs[0], "scaler.active"), timeout_s=30, what="active")
        second = start_scaler(database_url, state, logs[1])
        await eventually(lambda: said(logs[1], "scaler.standby"), timeout_s=30, what="standby")

        os.kill(first.pid, signal.SIGSTOP)  # hung: its connection stays open, silent
        await eventually(lambda: said(logs[1], "scaler.active"), timeout_s=LEASE_S + 30,
                         what="the standby taking over")  # fmt: skip

        async def holder_is(pid: int) -> bool:
            rows = await fetch(database_url, f"select holder from {SCHEMA}.scaler_state")
            return bool(rows) and rows[0]["holder"].endswith(f":{pid}")

        await eventually(lambda: holder_is(second.pid), timeout_s=20, what="the new holder")
        os.kill(first.pid, signal.SIGCONT)
        await eventually(lambda: said(logs[0], "scaler.standby"), timeout_s=30,
                         what="the woken scaler standing by")  # fmt: skip
        assert await holder_is(second.pid)
    finally:
        os.kill(first.pid, signal.SIGCONT)
        for process in (first, second):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
        await destroy_all(state)
    woke = [e.get("event") for e in events(logs[0])]
    after = woke[woke.index("scaler.active") + 1 :]
    assert not [e for e in after if e and e.startswith("scaler.machine_")], woke


def test_the_scaler_refuses_a_pooled_connection(database_url: str, tmp_path: Path) -> None:
    """Behind PgBouncer its session lock and lease cannot hold: exit 78, naming the flag."""
    env = {**base_env(database_url, "unused"), "LANE_WORKER_PGBOUNCER": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "worker", "scaler", "--backend", "process",
         "--state-dir", str(tmp_path / "machines"), "--health-port", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 78, done.stderr
    assert "LANE_WORKER_PGBOUNCER is set: the scaler needs a direct" in done.stderr
    assert not (tmp_path / "machines").exists() or not list((tmp_path / "machines").iterdir())
