"""The example app's image (``examples/app/Dockerfile``) agrees with its project and with the code.

Static: the Dockerfile is parsed (``support/deployfiles.py``) and each value is checked against
the example's files, lane-worker's fly.toml and the machine config the Fly scaler creates. The
build itself is performed, and the image's command booted, in
``tests/e2e/test_example_image.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from support import REPO
from support.deployfiles import (
    UNUSED_DB_URL,
    Stage,
    assert_bakes_the_release_id,
    assert_runs_as_a_non_root_user_it_creates,
    assert_syncs_exactly_the_lock,
    copy_sources,
    exec_form,
    exposed_ports,
    health_port,
    makefile_uv_version,
    parse_dockerfile,
    read_fly,
    release_guard,
    shell_lines,
    uv_syncs,
)
from support.example_app import EXAMPLE, VENDOR_SCRIPT, installs_uv
from support.http import LocalServer
from worker import lanes
from worker.config import settings
from worker.config.stopping import Phase, Role, StopAction, longest_stop_s, stop_action
from worker.scaler import fly as fly_scaler
from worker.version import VERSION

WHEELS = (
    "wheels"  # where the vendor script puts lane-worker's wheel, and the Dockerfile copies from
)
RELEASE = "3f9c2e1d7a5b"


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    """The example Dockerfile's stages."""
    return parse_dockerfile((EXAMPLE / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def build(stages: list[Stage]) -> Stage:
    """The build stage: where the venv is made."""
    assert len(stages) == 2, [s.base for s in stages]
    return stages[0]


@pytest.fixture(scope="module")
def image(stages: list[Stage]) -> Stage:
    """The final stage: what a machine runs."""
    return stages[-1]


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    """The example's pyproject.toml."""
    return tomllib.loads((EXAMPLE / "pyproject.toml").read_text())


def lane_worker_version() -> str:
    """Return this repository's lane-worker version (what `uv build` names the wheel after)."""
    return VERSION


def locked_versions(lock: Path) -> dict[str, dict[str, Any]]:
    """Return a uv.lock's packages by name."""
    return {p["name"]: p for p in tomllib.loads(lock.read_text())["package"]}


def app_spec(image: Stage) -> str:
    """Return the ``--app`` of the image's command, checking the command runs the daemon."""
    assert not image.all("ENTRYPOINT"), "an ENTRYPOINT would wrap the CMD"
    argv = exec_form(image.last("CMD"))
    assert argv[:2] == ["lane-worker", "run"], argv
    assert "--app" in argv, f"CMD {argv} runs lane-worker's demo, not the example's app"
    return argv[argv.index("--app") + 1]


# --- what goes into the image ---------------------------------------------------------------


def test_every_copy_source_is_in_the_example_or_made_by_its_vendor_script(
    stages: list[Stage], project: dict[str, Any]
) -> None:
    """COPY sources exist in examples/app, but for wheels/, which the vendor script fills."""
    sources = [src for stage in stages for args in stage.all("COPY") for src in copy_sources(args)]
    assert WHEELS in sources, f"the image never copies lane-worker's wheel: {sources}"
    for source in sources:
        if source != WHEELS:
            assert (EXAMPLE / source).exists(), f"COPY {source}: not in {EXAMPLE}"
    # The wheel pyproject.toml names is where the vendor script builds it.
    wheel = project["tool"]["uv"]["sources"]["lane-worker"]["path"]
    assert Path(wheel).parent == Path(WHEELS), wheel
    script = shell_lines((EXAMPLE / VENDOR_SCRIPT).read_text())
    assert any(f"--out-dir {WHEELS} " in line for line in script), script


def test_the_example_depends_on_this_release_of_lane_worker_by_its_wheel(
    project: dict[str, Any],
) -> None:
    """pyproject pins lane-worker==VERSION from the wheel `uv build` makes of this repository."""
    version = lane_worker_version()
    assert f"lane-worker=={version}" in project["project"]["dependencies"]
    source = project["tool"]["uv"]["sources"]["lane-worker"]
    assert source == {"path": f"{WHEELS}/lane_worker-{version}-py3-none-any.whl"}, source


def test_the_example_lock_pins_what_lane_workers_own_lock_pins() -> None:
    """Every package both locks hold has one version: the image runs what CI tests."""
    ours = locked_versions(REPO / "uv.lock")
    example = locked_versions(EXAMPLE / "uv.lock")
    assert example["lane-worker"]["source"]["path"].startswith(f"{WHEELS}/")
    drifted = {
        name: (package["version"], ours[name]["version"])
        for name, package in example.items()
        if "registry" in package["source"] and package["version"] != ours[name]["version"]
    }
    assert not drifted, (
        f"examples/app/uv.lock (left) and uv.lock (right) differ: {drifted}; in examples/app "
        "run `uv lock --upgrade-package NAME==VERSION` for each"
    )
    # Nothing the example installs comes from anywhere lane-worker's lock does not also use.
    assert {name for name, p in example.items() if "registry" in p["source"]} <= set(ours)


def test_the_build_stage_installs_exactly_the_lock_into_the_venv_the_image_runs(
    build: Stage, image: Stage
) -> None:
    """Each `uv sync` is --frozen --no-dev; the last installs the app itself, not a link."""
    syncs = uv_syncs(build.all("RUN"))
    assert syncs, build.all("RUN")
    for words in syncs:
        assert_syncs_exactly_the_lock(words)
    assert "--no-editable" in syncs[-1], "the app would be a link into /src, which is not copied"
    assert "--no-install-project" not in syncs[-1], "the app itself is never installed"
    assert len(build.all("WORKDIR")) == 1, "the replay in the e2e test maps one WORKDIR"
    venv = build.env()["UV_PROJECT_ENVIRONMENT"]
    copied = [args.split() for args in image.all("COPY") if args.startswith("--from=")]
    assert copied == [["--from=build", venv, venv]], copied
    assert build.base.split() == [image.image, "AS", "build"], "the venv's Python must match"
    assert f"{venv}/bin" in image.env()["PATH"].split(":")
    assert build.env().get("UV_PYTHON_DOWNLOADS") == "never", "only the image's own Python"


def test_the_build_stage_installs_the_uv_the_makefile_pins(build: Stage) -> None:
    """The one RUN that installs uv pins the Makefile's UV_VERSION (the e2e replay uses that uv)."""
    bootstraps = [args for args in build.all("RUN") if installs_uv(args)]
    assert len(bootstraps) == 1, build.all("RUN")
    assert f"uv=={makefile_uv_version()}" in bootstraps[0].split()


# --- what the image runs ---------------------------------------------------------------------


def test_the_image_runs_the_daemon_with_the_examples_own_app(
    image: Stage, project: dict[str, Any]
) -> None:
    """CMD is `lane-worker run --app myapp.plays:app`, an App of the package the wheel ships."""
    spec = app_spec(image)
    module = spec.partition(":")[0]
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert any(f"src/{module.split('.')[0]}" == p for p in packages), (module, packages)
    # Loaded as the daemon loads it, in a process of its own (the example is not on sys.path).
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; from worker.app import load_app; "
            "print(json.dumps(sorted(load_app(sys.argv[1]).plays)))",
            spec,
        ],
        cwd=EXAMPLE / "src",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout) == ["refund", "send-invoice"]


