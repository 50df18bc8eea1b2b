"""The example app's Fly files (``examples/app/fly.toml``, ``fly.scaler.toml``) agree with the
code: the workers' app only builds release images, and the scaler runs in an app of its own.

Static, as ``tests/unit/test_example_app.py`` checks the image: the files are read with
tomllib, the scaler's command is parsed by the CLI itself, the Fly backend is built from
the environment the scaler's machine gets, and its check and metrics paths are served by
the scaler's own health server (a standby too: it is healthy, not ready).
"""

from __future__ import annotations

import shlex
import signal
import tomllib
from typing import Any

import aiohttp
import click
import pytest

from support.deployfiles import UNUSED_DB_URL, Stage, parse_dockerfile
from support.example_app import EXAMPLE
from worker import lanes
from worker.cli.root import cli
from worker.config import settings
from worker.config.env import FLY_APP_ENV
from worker.config.stopping import Phase, Role, StopAction, stop_action
from worker.daemon.health import HealthServer
from worker.scaler.backend import machine_stop_s
from worker.scaler.fly import FlyBackend
from worker.scaler.run import ScalerMetrics

SECRETS = ("FLY_API_TOKEN", settings.DATABASE_URL_ENV)


@pytest.fixture(scope="module")
def workers() -> dict[str, Any]:
    return tomllib.loads((EXAMPLE / "fly.toml").read_text())


@pytest.fixture(scope="module")
def scaler() -> dict[str, Any]:
    return tomllib.loads((EXAMPLE / "fly.scaler.toml").read_text())


@pytest.fixture(scope="module")
def image() -> Stage:
    return parse_dockerfile((EXAMPLE / "Dockerfile").read_text())[-1]


def scaler_command(scaler: dict[str, Any]) -> click.Context:
    """The scaler process group's command, parsed by `lane-worker` as it would run it."""
    assert list(scaler["processes"]) == ["scaler"], scaler["processes"]
    argv = shlex.split(scaler["processes"]["scaler"])
    assert argv[:2] == ["lane-worker", "scaler"], argv
    command = cli.get_command(click.Context(cli), "scaler")
    assert command is not None
    return command.make_context("scaler", argv[2:])


def test_the_workers_app_builds_release_images_and_runs_nothing_itself(
    workers: dict[str, Any], image: Stage
) -> None:
    """Only [build]: no process group, service or [env] a `fly deploy` would start machines
    with (the scaler's machines never get fly.toml's [env] anyway)."""
    assert (EXAMPLE / workers["build"]["dockerfile"]).is_file()
    assert workers["build"]["args"] == {lanes.RELEASE_ID_ENV: ""}  # filled in per release
    assert lanes.RELEASE_ID_ENV in image.args()
    for key in ("processes", "env", "services", "http_service", "checks", "mounts"):
        assert key not in workers, f"examples/app/fly.toml sets [{key}]"


def test_the_scaler_runs_in_its_own_app_and_acts_on_the_workers_app(
    workers: dict[str, Any], scaler: dict[str, Any]
) -> None:
    assert scaler["app"] != workers["app"]
    env = {str(k): str(v) for k, v in scaler["env"].items()}
    assert env[FLY_APP_ENV] == workers["app"]
    assert not set(SECRETS) & set(env), "a secret in fly.scaler.toml"
    # What the scaler's machine has: Fly's own variables, the app's secrets, [env].
    machine = {
        **env,
        "FLY_APP_NAME": scaler["app"],
        "FLY_REGION": scaler["primary_region"],
        "FLY_API_TOKEN": "deploy-token",
        settings.DATABASE_URL_ENV: UNUSED_DB_URL,
    }
    backend = FlyBackend.from_env(machine)
    assert (backend.app, backend.region) == (workers["app"], scaler["primary_region"])
    parsed = scaler_command(scaler)
    assert parsed.params["backend"] == "fly"


def test_the_scalers_drain_window_is_the_machines(scaler: dict[str, Any], image: Stage) -> None:
    """It gives a stopping machine as long as the image's worker takes to stop."""
    env = {str(k): str(v) for k, v in scaler["env"].items()}
    assert machine_stop_s(env) == machine_stop_s(image.env())


def test_the_scaler_stops_on_the_signal_fly_sends(scaler: dict[str, Any]) -> None:
    signum = signal.Signals[scaler["kill_signal"]]
    assert stop_action(Role.SCALER, Phase.SERVING, signum) is StopAction.DRAIN


async def test_check_and_metrics_are_served_on_the_scalers_port_by_a_standby_too(
    scaler: dict[str, Any],
) -> None:
    port = scaler_command(scaler).params["health_port"]
    [check] = scaler["checks"].values()
    assert (check["type"], check["port"], check["processes"]) == ("http", port, ["scaler"])
    assert (scaler["metrics"]["port"], scaler["metrics"]["processes"]) == (port, ["scaler"])
    assert [vm["processes"] for vm in scaler["vm"]] == [["scaler"]]

    async def standby() -> dict[str, Any]:
        return {"ready": False, "active": False, "lastPassOk": False}

    server = HealthServer(0, ScalerMetrics(), standby)
    bound = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{bound}"
            async with http.get(base + check["path"]) as response:
                assert response.status == 200, check["path"]
            async with http.get(base + "/readyz") as response:
                assert response.status == 503  # why the check is not /readyz
            async with http.get(base + scaler["metrics"]["path"]) as response:
                assert response.status == 200
                assert "lane_worker_scaler_machines_running" in await response.text()
    finally:
        await server.stop()
