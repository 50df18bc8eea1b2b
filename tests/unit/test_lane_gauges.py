"""Per-lane gauges stay bounded by the lanes that are not drained (issue 35).

A week of deploys leaves hundreds of drained lanes until pruning: each would add
about a dozen all-zero series to every worker's scrape. A drained lane is only
counted in ``lane_worker_lanes{status="drained"}``.
"""

from __future__ import annotations

from prometheus_client import generate_latest

from worker.daemon.health import lane_gauges
from worker.metrics import Metrics
from worker.ops.lane_view import LaneView


def view(release: str, status: str, live: int = 0, **counts: int) -> LaneView:
    return LaneView(
        release_id=release, queue=f"runs_{release}", status=status, live_workers=live,
        queued=0, running=0, waiting=0, adoptable=0, counts=counts,
    )  # fmt: skip


def series(metrics: Metrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_a_thousand_drained_lanes_are_one_count_not_a_thousand_series() -> None:
    metrics = Metrics()
    live = [view("cur", "claiming", fresh=2), view("old", "draining", parkedSleep=1)]
    lane_gauges(metrics, live)
    few = series(metrics)
    lane_gauges(metrics, live + [view(f"d{i}", "drained") for i in range(1000)])
    many = series(metrics)
    assert len(many) == len(few) + 1  # the one drained count
    assert 'lane_worker_lanes{status="drained"} 1000.0' in many
    assert 'lane_worker_lanes{status="claiming"} 1.0' in many
    assert not [line for line in many if 'lane="runs_d' in line]
    assert (
        'lane_worker_lane_open_runs{bucket="parkedSleep",lane="runs_old",release="old"} 1.0' in many
    )


def test_a_lane_that_drains_drops_its_series_at_the_next_scrape() -> None:
    metrics = Metrics()
    lane_gauges(metrics, [view("old", "draining", parkedSleep=1)])
    assert [line for line in series(metrics) if 'lane="runs_old"' in line]
    lane_gauges(metrics, [view("old", "drained")])
    assert not [line for line in series(metrics) if 'lane="runs_old"' in line]
    assert 'lane_worker_lanes{status="drained"} 1.0' in series(metrics)


def test_a_drained_lane_with_live_machines_keeps_its_series() -> None:
    """Machines still up on a drained lane are what a dashboard must show (safe to stop)."""
    metrics = Metrics()
    lane_gauges(metrics, [view("old", "drained", live=2)])
    assert 'lane_worker_lane_live_workers{lane="runs_old",release="old"} 2.0' in series(metrics)
    assert 'lane_worker_lanes{status="drained"} 1.0' in series(metrics)
