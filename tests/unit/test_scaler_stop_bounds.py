"""How long the scaler lets a stopped machine drain: above its worker's longest stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config.stopping import longest_stop_s
from worker.scaler.fly import FlyBackend
from worker.scaler.process import ProcessBackend


@pytest.mark.parametrize("drain", ["", "3", "25", "200", "3600"])
def test_a_machine_is_never_cut_off_while_its_worker_drains(tmp_path: Path, drain: str) -> None:
    """Whatever drain window the machines get, the process backend's destroy deadline and
    Fly's stop timeout are above the worker's longest stop with it."""
    env = {"LANE_WORKER_DRAIN_SECONDS": drain, "FLY_API_TOKEN": "t", "FLY_APP_NAME": "a"}
    worst = longest_stop_s(float(drain or 25))
    assert ProcessBackend(tmp_path, env).stop_deadline_s > worst
    fly = FlyBackend.from_env(env)
    assert fly.stop_timeout_s > worst
    assert fly.stop_deadline_s > fly.stop_timeout_s
