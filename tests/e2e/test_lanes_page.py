"""The lanes page (`/` on the health port), rendered by headless Chromium, matches `lanes --json`.

Chromium loads the page from a real daemon and prints the DOM it built
(``--dump-dom``); the rows read from that DOM must equal `lane-worker lanes
--json` taken at the same, settled moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

from daemon import REPO, Daemons, queue_of

from worker.daemon.page import COUNT_COLUMNS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# What this machine's closed network needs (see the environment notes): no
# background connections, no sandbox as root, a fresh profile.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
A = "page-a"
TYPO = "<b>typo</b>"  # a release id an operator forced in: it must show as text


class _Rows(HTMLParser):
    """Collects each lane row of the page: its data attributes, cells and blocker reasons."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, Any]] = {}
        self._row: dict[str, Any] | None = None
        self._field: str | None = None
        self.bold_in_release = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-queue"):
            self._row = {"status": a["data-status"], "safe": a["data-safe-to-stop"],
                         "counts": {}, "reasons": [], "text": {}, "pruned": False}  # fmt: skip
            self.rows[str(a["data-queue"])] = self._row
        elif self._row is not None and tag == "td":
            self._field = a.get("data-count") or a.get("data-field")
        elif self._row is not None and tag == "span" and a.get("data-field"):
            self._field = a["data-field"]
            if self._field == "pruned":
                self._row["pruned"] = True
        elif self._row is not None and tag == "li":
            self._row["reasons"].append(a["data-reason"])
        elif tag == "b" and self._field == "releaseId":
            self.bold_in_release = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        if tag in ("td", "span"):
            self._field = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._field is not None:
            text = self._row["text"]
            text[self._field] = text.get(self._field, "") + data


def dump_dom(url: str) -> str:
    """Return the DOM headless Chromium built for ``url``."""
    assert os.path.exists(CHROMIUM), (
        f"{CHROMIUM} is missing: `make chromium` (Debian's chromium package) installs it"
    )
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``lane-worker ARGS`` with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO, env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip


def read_page(port: int) -> _Rows:
    """Load ``/`` in Chromium and parse its lane rows."""
    parser = _Rows()
    parser.feed(dump_dom(f"http://127.0.0.1:{port}/"))
    return parser


def assert_page_matches(port: int, report: list[dict[str, Any]]) -> _Rows:
    """The page Chromium renders from ``port`` shows each lane of ``report`` (`lanes --json`)."""
    page = read_page(port)
    assert set(page.rows) == {lane["queue"] for lane in report}
    for lane in report:
        row = page.rows[lane["queue"]]
        assert row["status"] == row["text"]["status"] == lane["status"]
        assert row["safe"] == row["text"]["safeToStop"] == ("yes" if lane["safeToStop"] else "no")
        assert int(row["text"]["liveWorkers"]) == lane["liveWorkers"]
        assert row["text"]["releaseId"] == lane["releaseId"]
        assert {k: int(row["text"][k]) for k, _ in COUNT_COLUMNS} == {
            k: lane["counts"][k] for k, _ in COUNT_COLUMNS
        }
        # A claiming lane's blockers are not shown (as `lane-worker lanes` prints it).
        shown = [] if lane["status"] == "claiming" else lane["blockedBy"]
        assert row["reasons"] == [b["reason"] for b in shown]
        assert row["pruned"] == lane["pruned"]
    return page


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