def test_the_image_runs_as_a_non_root_user(image: Stage) -> None:
    """The final stage's USER is one it creates, not root."""
    assert_runs_as_a_non_root_user_it_creates(image)


def test_the_image_bakes_in_the_release_id_and_refuses_to_build_without(image: Stage) -> None:
    """ARG/ENV DEEPLINE_RUNTIME_DEPLOY_VERSION, and the build fails when it is blank."""
    assert_bakes_the_release_id(image)
    assert release_guard(image, RELEASE).returncode == 0
    refused = release_guard(image, " ")
    assert refused.returncode != 0
    assert f"--build-arg {lanes.RELEASE_ID_ENV}=" in refused.stderr


def test_port_and_stop_signal_agree_with_fly_toml(image: Stage) -> None:
    """EXPOSE, the image's health port, fly.toml's port and the scaler's are one; SIGTERM too."""
    fly = read_fly()
    port = health_port(fly)
    assert exposed_ports(image) == {port} == {fly_scaler.HEALTH_PORT}
    assert image.env()[settings.HEALTH_PORT_ENV] == str(port)
    assert image.last("STOPSIGNAL") == fly["kill_signal"] == "SIGTERM"
    assert (
        stop_action(Role.WORKER, Phase.SERVING, signal.Signals[image.last("STOPSIGNAL")])
        is StopAction.DRAIN
    )


class _MachinesApi(LocalServer):
    """Answers the scaler's `POST /machines` and keeps the machine config it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.configs: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.configs.append((await request.json())["config"])
        return web.json_response({"id": "m-1", "state": "created"})


async def test_a_machine_the_scaler_creates_from_the_image_boots_on_its_release(
    image: Stage,
) -> None:
    """The scaler's machine config plus the image's ENV boots cleanly, on the deployed release.

    A scaler-made machine gets no fly.toml [env]: only the image's ENV, the config's env (the
    release id, over the baked one) and the app's secrets.
    """
    deployed = "rel-42"
    async with _MachinesApi() as api:
        backend = fly_scaler.FlyBackend(
            api_url=f"http://127.0.0.1:{api.port}", token="t", app="myapp", region=None
        )
        backend.store_id = "store-1"
        await backend.create(deployed, "registry.fly.io/myapp:rel-42")
    (config,) = api.configs
    env = {
        **{k: v.replace("$PATH", "/usr/bin") for k, v in image.env().items()},
        lanes.RELEASE_ID_ENV: RELEASE,  # what the build baked in
        **config["env"],
        settings.DATABASE_URL_ENV: UNUSED_DB_URL,  # the app's secret
    }
    diagnosis = settings.diagnose(env)
    assert not diagnosis.errors, [str(e) for e in diagnosis.errors]
    assert not diagnosis.warnings, diagnosis.warnings
    assert diagnosis.launch_release_id == deployed
    assert diagnosis.tuning.log_format == "json"
    assert {c["port"] for c in config["checks"].values()} == exposed_ports(image)
    assert config["stop_config"]["signal"] == image.last("STOPSIGNAL")
    timeout = config["stop_config"]["timeout"]
    assert timeout.endswith("s"), timeout
    assert float(timeout[:-1]) > longest_stop_s(diagnosis.tuning.drain_s)
