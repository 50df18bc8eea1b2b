"""The lanes page's rows: what an operator must act on, and no blocker on a claiming lane."""

from __future__ import annotations

from worker.daemon import page
from worker.ops.report import Blocker, LaneView

BASE = {"live_workers": 1, "queued": 0, "running": 0, "waiting": 0, "adoptable": 0}


def test_a_claiming_lane_shows_no_blocker() -> None:
    """As `lane-worker lanes` prints it: claiming is the lane's state, not a blocker to act on."""
    claiming = LaneView(
        release_id="a", queue="runs_a", status="claiming",
        blocked_by=(Blocker("claiming", 0, "retire it first"),), **BASE,
    )  # fmt: skip
    html = page.render([claiming])
    assert "data-reason" not in html
    assert "retire it first" not in html


def test_a_draining_lane_shows_its_blockers_with_their_first_run_ids() -> None:
    """Each blocker with its remedy; the run ids it names, and how many more there are."""
    draining = LaneView(
        release_id="b", queue="runs_b", status="draining",
        blocked_by=(Blocker("fresh", 3, "move them", ("r1", "r2")),), **BASE,
    )  # fmt: skip
    html = page.render([draining])
    assert '<li data-reason="fresh"><b>fresh</b> (3): move them' in html
    assert "<summary>runs (first 2 of 3)</summary><code>r1</code> <code>r2</code>" in html


def test_a_pruned_lane_says_so_beside_its_status() -> None:
    """A pruned lane that open runs name again reads as such; others carry no mark."""
    pruned = LaneView(release_id="c", queue="runs_c", status="draining", pruned=True, **BASE)
    plain = LaneView(release_id="d", queue="runs_d", status="drained", **BASE)
    html = page.render([pruned, plain])
    assert html.count('data-field="pruned"') == 1
    assert '<span class="draining" data-field="status">draining</span> <span class="note" ' in html
