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
from pathlib import Path
from typing import Any

import pytest

from support import REPO
from worker.daemon.page import COUNT_COLUMNS

# Debian's chromium on PATH (`make chromium` installs it as root or with sudo), else the
# copy `scripts/chromium-local.sh` unpacks without root, run with its own libraries.
LOCAL_CHROMIUM = REPO / ".tools" / "chromium"
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
        elif self._row is not None and tag in ("span", "div") and a.get("data-field"):
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
        if tag in ("td", "span", "div"):
            self._field = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._field is not None:
            text = self._row["text"]
            text[self._field] = text.get(self._field, "") + data


def chromium() -> tuple[str, dict[str, str]]:
    """Return the Chromium to run and its environment; fail saying how to get one."""
    found = shutil.which("chromium")
    if found is not None:
        return found, dict(os.environ)
    local = LOCAL_CHROMIUM / "usr" / "lib" / "chromium" / "chromium"
    if local.exists():
        libs = [
            LOCAL_CHROMIUM / d
            for d in (
                "usr/lib/x86_64-linux-gnu",
                "lib/x86_64-linux-gnu",
                "usr/lib/aarch64-linux-gnu",
                "usr/lib/chromium",
            )
        ]
        path = ":".join([*map(str, libs), os.environ.get("LD_LIBRARY_PATH", "")])
        return str(local), {**os.environ, "LD_LIBRARY_PATH": path}
    pytest.fail(
        "the page's browser tests need Chromium, and there is none: `make chromium` installs "
        "Debian's package (as root or with sudo) or, without root, unpacks it under "
        ".tools/chromium (scripts/chromium-local.sh)",
        pytrace=False,
    )


def dump_dom(url: str) -> str:
    """Return the DOM headless Chromium built for ``url``."""
    browser, env = chromium()
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True, text=True, timeout=60, check=False, env=env,
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


class Fields(HTMLParser):
    """Every element that carries ``data-field`` (or the page's other ``data-*`` marks).

    ``found`` lists (field, attributes, text) in document order; the text is
    all the text inside the element. ``tags`` counts every start tag, so a
    test can tell that a hostile value did not become markup. ``links`` lists
    every ``href``.
    """

    MARKS = ("data-field", "data-open-runs", "data-run", "data-error")

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None], list[str]]] = []
        self._open: list[tuple[str, int]] = []  # (tag, index into found)
        self.tags: dict[str, int] = {}
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))
        mark = next((m for m in self.MARKS if a.get(m) is not None), None)
        if mark is not None:
            self.found.append((str(a[mark]) if mark == "data-field" else mark, a, []))
            self._open.append((tag, len(self.found) - 1))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        for _, index in self._open:
            self.found[index][2].append(data)

    def text(self, field: str) -> list[str]:
        """The text of every element marked ``field``, in order."""
        return ["".join(t).strip() for f, _, t in self.found if f == field]

    def first(self, field: str) -> str:
        """The text of the one element marked ``field``; it must be there."""
        texts = self.text(field)
        assert texts, f"no {field} on the page"
        return texts[0]


def parse_fields(html: str) -> Fields:
    """Return the marked elements of a page."""
    parser = Fields()
    parser.feed(html)
    return parser


def open_runs(html: str) -> dict[str, dict[str, Any]]:
    """The lanes page's open-run lists by queue: run ids (in order), plays, buckets, more."""
    lanes: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for field, attrs, text in parse_fields(html).found:
        if field == "data-open-runs":
            current = lanes.setdefault(str(attrs["data-open-runs"]), {
                "runs": [], "plays": [], "buckets": [], "attempts": [], "more": None})  # fmt: skip
        elif current is None:
            continue
        elif field == "data-run":
            current["runs"].append(attrs["data-run"])
        elif field in ("play", "attempts"):
            current[field + ("s" if field == "play" else "")].append("".join(text).strip())
        elif field == "bucket":
            current["buckets"].append(attrs["data-bucket"])
        elif field == "more":
            current["more"] = " ".join("".join(text).split())
    return lanes


class _Table(HTMLParser):
    """The body rows of the table marked ``data-field=<field>``, as lists of cell texts."""

    def __init__(self, field: str) -> None:
        super().__init__()
        self.field = field
        self.rows: list[list[str]] = []
        self._depth = 0  # tables open inside the wanted one, itself included
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and (self._depth or dict(attrs).get("data-field") == self.field):
            self._depth += 1
        elif self._depth and tag == "tr":
            self.rows.append([])
        elif self._depth and tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._depth:
            self._depth -= 1
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def table_rows(html: str, field: str) -> list[list[str]]:
    """The body rows of the page's table marked ``field`` (a run page's attempts, steps)."""
    parser = _Table(field)
    parser.feed(html)
    return [row for row in parser.rows if row]  # the header row has no td


def screenshot(url: str, folder: Path, name: str = "page") -> Path:
    """Save what headless Chromium shows at ``url`` as ``folder/<name>.png``; return its path.

    A page that only a POST answers (a confirmation) is saved to a file first and
    loaded from there: ``url`` may be a ``file://`` URL.
    """
    path = folder / f"{name}.png"
    browser, env = chromium()
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--window-size=1400,1000", f"--screenshot={path}", url],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert path.exists(), done.stderr[-2000:]
    return path
