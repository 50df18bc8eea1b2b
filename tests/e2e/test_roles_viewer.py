"""The viewer's role end to end (issue 33): every read command and the page, as the owner sees.

The owner migrates and applies ``lane-worker roles``; a worker daemon (the owner's URL)
runs a waiting, a failed and a queued run. The read commands (``lanes``, ``lanes
--json``, ``lanes show``, ``status``, ``runs``, ``releases``, real subprocesses) run as
a login member of the viewer role and print the owner's numbers; the drain report
reads the engine through the owner-rights functions of store 0049. The worker's page
connects as the viewer (``LANE_WORKER_PAGE_POSTGRES``): each page answers 200 with
the owner's counts and no run's input; a page action is refused with a sentence.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from support.daemon import Daemons
from support.roles import Logins, made_roles
from support.runtime import SCHEMA, eventually, open_client

A = "viewer-a"
IDLE = "viewer-idle"  # no worker serves it: its run stays queued
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "1"}
SECRET = "input-" + uuid.uuid4().hex


@pytest.fixture
def logins(database_url: str) -> Iterator[Logins]:
    with made_roles(database_url) as made:
        yield made


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WORKFLOW_RUNTIME_POSTGRES": url}
    for name in ("LANE_WORKER_STORE_SCHEMA", "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _lanes(said: dict[str, Any]) -> dict[str, Any]:
    """Each lane's numbers and verdict (not its moments: lastSeen, asOf, ages)."""
    return {
        lane["queue"]: (
            lane["status"],
            lane["queued"],
            lane["running"],
            lane["waiting"],
            lane["safeToStop"],
            {k: v for k, v in lane["counts"].items() if not k.endswith("Seconds")},
            [b["bucket"] if isinstance(b, dict) and "bucket" in b else str(b)[:40]
             for b in lane["blockedBy"]],
        )
        for lane in said["lanes"]
    }  # fmt: skip


async def _runs(database_url: str) -> tuple[str, str, str]:
    async with (
        open_client(database_url, ENV_A) as client,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}) as idle,
    ):
        waiting = (await client.submit("waiter", {"secret": SECRET})).run_id
        failed = (await client.submit("flaky", {"secret": SECRET})).run_id
        queued = (await idle.submit("plain", {"secret": SECRET})).run_id

        async def settled() -> bool:
            return [(await client.status(r)).status for r in (waiting, failed)] == [
                "waiting",
                "failed",
            ]

        await eventually(settled, timeout_s=60, what="a waiting and a failed run")
    return waiting, failed, queued


async def test_the_viewer_runs_every_read_command_and_sees_the_owners_numbers(
    database_url: str, logins: Logins
) -> None:
    viewer = logins.urls["viewer"]
    async with Daemons(database_url) as pool:
        daemon = pool.start(A, LANE_WORKER_MAX_ATTEMPTS="1")
        await daemon.ready()
        waiting, failed, queued = await _runs(database_url)
        for args in (
            ("lanes", "--json"),
            ("lanes", "show", A, "--json"),
            ("runs", "--json"),
            ("releases", "--json"),
            *(("status", "--json", r) for r in (waiting, failed, queued)),
            ("lanes",),
            ("runs",),
            ("status", waiting),
        ):
            owner, seen = cli(database_url, *args), cli(viewer, *args)
            assert (owner.returncode, seen.returncode) == (0, 0), (args, seen.stderr)
            assert SECRET not in seen.stdout, args
            if "--json" not in args:
                continue
            mine, theirs = json.loads(owner.stdout), json.loads(seen.stdout)
            if args[0] == "lanes" and len(args) == 2:
                assert _lanes(theirs) == _lanes(mine)
                assert set(_lanes(mine)) >= {"runs_viewer_a", "runs_viewer_idle"}
            elif args[0] == "status":
                keep = ("runId", "status", "releaseId", "queue", "attempts", "maxAttempts")
                assert {k: theirs[k] for k in keep} == {k: mine[k] for k in keep}
                assert len(theirs["claims"]) == len(mine["claims"])
                assert theirs["output"] is None  # a payload: never the viewer's
                assert theirs["error"] is None
            elif args[0] == "runs":
                pick = ("runId", "status", "attempts", "queue")
                rows = [{k: r[k] for k in pick} for r in theirs["runs"]]
                assert rows == [{k: r[k] for k in pick} for r in mine["runs"]]
            elif args[0] == "lanes":  # lanes show
                assert _lanes({"lanes": [theirs]}) == _lanes({"lanes": [mine]})
        doctor = cli(viewer, "doctor", "--connect", "--part", "viewer", "--json")
        role = json.loads(doctor.stdout)["role"]
        assert (role["role"], role["broad"]) == (f"{logins.prefix}_viewer_login", False)
        assert role["memberOf"] == [f"{logins.prefix}_viewer"]
        owner_doctor = json.loads(cli(database_url, "doctor", "--connect", "--json").stdout)
        assert owner_doctor["role"]["broad"] is True


async def test_the_page_as_the_viewer_shows_the_owners_counts_and_refuses_actions(
    database_url: str, logins: Logins
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    async with Daemons(database_url) as pool:
        daemon = pool.start(
            A,
            LANE_WORKER_MAX_ATTEMPTS="1",
            LANE_WORKER_PAGE_POSTGRES=logins.urls["viewer"],
            LANE_WORKER_PAGE_TOKEN=token,
        )
        await daemon.ready()
        waiting, failed, _ = await _runs(database_url)
        base = f"http://127.0.0.1:{daemon.health_port}"
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            for path in ("/", "/runs", f"/runs/{waiting}", f"/runs/{failed}", "/deploys",
                         "/actions"):  # fmt: skip
                async with http.get(base + path) as response:
                    body = await response.text()
                assert response.status == 200, (path, body[:500])
                assert SECRET not in body, path
            owner = json.loads(cli(database_url, "lanes", "--json").stdout)

            async def same() -> bool:
                async with http.get(base + "/lanes") as response:
                    assert response.status == 200
                    return _lanes(await response.json()) == _lanes(owner)

            await eventually(same, what="the page's lanes to match the owner's")
            # The page read as the viewer's login, never the owner's.
            sessions = await _sessions(database_url, "lane-worker-report%")
            assert sessions == {f"{logins.prefix}_viewer_login"}
            # Signed in with the token, an action is still refused: the role may only read.
            headers = {"Origin": base}
            async with http.post(
                base + "/signin", data={"who": "ana", "token": token}, headers=headers,
                allow_redirects=False,
            ) as response:  # fmt: skip
                assert response.status == 303
            async with http.get(base + "/runs?status=waiting") as response:
                listed = await response.text()
            csrf = re.search(r'name="csrf" value="([^"]+)"', listed)
            assert csrf is not None, listed[:500]
            async with http.post(
                base + "/actions/preview",
                data={"action": "cancel", "status": "waiting", "csrf": csrf.group(1)},
                headers=headers, allow_redirects=False,
            ) as response:  # fmt: skip
                body = await response.text()
            assert response.status == 403, body[:500]
            assert "may only read" in body
        assert await _status(database_url, waiting) == "waiting"  # nothing cancelled


async def _sessions(database_url: str, application: str) -> set[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "select distinct usename::text from pg_stat_activity"
            " where datname = current_database() and application_name like $1",
            application,
        )
    finally:
        await conn.close()
    return {r[0] for r in rows}


async def _status(database_url: str, run_id: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        status: str = await conn.fetchval(
            f"select status from {SCHEMA}.runs where run_id = $1::uuid", run_id
        )
    finally:
        await conn.close()
    return status
