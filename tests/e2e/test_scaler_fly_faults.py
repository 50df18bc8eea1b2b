"""A real scaler against a fake Fly Machines API that misbehaves, and what operators see.

A 401 whose body echoes the token: `releases`, `releases --json`, `releases deploy
--wait`, the scaler's stored word and its log say 401 and none of the token. A
listing that names the only machine twice, in overlapping pages, after creates that
answered 500 once the machine was made: the release of one gets one machine,
whose worker serves, and it is never stopped. Machines listed without their
metadata: one create, said in `releases`, `lanes --json` and a metric; and no more
when the scaler is killed and started again mid-rollout.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import aiohttp

from support.cli import lane_worker
from support.daemon import base_env
from support.db import fetch, sql
from support.fly import FakeFly
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import events, machine_events, passes_seen, start_fly_scaler

APP = "support.apps.basic:app"
TOKEN = "fm2_right0token0c4d2"
WRONG = "fm2_revoked0token0f00d/k+Y="


async def test_a_401_echoing_the_token_is_shown_masked_everywhere(
    database_url: str, tmp_path: Path
) -> None:
    """The token the scaler sends comes back in a 401's body: every output says 401, none
    carries the token in any spelling."""
    fly = FakeFly(None, {}, TOKEN, "lw-401")
    fly.echo_auth = True
    await fly.start()
    log = tmp_path / "scaler.log"
    scaler = start_fly_scaler(database_url, fly.env(token=WRONG), log)
    try:
        deploy = await lane_worker(database_url, "releases", "deploy", "fly-401", "--image",
                                   "img:1", "--wait", "--timeout", "8")  # fmt: skip

        async def error_stored() -> bool:
            said = await sql(database_url, f"select releases::text from {SCHEMA}.scaler_state")
            return "HTTP 401" in str(said)

        await eventually(error_stored, timeout_s=30, what="the scaler's word on the 401")
        listed = await lane_worker(database_url, "releases")
        as_json = await lane_worker(database_url, "releases", "--json")
        stored = str(await sql(database_url, f"select releases::text from {SCHEMA}.scaler_state"))
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await fly.stop()
    assert WRONG in "".join(fly.answers)  # the API did echo it
    assert deploy.returncode == 1, deploy
    assert "HTTP 401" in deploy.stdout + deploy.stderr
    assert "HTTP 401" in listed.stdout
    assert "HTTP 401" in json.dumps(json.loads(as_json.stdout))
    shown = [deploy.stdout, deploy.stderr, listed.stdout, listed.stderr, as_json.stdout,
             as_json.stderr, stored, log.read_text()]  # fmt: skip
    for text in shown:
        for part in (WRONG, json.dumps(WRONG)[1:-1], "revoked0token", "f00d/k"):
            assert part not in text, (part, text)


async def test_a_listing_with_twins_in_pages_and_creates_answered_500_keep_one_machine(
    database_url: str, tmp_path: Path
) -> None:
    """Creates answer 500 after making their machine, the listing names every machine twice in
    overlapping pages: the release of one rolls out on one machine and keeps it, pass after pass."""
    machine_env = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "3"}
    fly = FakeFly(tmp_path / "machines", machine_env, TOKEN, "lw-twin")
    fly.fail_after_create, fly.duplicate_listing, fly.page_size = 2, True, 2
    await fly.start()
    scaler = start_fly_scaler(database_url, fly.env(), tmp_path / "scaler.log")
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "fly-twin"}) as c:
            await c.releases.deploy("fly-twin", image=APP, machines=1)
            rolled = await c.releases.wait_rolled_out("fly-twin", timeout_s=90)
            assert rolled.done, rolled.reason
            await passes_seen(database_url, 6)
            run = await c.submit("plain", {"n": 1})
            final = await c.wait(run.run_id, 60)
        created = await machine_events(database_url, "fly-twin", "machine_created")
        stopped = await machine_events(database_url, "fly-twin", "machine_stopped")
        assert fly.machines is not None
        alive = [m.machine_id for m in await fly.machines.list() if m.running]
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        if fly.machines is not None:
            for m in await fly.machines.list():
                await fly.machines.destroy(m)
        await fly.stop()
    assert fly.creates() == 1, fly.calls
    assert created == alive
    assert len(alive) == 1
    assert stopped == []
    assert final.status == "completed"


async def test_machines_listed_without_metadata_are_said_loudly_and_not_created_again(
    database_url: str, tmp_path: Path
) -> None:
    """The API lists the scaler's machines without their metadata: one machine is created for
    a release of one, and `releases`, `lanes --json` and the scaler's metrics say so."""
    fly = FakeFly(None, {}, TOKEN, "lw-meta")
    fly.without_metadata = True
    await fly.start()
    log = tmp_path / "scaler.log"
    scaler = start_fly_scaler(database_url, fly.env(), log)
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "fly-meta"}) as c:
            await c.releases.deploy("fly-meta", image="img:1", machines=1)

            async def said_unlisted() -> bool:
                views, _ = await c.releases.list()
                return any(v.scaler.get("unlisted") for v in views)

            await eventually(said_unlisted, timeout_s=90, what="the scaler saying it")
        await passes_seen(database_url, 3)
        listed = await lane_worker(database_url, "releases")
        lanes = await lane_worker(database_url, "lanes", "--json")
        port = next(e["health_port"] for e in events(log) if e.get("event") == "scaler.started")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            metrics = await response.text()
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await fly.stop()
    assert fly.creates() == 1, fly.calls
    assert "1 unlisted" in listed.stdout, listed.stdout
    assert "does not list" in listed.stdout
    assert "does not list" in lanes.stdout, lanes.stdout
    assert 'lane_worker_scaler_machines_unlisted{release="fly-meta"} 1.0' in metrics


async def test_a_scaler_killed_mid_rollout_and_started_again_creates_no_more(
    database_url: str, tmp_path: Path
) -> None:
    """DEFECT (attack34 A7, its processes): the API lists the scaler's machines without their
    metadata; the scaler is killed (SIGKILL) once it created them, and a new process is
    started, twice. Each new one counted nothing of what the one before created and
    created again; the store remembers the creates now: the release of two gets two."""
    fly = FakeFly(None, {}, TOKEN, "lw-again")
    fly.without_metadata = True
    await fly.start()
    log = tmp_path / "scaler.log"
    scalers: list[subprocess.Popen[bytes]] = []
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "fly-again"}) as c:
            await c.releases.deploy("fly-again", image="img:1", machines=2)
        for _ in range(3):
            scaler = start_fly_scaler(database_url, fly.env(), log)
            scalers.append(scaler)
            holder = f"{socket.gethostname()}:{scaler.pid}"

            async def active(holder: str = holder) -> bool:
                said = await sql(database_url, f"select holder from {SCHEMA}.scaler_state")
                return bool(said == holder)

            await eventually(active, timeout_s=30, what="the new scaler's first pass")
            await passes_seen(database_url, 3)
            scaler.kill()
            scaler.wait(timeout=30)
        rows = await fetch(database_url, f"select machine_id, listed from {SCHEMA}.scaler_creates")
    finally:
        for scaler in scalers:
            if scaler.poll() is None:
                scaler.send_signal(signal.SIGTERM)
                scaler.wait(timeout=30)
        await fly.stop()
    assert fly.creates() == 2, fly.calls
    assert sorted(r["machine_id"] for r in rows) == sorted(fly.metadata), rows
    assert not any(r["listed"] for r in rows), rows
