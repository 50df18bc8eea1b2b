"""The lanes page as headless Chromium renders it: load it, read its rows, compare to a report.

Chromium loads the page from a real daemon and prints the DOM it built
(``--dump-dom``); :class:`LaneRows` reads each lane row from that DOM.
:func:`assert_page_matches` checks the rows against `lane-worker lanes --json`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from typing import Any

from worker.daemon.page import COUNT_COLUMNS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# What this machine's closed network needs (see the environment notes): no
# background connections, no sandbox as root, a fresh profile.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


class LaneRows(HTMLParser):
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


def read_page(port: int) -> LaneRows:
    """Load ``/`` in Chromium and parse its lane rows."""
    parser = LaneRows()
    parser.feed(dump_dom(f"http://127.0.0.1:{port}/"))
    return parser


def assert_page_matches(port: int, report: list[dict[str, Any]]) -> LaneRows:
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
