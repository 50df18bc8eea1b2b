"""The lanes page (`/` on the health port), rendered by headless Chromium, matches `lanes --json`.

Chromium loads the page from a real daemon and prints the DOM it built
(``--dump-dom``); the rows read from that DOM (``support.page``) must equal
`lane-worker lanes --json` taken at the same, settled moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator

from support.cli import run_cli
from support.daemon import Daemons, queue_of
from support.page import assert_page_matches, dump_dom

A = "page-a"
TYPO = "<b>typo</b>"  # a release id an operator forced in: it must show as text


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``lane-worker ARGS`` with ``env``; it must succeed."""
    done = run_cli(env, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


async def test_the_page_shows_what_lanes_json_shows(database_url: str) -> None:
    """Claiming A with parked runs, an unregistered lane with fresh runs, a forced typo lane."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": database_url}
    async with Daemons(database_url) as pool:
        daemon = pool.start(A)
        await daemon.ready()
        for _ in range(2):
            run_id = cli({**env, "DEEPLINE_RUNTIME_DEPLOY_VERSION": A}, "submit", "waiter")
            await daemon.wait_for("run.parked", run_id=run_id.stdout.strip())
        for _ in range(3):  # a release whose machines never booted
            cli({**env, "DEEPLINE_RUNTIME_DEPLOY_VERSION": "page-b"}, "submit", "plain")
        cli(env, "lanes", "retire", TYPO, "--force")
        report = json.loads(cli(env, "lanes", "--json").stdout)["lanes"]
        page = assert_page_matches(daemon.health_port, report)

    assert set(page.rows) == {queue_of(A), queue_of("page-b"), queue_of(TYPO)}
    # What the test put there, so the comparison above is not of two empty pages.
    by_queue = {lane["queue"]: lane for lane in report}
    assert by_queue[queue_of(A)]["counts"]["parkedEvent"] == 2
    assert by_queue[queue_of(A)]["liveWorkers"] == 1
    assert by_queue[queue_of("page-b")]["status"] == "unregistered"
    assert by_queue[queue_of("page-b")]["counts"]["fresh"] == 3
    assert by_queue[queue_of(TYPO)]["status"] == "drained"
    assert page.rows[queue_of(TYPO)]["text"]["releaseId"] == TYPO  # shown as text
    assert not page.bold_in_release  # never as markup


async def test_the_page_says_when_the_report_cannot_be_read(database_url: str) -> None:
    """While the daemon cannot reach its database, / answers 503 with a page that says so."""
    async with Daemons(database_url) as pool:
        # A closed port: the daemon sits in its connect retry with its health port bound.
        with socket_port() as port:
            daemon = pool.start(
                A, WORKFLOW_RUNTIME_POSTGRES="postgresql://postgres@127.0.0.1:1/x",
                LANE_WORKER_HEALTH_PORT=str(port),
            )  # fmt: skip
            dom = await _eventually_dom(port)
        daemon.terminate()
    assert "NotBootedError" in dom
    assert "cannot be read right now" in dom


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    """Pick a free TCP port number (released at once: the daemon binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    yield port


async def _eventually_dom(port: int, timeout_s: float = 30) -> str:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)
    return dump_dom(f"http://127.0.0.1:{port}/")
