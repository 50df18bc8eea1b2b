"""The lanes page stays bounded whatever the number of lanes (issue 35).

A week of deploys leaves hundreds of drained lanes: at 8.3 KB each the page was
8 MB at 1,000 lanes, refreshed every 5 s. Past a page's worth of lanes the quiet
ones (drained or idle, no live worker, nothing failed) are only counted, and the
rest are paged.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from worker.daemon import page
from worker.db.store.rows import OpenRun
from worker.ops.lane_view import Blocker, LaneView

NOW = datetime(2026, 12, 6, tzinfo=UTC)
COUNTS = {"inFlight": 0, "fresh": 0, "retrying": 0, "handedBack": 0, "parkedSleep": 20,
          "parkedEvent": 0, "deferred": 0}  # fmt: skip


def drained(i: int) -> LaneView:
    """A retired lane whose machines are gone, holding 20 parked runs for newer releases."""
    return LaneView(
        release_id=f"old-{i}", queue=f"runs_old_{i}", status="drained", live_workers=0,
        queued=0, running=0, waiting=20, adoptable=20, counts=COUNTS, as_of=NOW,
        open_runs=tuple(run(i, n) for n in range(20)),
    )  # fmt: skip


def draining(i: int) -> LaneView:
    """A retired lane with fresh runs only its release may run, and a live worker."""
    counts = {**COUNTS, "fresh": 60, "parkedSleep": 0}
    ids = tuple(f"{uuid.UUID(int=i * 1000 + n)}" for n in range(20))
    return LaneView(
        release_id=f"mid-{i}", queue=f"runs_mid_{i}", status="draining", live_workers=1,
        queued=60, running=0, waiting=0, adoptable=0, counts=counts, as_of=NOW,
        blocked_by=(Blocker("fresh", 60, "let its workers run them", ids),),
        open_runs=tuple(run(i, n) for n in range(50)),
    )  # fmt: skip


def run(i: int, n: int) -> OpenRun:
    """One open run of lane ``i``."""
    return OpenRun(
        lane=f"runs_{i}", run_id=uuid.UUID(int=i * 1000 + n), play="enrich", status="waiting",
        bucket="parkedSleep", attempts=1, defer_count=0, created_at=NOW, updated_at=NOW,
    )  # fmt: skip


def test_a_thousand_drained_lanes_are_a_count_not_a_thousand_rows() -> None:
    """1,000 drained lanes and one claiming: one row, one count, far under 200 KB."""
    current = LaneView(
        release_id="new", queue="runs_new", status="claiming", live_workers=1, queued=0,
        running=0, waiting=0, adoptable=0, as_of=NOW,
    )  # fmt: skip
    html = page.render([drained(i) for i in range(1000)] + [current])
    assert len(html.encode()) < 20_000
    assert html.count("<tr data-queue=") == 1
    assert 'data-field="quiet" data-count="1000"' in html
    assert "holding 20000 parked runs" in html
    assert 'data-field="pages"' not in html  # one page


def test_many_lanes_to_watch_are_paged_and_each_page_is_bounded() -> None:
    """1,000 draining lanes: 25 rows a page, at most ~150 open runs a page, links between."""
    views = [draining(i) for i in range(1000)]
    first = page.render(views)
    assert len(first.encode()) < 200_000
    assert first.count("<tr data-queue=") == page.PAGE_LANES
    assert first.count("<tr data-run=") <= page.OPEN_RUNS_PER_PAGE
    assert 'data-page="1" data-pages="40"' in first
    assert 'href="/?page=2"' in first
    assert "previous" not in first
    last = page.render(views, 40)
    assert 'data-queue="runs_mid_999"' in last
    assert 'href="/?page=39"' in last
    assert page.render(views, 99) == last  # past the end: the last page


def test_a_few_lanes_are_all_listed_as_before() -> None:
    """Up to a page's worth of lanes nothing collapses: a drained lane keeps its row."""
    html = page.render([drained(1), draining(2)])
    assert html.count("<tr data-queue=") == 2
    assert 'data-field="quiet"' not in html


def test_lanes_json_is_paged_past_a_hundred_lanes_and_whole_below() -> None:
    """/lanes keeps its shape up to 100 lanes; past that it says which page and what follows."""
    few = [drained(i) for i in range(100)]
    assert page.lanes_page(few, 1) == (few, {})
    many = [drained(i) for i in range(250)]
    shown, paging = page.lanes_page(many, 3)
    assert [v.queue for v in shown] == [f"runs_old_{i}" for i in range(200, 250)]
    assert paging == {"page": 3, "pages": 3, "lanesTotal": 250, "next": None}
    assert page.lanes_page(many, 1)[1]["next"] == "/lanes?page=2"


def test_a_page_number_is_a_whole_number_from_one() -> None:
    """Anything else is refused (400), never read as page 1."""
    assert page.page_number(None) == 1
    assert page.page_number("7") == 7
    for bad in ("0", "-1", "x", "1.5", "²", "", "99999999999"):
        assert page.page_number(bad) is None, bad
