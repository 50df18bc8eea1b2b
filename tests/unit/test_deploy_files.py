"""The deploy files (Dockerfile, fly.toml, docker/install.sh, Makefile) agree with the code.

No database: fly.toml is read with tomllib, the Dockerfile with the small parser of
``support/deployfiles.py`` (``\\`` continuations, comments, stages, ``ENV A=1 B=2`` and
``ENV A 1``), and every value is checked against what the code actually reads, binds or serves.
"""

from __future__ import annotations

import re
import shlex
import signal
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import REPO
from support.deployfiles import (
    DOCKERFILE,
    FLY_TOML,
    UNUSED_DB_URL,
    Stage,
    assert_bakes_the_release_id,
    assert_runs_as_a_non_root_user_it_creates,
    assert_syncs_exactly_the_lock,
    copy_sources,
    exec_form,
    exposed_ports,
    fly_env,
    health_port,
    makefile_uv_version,
    parse_dockerfile,
    release_guard,
    shell_lines,
    uv_syncs,
)
from worker import lanes
from worker.app import load_app
from worker.config import settings
from worker.config.stopping import Phase, Role, StopAction, longest_stop_s, stop_action
from worker.daemon.health import HealthServer
from worker.metrics import Metrics

INSTALL_SH = REPO / "docker" / "install.sh"


def test_dockerfile_parser_handles_continuations_comments_and_both_env_forms() -> None:
    """The Dockerfile parser joins continuations, skips comments and reads both ENV forms."""
    stages = parse_dockerfile(
        "FROM a AS build\nRUN x\nFROM b\n# c\nENV A=1 \\\n  # inner comment\n"
        '    B="two words" \\\n    C=$PATH\nENV LEGACY some value\nARG R\nARG S=3\n'
        'CMD ["lane-worker", "run"]\n'
    )
    assert [s.base for s in stages] == ["a AS build", "b"]
    final = stages[-1]
    assert final.env() == {"A": "1", "B": "two words", "C": "$PATH", "LEGACY": "some value"}
    assert final.args() == {"R": None, "S": "3"}
    assert exec_form(final.last("CMD")) == ["lane-worker", "run"]


# --- the files, parsed ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fly() -> dict[str, Any]:
    """fly.toml, parsed."""
    return tomllib.loads(FLY_TOML.read_text())


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    """The Dockerfile's stages."""
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def image(stages: list[Stage]) -> Stage:
    """The Dockerfile's final stage: what the machine runs."""
    return stages[-1]


DEPLOYED_RELEASE = "3f9c2e1d7a5b"


def machine_env(fly: dict[str, Any], image: Stage) -> dict[str, str]:
    """Return the environment a Fly machine of this image gets (fly [env] over image ENV)."""
    env = dict(image.env())
    # An empty build arg is the one `fly deploy --build-arg` fills in per deploy.
    build_args = {
        name: str(value) or DEPLOYED_RELEASE for name, value in fly["build"]["args"].items()
    }
    # ENV NAME=${NAME}: the build argument's value is baked in.
    for name, value in list(env.items()):
        ref = re.fullmatch(r"\$\{?(\w+)\}?", value)
        if ref and ref.group(1) in build_args:
            env[name] = build_args[ref.group(1)]
    env.update(fly_env(fly))
    # The secret (fly secrets set WORKFLOW_RUNTIME_POSTGRES=...).
    env[settings.DATABASE_URL_ENV] = UNUSED_DB_URL
    return env


def seconds(value: Any) -> float:
    """Return a fly.toml duration (an integer of seconds, or "40s" / "1m") in seconds."""
    if isinstance(value, int | float):
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(value))
    assert match, f"unreadable duration {value!r}"
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return float(match.group(1)) * scale


