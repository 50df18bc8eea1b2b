"""The lanes page's open runs and the run page (`/runs/<runId>`), from a real daemon.

Headless Chromium loads the pages (``support.page``); the lists must match what
was submitted, link each run to its page, name the CLI command for the runs not
shown, and never turn a play name or a requested path into markup.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any
from urllib.parse import quote

import aiohttp

from support.cli import run_cli
from support.daemon import Daemons, queue_of
from support.page import dump_dom, open_runs, parse_fields, table_rows
from support.runtime import eventually, open_client

A = "runpage-a"
IDLE = "runpage-idle"  # a lane no worker serves: its runs stay fresh
HOSTILE = '<b id="x">evil</b>&amp;"'  # a play name that must stay text
SHOWN = 50
WORKER_A = A  # the release id A's worker records: as deployed (issue 31 §1)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``lane-worker ARGS`` with ``env``; it must succeed."""
    done = run_cli(env, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


async def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from the daemon's health port: (status, body)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


def metric(text: str, name: str, lane: str) -> float | None:
    """The value of series ``name`` of ``lane`` in a Prometheus text page, if it is there."""
    for line in text.splitlines():
        if line.startswith(f'{name}{{lane="{lane}"'):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_open_runs_listed_and_linked_and_each_run_has_a_page(database_url: str) -> None:
    """53 fresh runs of a hostile play on an idle lane (50 shown, "and 3 more"), a parked
    event, a parked sleep and a completed run on A; each run page says what it waits for
    and which release committed each step; 404 for unknown or malformed ids."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": database_url}
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}) as idle,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A}) as client,
    ):
        daemon = pool.start(A)
        await daemon.ready()
        port = daemon.health_port
        fresh = [(await idle.submit(HOSTILE, {"n": n})).run_id for n in range(SHOWN + 3)]
        waiter = (await client.submit("waiter", {})).run_id
        sleeper = (await client.submit("sleeper", {"seconds": 600})).run_id
        done = (await client.submit("plain", {"n": 1})).run_id
        for run_id in (waiter, sleeper):
            await daemon.wait_for("run.parked", run_id=run_id)
        assert (await client.wait(done, 30)).status == "completed"

        listed = open_runs(dump_dom(f"http://127.0.0.1:{port}/"))
        on_idle, on_a = listed[queue_of(IDLE)], listed[queue_of(A)]
        # Newest first: the last 50 submitted, latest on top.
        assert on_idle["runs"] == fresh[::-1][:SHOWN]
        assert set(on_idle["plays"]) == {HOSTILE}  # shown as the text it is
        assert set(on_idle["buckets"]) == {"fresh"}
        command = f"lane-worker runs --status open --lane {IDLE} --limit {SHOWN + 3}"
        assert on_idle["more"] == f"and 3 more: {command} lists them all.", on_idle["more"]
        assert dict(zip(on_a["runs"], on_a["buckets"], strict=True)) == {
            sleeper: "parkedSleep",
            waiter: "parkedEvent",
        }
        assert done not in on_a["runs"]  # only open runs
        dom = dump_dom(f"http://127.0.0.1:{port}/")
        assert '<b id="x">' not in dom  # no play name became markup
        page = parse_fields(dom)
        assert {f"/runs/{r}" for r in [*on_idle["runs"], *on_a["runs"]]} <= set(page.links)

        # The command the page names lists every open run of the lane.
        everything = json.loads(cli(env, *command.split()[1:], "--json").stdout)["runs"]
        assert sorted(r["runId"] for r in everything) == sorted(fresh)

        parked = parse_fields(dump_dom(f"http://127.0.0.1:{port}/runs/{waiter}"))
        assert parked.first("status") == "waiting"
        assert parked.first("bucket") == "parked (event)"
        assert parked.first("release") == A
        said = parked.first("waits for")
        assert f"event 'go' (engine event evt:{waiter}:go)" in said, said
        assert parked.first("attempts").startswith("1 of ")

        _, html = await get(port, f"/runs/{sleeper}")
        asleep = parse_fields(html)
        assert asleep.first("bucket") == "parked (sleep)"
        assert asleep.first("waits for").startswith("sleeps until 20"), asleep.first("waits for")
        steps = table_rows(html, "steps")
        assert ["step:before", WORKER_A] in [row[:2] for row in steps], steps

        status, html = await get(port, f"/runs/{done}")
        assert status == 200
        finished = parse_fields(html)
        assert finished.first("status") == "completed"
        assert finished.text("bucket") == []  # a finished run has no bucket
        assert finished.text("waits for") == []
        assert [row[:2] for row in table_rows(html, "steps")] == [["step:echo", WORKER_A]]
        assert [row[1:3] for row in table_rows(html, "claims")] == [["own", "completed"]]
        assert f'"release": "{WORKER_A}"' in finished.first("output")

        _, html = await get(port, f"/runs/{fresh[0]}")
        assert parse_fields(html).first("play") == HOSTILE
        assert '<b id="x">' not in html

        unknown, html = await get(port, "/runs/00000000-0000-4000-8000-000000000000")
        assert unknown == 404
        assert "the store has no run 00000000-0000-4000-8000-000000000000" in html
        script = "<script>alert(1)</script>"
        malformed, html = await get(port, "/runs/" + quote(script, safe=""))
        assert malformed == 404
        assert "is not a run id" in html
        assert script not in html
        assert "script" not in parse_fields(html).tags


async def test_a_draining_lane_says_how_long_it_has_drained(database_url: str) -> None:
    """drainingSeconds in /lanes and lane_worker_lane_draining_seconds: since `lanes retire`
    while the lane drains, 0 for a claiming lane."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": database_url}
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}) as idle,
    ):
        daemon = pool.start(A)
        await daemon.ready()
        port = daemon.health_port
        await idle.submit("plain", {})
        cli(env, "lanes", "retire", IDLE, "--force")

        async def draining_for_a_while() -> dict[str, Any] | None:
            _, body = await get(port, "/lanes")
            lanes = {lane["queue"]: lane for lane in json.loads(body)["lanes"]}
            return lanes if lanes[queue_of(IDLE)]["drainingSeconds"] > 0.5 else None

        lanes = await eventually(draining_for_a_while, what="the idle lane draining")
        assert lanes[queue_of(IDLE)]["status"] == "draining"
        assert lanes[queue_of(A)]["drainingSeconds"] == 0
        as_json = json.loads(cli(env, "lanes", "--json").stdout)["lanes"]
        assert {lane["queue"]: lane["drainingSeconds"] > 0.5 for lane in as_json} == {
            queue_of(IDLE): True, queue_of(A): False,
        }  # fmt: skip
        _, text = await get(port, "/metrics")
        name = "lane_worker_lane_draining_seconds"
        assert (metric(text, name, queue_of(IDLE)) or 0) > 0.5, text
        assert metric(text, name, queue_of(A)) == 0

        cli(env, "lanes", "activate", IDLE)

        async def claiming_again() -> bool:
            _, text = await get(port, "/metrics")
            return metric(text, name, queue_of(IDLE)) == 0

        await eventually(claiming_again, what="the gauge back at 0 after lanes activate")
