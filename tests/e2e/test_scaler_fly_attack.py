"""Adversarial review of issue 34 (attack34), with the real scaler, the real CLI and machines
that are real `lane-worker run` processes behind the fake Fly Machines API."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from support.cli import lane_worker
from support.daemon import base_env
from support.fly import FakeFly
from support.runtime import eventually, open_client
from support.scaler import start_fly_scaler

APP = "support.apps.basic:app"
TOKEN = "fm2_attack0token0e2e1"


async def test_a_dead_machine_whose_delete_answers_404_is_replaced_all_the_same(
    database_url: str, tmp_path: Path
) -> None:
    """DEFECT (attack34 A1), end to end: the only machine of a release of one dies and the
    API answers 404 to its DELETE, pass after pass. The release used to run no machine
    from then on (the refused destroy ended its pass before the replacement); now a new
    machine serves and `releases` says why the dead one stays listed."""
    machine_env = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "3"}
    fly = FakeFly(tmp_path / "machines", machine_env, TOKEN, "lw-atk")
    await fly.start()
    log = tmp_path / "scaler.log"
    scaler = start_fly_scaler(database_url, fly.env(), log)
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "atk-e2e"}) as c:
            await c.releases.deploy("atk-e2e", image=APP, machines=1)

            async def ready() -> set[str]:
                views, _ = await c.releases.list()
                view = next((v for v in views if v.release_id == "atk-e2e"), None)
                return set() if view is None or not view.ready_workers else {
                    m.machine_id for m in await fly.machines.list() if m.running}  # fmt: skip

            await eventually(ready, timeout_s=60, what="the release's machine ready")
            assert fly.machines is not None
            [first] = [m.machine_id for m in await fly.machines.list()]
            fly.refuse_acts[first] = 404
            pids = json.loads((tmp_path / "machines" / f"{first}.pids").read_text())
            os.kill(pids["worker"], signal.SIGKILL)

            async def replaced() -> bool:
                running = {m.machine_id for m in await fly.machines.list() if m.running}
                return bool(running - {first}) and bool(await ready())

            await eventually(replaced, timeout_s=90, what="a new machine for the dead one")
        listed = await lane_worker(database_url, "releases")
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        if fly.machines is not None:
            for m in await fly.machines.list():
                await fly.machines.destroy(m)
        await fly.stop()
    assert "404" in listed.stdout, listed.stdout
    assert TOKEN not in log.read_text()
