"""Deploy day on a fake Fly Machines API whose machines are real `lane-worker run` processes.

Deploy A (2 machines) with parked and running work, deploy B through a 500 and a
429 from the API, with the scaler SIGKILLed and restarted mid-rollout: B starts,
A is retired only once B is ready, an A machine killed while A drains is replaced,
B adopts A's parked runs, every run completes once, A's machines are removed only
once A is drained, and a machine the scaler did not create is never touched. The
API token never appears in the scaler's log.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from support import REPO
from support.daemon import base_env
from support.db import fetch
from support.fly import FakeFly
from support.runtime import SCHEMA, eventually, open_client
from worker.client import LaneClient

APP = "support.apps.basic:app"
TOKEN = "fly-token-test-8d21"


def start_scaler(database_url: str, fly: FakeFly, log: Path) -> subprocess.Popen[bytes]:
    env = {**base_env(database_url, "unused"), **fly.env()}
    env.pop("DEEPLINE_RUNTIME_DEPLOY_VERSION")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "scaler", "--backend", "fly", "--health-port", "0"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def ready_of(client: LaneClient, release: str) -> int:
    views, _ = await client.releases.list()
    return next((v.ready_workers for v in views if v.release_id == release), 0)


async def test_deploy_day_on_the_fake_fly_api(database_url: str, tmp_path: Path) -> None:
    machine_env = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "3"}
    fly = FakeFly(tmp_path / "machines", machine_env, TOKEN, "lw-test")
    await fly.start()
    fly.add_foreign("someone-elses")
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, fly, log)
    try:
        client_env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "fly-a", "LANE_WORKER_MAX_ATTEMPTS": "12"}
        async with open_client(database_url, client_env) as c:
            await c.releases.deploy("fly-a", image=APP, machines=2)

            async def a_ready() -> bool:
                return await ready_of(c, "fly-a") == 2

            await eventually(a_ready, timeout_s=60, what="A's two machines ready")
            sleepers = [(await c.submit("sleeper", {"seconds": 20})).run_id for _ in range(2)]
            waiter = (await c.submit("waiter", {})).run_id
            held = (await c.submit("slow", {"dir": str(tmp_path), "seconds": 25,
                                            "rerun_seconds": 0})).run_id  # fmt: skip

            gate = tmp_path / "gate"
            gate.mkdir()
            retrying = (await c.submit("gated", {"dir": str(gate)})).run_id
            everyone = [*sleepers, waiter, held, retrying]

            async def settled_in() -> bool:
                states = [(await c.status(r)).status for r in everyone]
                return states[:4] == ["waiting", "waiting", "waiting", "running"] and (
                    len((await c.status(retrying)).attempts) >= 2
                )

            await eventually(settled_in, timeout_s=30, what="A's runs parked, running, retrying")

            fly.faults += [(500, {}), (429, {"Retry-After": "1"})]
            await c.releases.deploy("fly-b", image=APP, machines=1)
            scaler.send_signal(signal.SIGKILL)  # mid-rollout
            scaler.wait(timeout=10)
            scaler = start_scaler(database_url, fly, log)
            rolled = await c.releases.wait_rolled_out("fly-b", timeout_s=90)
            assert rolled.done, rolled.reason

            # An A machine dies while A drains (its `slow` run still holds it): replaced.
            a_machines = [m for m in await fly.machines.list() if m.release_id == "fly-a"]
            assert len(a_machines) == 2
            await fly.machines.destroy(a_machines[0])

            await c.signal(waiter, "go", {"by": "test"})
            (gate / "open").touch()  # the retrying run may now succeed, on A (never adopted)
            for run_id in everyone:
                final = await c.wait(run_id, 120)
                assert final.status == "completed", (run_id, final.status, final.error)

            async def a_removed() -> bool:
                return not [m for m in await fly.machines.list() if m.release_id == "fly-a"]

            await eventually(a_removed, timeout_s=90, what="A's machines removed once drained")
            finals = [await c.status(r) for r in sleepers]
            gated_final = await c.status(retrying)
        record = await fetch(
            database_url,
            f"select release_id, action, detail, at from {SCHEMA}.deployment_events"
            " order by event_id",
        )
        terminal = await fetch(
            database_url,
            f"select run_id::text as run_id, type, created_at from {SCHEMA}.ledger"
            " where type in ('run.completed', 'run.failed', 'run.cancelled')",
        )
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        for m in await fly.machines.list():
            await fly.machines.destroy(m)
        await fly.stop()
    steps = [(e["release_id"], e["action"]) for e in record]
    assert steps.index(("fly-b", "machine_created")) < steps.index(("fly-a", "retired"))
    assert steps.count(("fly-a", "machine_created")) == 3  # two, then the replacement
    assert [f.output["after"] for f in finals] == ["fly-b", "fly-b"]
    assert gated_final.output == {"release": "fly-a"}  # a retry runs on its own release
    # Every run ended once, completed; A's machines were stopped only after the last run
    # that needed A ended, and for that reason.
    assert sorted((t["run_id"], t["type"]) for t in terminal) == sorted(
        (str(r), "run.completed") for r in everyone
    )
    a_needed_until = max(t["created_at"] for t in terminal
                         if t["run_id"] in {str(held), str(retrying)})  # fmt: skip
    a_stops = [e for e in record if e["release_id"] == "fly-a"
               and e["action"] in ("machine_stopped", "machine_destroyed")
               and e["detail"]["reason"] != "it is not running"]  # fmt: skip
    assert a_stops, record
    assert all(e["detail"]["reason"] == "its lane is drained" for e in a_stops), a_stops
    assert min(e["at"] for e in a_stops) > a_needed_until
    assert {s for _, _, s in fly.calls} >= {200, 429, 500}  # both faults met, and retried
    assert fly.touched_foreign == []
    for body in fly.bodies:  # the release id, and nothing else: secrets are the app's
        release = body["config"]["metadata"]["lane_worker_release"]
        assert body["config"]["env"] == {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release}
    assert TOKEN not in log.read_text()
