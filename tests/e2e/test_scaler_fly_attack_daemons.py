"""Adversarial review of issue 34 (attack34), with the real scaler, the real CLI and machines
that are real `lane-worker run` processes behind the fake Fly Machines API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from support import REPO
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


def test_a_token_with_a_line_break_is_refused_at_start_without_showing_it(
    database_url: str, tmp_path: Path
) -> None:
    """DEFECT (attack34 A6): FLY_API_TOKEN pasted with a line break inside. The scaler started
    and failed every pass (aiohttp refuses a header with a control character: "Potential
    header injection attack"), naming neither the variable nor the fix; now it exits 78 at
    start, naming FLY_API_TOKEN, and shows none of the token."""
    secret_half = "fm2_secondhalf0a9b8c7"
    env = {**base_env(database_url, "unused"), "FLY_API_TOKEN": f"fm2_firsthalf0z\n{secret_half}",
           "FLY_APP_NAME": "lw-atk", "LANE_WORKER_FLY_API_URL": "http://127.0.0.1:9"}  # fmt: skip
    env.pop("DEEPLINE_RUNTIME_DEPLOY_VERSION")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worker", "scaler", "--backend", "fly", "--health-port", "0"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        said = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        raise AssertionError(f"the scaler ran on with the broken token: {said}") from None
    assert done.returncode == 78, done.stdout + done.stderr
    assert "FLY_API_TOKEN" in done.stderr, done.stderr
    for part in ("firsthalf", "secondhalf"):
        assert part not in done.stdout + done.stderr


async def test_a_machine_listed_as_the_retired_release_s_is_not_stopped_with_it(
    database_url: str, tmp_path: Path
) -> None:
    """DEFECT (attack34 A3), end to end: B's first machine is listed with A's metadata. B gets
    a second (the made-surplus bound), is ready, A is retired and drained: A's machines are
    stopped, but never B's machine the listing filed under A (its worker is B's). It used to
    be stopped as "its lane is drained" while it served B."""
    machine_env = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "3"}
    fly = FakeFly(tmp_path / "machines", machine_env, TOKEN, "lw-atk3")
    await fly.start()
    log = tmp_path / "scaler.log"
    scaler = start_fly_scaler(database_url, fly.env(), log)
    assert fly.machines is not None
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "atk-a"}) as c:
            await c.releases.deploy("atk-a", image=APP, machines=1)

            async def ready_of(release: str) -> int:
                views, _ = await c.releases.list()
                return next((v.ready_workers for v in views if v.release_id == release), 0)

            async def a_ready() -> bool:
                return await ready_of("atk-a") == 1

            await eventually(a_ready, timeout_s=60, what="A's machine ready")
            [a1] = [m.machine_id for m in await fly.machines.list()]
            fly.mislabel_next["atk-b"] = "atk-a"
            await c.releases.deploy("atk-b", image=APP, machines=1)
            rolled = await c.releases.wait_rolled_out("atk-b", timeout_s=90)
            assert rolled.done, rolled.reason
            [b1] = list(fly.listed_release)

            async def a_removed() -> bool:
                return a1 not in {m.machine_id for m in await fly.machines.list()}

            await eventually(a_removed, timeout_s=90, what="A's own machine removed")
            still = {m.machine_id: m.running for m in await fly.machines.list()}
            listed = await lane_worker(database_url, "releases")
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        for m in await fly.machines.list():
            await fly.machines.destroy(m)
        await fly.stop()
    assert not [p for _, p, _ in fly.calls if b1 in p and not p.endswith("/machines")], fly.calls
    assert still.get(b1) is True, still
    assert "another release's worker runs on them" in listed.stdout, listed.stdout