def http_checks(fly: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Return fly.toml's named [checks] of type http."""
    checks = {name: c for name, c in fly.get("checks", {}).items() if c.get("type") == "http"}
    assert checks, "fly.toml has no http check"
    return checks


# --- stopping: signal and timeout ----------------------------------------------------------


def test_kill_timeout_exceeds_the_drain_window_fly_sets() -> None:
    """fly's kill_timeout exceeds the drain the daemon would take with fly's [env]."""
    fly = tomllib.loads(FLY_TOML.read_text())
    env = {**fly_env(fly), settings.DATABASE_URL_ENV: UNUSED_DB_URL}
    # The daemon's own reading of LANE_WORKER_DRAIN_SECONDS (the code default when unset).
    drain_s = settings.Settings.from_env(env).tuning.drain_s
    if settings.DRAIN_SECONDS_ENV not in env:
        assert drain_s == settings.Tuning().drain_s
    kill_timeout = seconds(fly["kill_timeout"])
    assert kill_timeout > drain_s, (
        f"fly.toml kill_timeout={kill_timeout:g} s does not exceed the drain window "
        f"{settings.DRAIN_SECONDS_ENV}={drain_s:g} s: runs are cut off mid-drain"
    )
    # Loops stop, runs drain, the rest is handed back, the stop is recorded.
    worst = longest_stop_s(drain_s)
    assert kill_timeout > worst, (
        f"fly.toml kill_timeout={kill_timeout:g} s does not exceed the daemon's longest stop "
        f"({worst:g} s with a {drain_s:g} s drain window)"
    )


def test_kill_timeout_exceeds_the_code_default_drain_when_fly_sets_none() -> None:
    """Without fly's LANE_WORKER_DRAIN_SECONDS, kill_timeout still exceeds the longest stop."""
    fly = tomllib.loads(FLY_TOML.read_text())
    assert seconds(fly["kill_timeout"]) > longest_stop_s(settings.Tuning().drain_s)


def test_stop_signal_is_sigterm_in_fly_and_dockerfile(fly: dict[str, Any], image: Stage) -> None:
    """fly's kill_signal and the Dockerfile's STOPSIGNAL are both SIGTERM."""
    assert fly["kill_signal"] == "SIGTERM"
    assert image.last("STOPSIGNAL") == "SIGTERM"


def test_the_stop_signal_is_one_the_daemon_drains_on(fly: dict[str, Any]) -> None:
    """The signal fly sends is one the daemon's signal receiver drains on (e2e tests send it)."""
    assert (
        stop_action(Role.WORKER, Phase.SERVING, signal.Signals[fly["kill_signal"]])
        is StopAction.DRAIN
    )


# --- health checks and metrics -------------------------------------------------------------


@asynccontextmanager
async def health_server() -> AsyncIterator[str]:
    """Run the daemon's HealthServer on a free port (ready, fresh metrics); yield its base URL."""

    async def ready() -> dict[str, Any]:
        return {"ready": True}

    server = HealthServer(0, Metrics(), ready)
    port = await server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()


async def test_fly_http_check_paths_are_served_by_the_health_server(fly: dict[str, Any]) -> None:
    """Every fly http check's path answers 200 from the daemon's HealthServer when ready."""
    async with health_server() as base, aiohttp.ClientSession() as http:
        for name, check in http_checks(fly).items():
            path = check["path"]
            async with http.get(base + path) as response:
                assert response.status == 200, f"[checks.{name}] path {path}: {response.status}"


async def test_fly_metrics_path_serves_prometheus_text(fly: dict[str, Any]) -> None:
    """fly's [metrics] path serves the Prometheus text format with lane-worker's metrics."""
    path = fly["metrics"]["path"]
    async with (
        health_server() as base,
        aiohttp.ClientSession() as http,
        http.get(base + path) as response,
    ):
        assert response.status == 200, f"[metrics] path {path}: {response.status}"
        assert response.headers["Content-Type"].startswith("text/plain")
        body = await response.text()
    families = {family.name: family.type for family in text_string_to_metric_families(body)}
    assert families.get("lane_worker_claims") == "counter", sorted(families)
    assert families.get("lane_worker_runs_in_flight") == "gauge", sorted(families)
    assert families.get("lane_worker_build_info") == "gauge", sorted(families)  # with its version


def test_check_metrics_env_and_image_agree_on_the_health_port(
    fly: dict[str, Any], image: Stage
) -> None:
    """Check port == [metrics] port == fly LANE_WORKER_HEALTH_PORT == EXPOSE == image ENV."""
    port = health_port(fly)
    for name, check in http_checks(fly).items():
        assert int(check["port"]) == port, f"[checks.{name}] port"
    assert int(fly["metrics"]["port"]) == port, "[metrics] port"
    exposed = exposed_ports(image)
    assert exposed == {port}, f"Dockerfile EXPOSE {sorted(exposed)}, daemon port {port}"
    assert image.env().get(settings.HEALTH_PORT_ENV) == str(port), "Dockerfile ENV health port"
    assert port == settings.Tuning().health_port, "the code default health port differs"


def test_fly_process_groups_named_by_checks_metrics_and_vm_exist(fly: dict[str, Any]) -> None:
    """Every process group [checks], [metrics] and [[vm]] name is defined in [processes]."""
    groups = set(fly.get("processes", {}))
    named = [*fly["metrics"].get("processes", [])]
    for check in fly.get("checks", {}).values():
        named += check.get("processes", [])
    for vm in fly.get("vm", []):
        named += vm.get("processes", [])
    assert set(named) <= groups, f"unknown process groups {sorted(set(named) - groups)}"


# --- the release id ------------------------------------------------------------------------


def test_release_id_variable_is_baked_in_under_the_name_the_code_reads(
    fly: dict[str, Any], image: Stage
) -> None:
    """The image's ARG/ENV and fly's [build.args] use worker.lanes.RELEASE_ID_ENV."""
    name = lanes.RELEASE_ID_ENV
    assert_bakes_the_release_id(image)
    assert set(fly["build"]["args"]) == {name}, f"fly [build.args] {sorted(fly['build']['args'])}"


@pytest.mark.parametrize(
    ("value", "builds"), [("", False), (" \t ", False), ("3f9c2e1d7a5b", True)]
)
def test_image_build_refuses_an_empty_release_id(image: Stage, value: str, builds: bool) -> None:
    """The final stage's guard fails the build without a release id (run as Docker runs it)."""
    result = release_guard(image, value)
    assert (result.returncode == 0) is builds, result.stderr
    if not builds:
        assert f"--build-arg {lanes.RELEASE_ID_ENV}=" in result.stderr


def test_a_fly_machine_environment_boots_without_errors_or_warnings(
    fly: dict[str, Any], image: Stage
) -> None:
    """The env a Fly machine gets (image ENV, build arg, fly [env], the secret) boots cleanly."""
    diagnosis = settings.diagnose(machine_env(fly, image))
    assert not diagnosis.errors, [str(e) for e in diagnosis.errors]
    assert not diagnosis.warnings, diagnosis.warnings
    assert diagnosis.suffix_source == lanes.RELEASE_ID_ENV
    assert diagnosis.tuning.log_format == "json"


# --- what the image runs and how it is built -------------------------------------------------


def test_image_cmd_and_fly_process_run_the_daemon_with_a_loadable_app(
    fly: dict[str, Any], image: Stage
) -> None:
    """The final CMD (and fly's process command, which overrides it) runs `run --app APP`."""
    assert not image.all("ENTRYPOINT"), "an ENTRYPOINT would wrap the CMD"
    commands = {"Dockerfile CMD": exec_form(image.last("CMD"))}
    for group, command in fly.get("processes", {}).items():
        commands[f"fly [processes] {group}"] = shlex.split(command)
    for where, argv in commands.items():
        assert argv[:2] == ["lane-worker", "run"], f"{where}: {argv}"
        assert "--app" in argv, f"{where}: {argv} (run refuses to start without --app)"
        load_app(argv[argv.index("--app") + 1])  # raises if the image's app spec names nothing


def test_image_user_is_not_root(image: Stage) -> None:
    """The final stage runs as a non-root user it creates."""
    assert_runs_as_a_non_root_user_it_creates(image)


def test_image_installs_with_install_sh_into_the_venv_it_runs(
    stages: list[Stage], image: Stage
) -> None:
    """The build stage runs docker/install.sh into the venv the final stage copies onto PATH."""
    build = stages[0]
    assert any("docker/install.sh" in args for args in build.all("COPY"))
    assert any("uv.lock" in args.split() for args in build.all("COPY")), "uv.lock not copied"
    runs = [shlex.split(args) for args in build.all("RUN") if "docker/install.sh" in args]
    assert len(runs) == 1, build.all("RUN")
    venv = runs[0][-1]
    copied = [shlex.split(args) for args in image.all("COPY") if args.startswith("--from=")]
    assert any(words[-2:] == [venv, venv] for words in copied), f"{venv} not copied: {copied}"
    assert f"{venv}/bin" in image.env()["PATH"].split(":")


def test_every_copy_source_is_in_the_build_context(stages: list[Stage]) -> None:
    """Each COPY from the build context (the repository's root) names a path that exists."""
    for stage in stages:
        for args in stage.all("COPY"):
            for source in copy_sources(args):
                assert (REPO / source).exists(), f"COPY {args}: no {source} in {REPO}"


def test_install_sh_syncs_from_the_lock_without_dev_tools() -> None:
    """docker/install.sh installs with `uv sync --frozen --no-dev` (exactly the lock)."""
    syncs = uv_syncs(shell_lines(INSTALL_SH.read_text()))
    assert len(syncs) == 1, f"docker/install.sh runs `uv sync` {len(syncs)} times"
    assert_syncs_exactly_the_lock(syncs[0])


def test_install_sh_pins_the_makefiles_uv_version() -> None:
    """The uv version docker/install.sh pins equals the Makefile's UV_VERSION."""
    script = INSTALL_SH.read_text()
    pinned = re.findall(r"^\s*uv_version=(\S+)\s*$", script, re.MULTILINE)
    assert len(pinned) == 1, pinned
    assert '"uv==${uv_version}"' in script or "uv==${uv_version}" in script
    make = makefile_uv_version()
    assert pinned[0] == make, f"install.sh uv {pinned[0]}, Makefile uv {make}"
