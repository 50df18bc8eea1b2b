"""The example app (``examples/app``): its files, and its image's build stage replayed.

Docker does not run here, so :func:`replay_build` performs the build stage of the example's
Dockerfile as Docker would, in a temporary folder: each ``COPY`` from the build context into
the stage's ``WORKDIR``, each ``RUN`` with ``sh -c`` under the stage's ``ENV``, in order (so a
step that needs a file the Dockerfile has not copied yet fails here too). What differs is
named: the venv goes to a temporary folder, not ``/app/.venv`` (``UV_PROJECT_ENVIRONMENT``);
the ``RUN`` that installs uv from PyPI is skipped for the uv ``make install`` put in
``.tools/bin`` (the test checks both are the same version); and uv installs offline
(``UV_OFFLINE``) from the cache ``make install`` filled, which holds every wheel the example
needs because its lock pins what lane-worker's own lock pins.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from support import REPO
from support.deployfiles import Stage, copy_sources, parse_env

EXAMPLE = REPO / "examples" / "app"
UV_BIN = REPO / ".tools" / "bin"
VENDOR_SCRIPT = Path("scripts") / "vendor-lane-worker.sh"
# What a checkout of the example holds that is not part of it (built or installed locally).
NOT_COPIED = ("wheels", ".venv", "__pycache__", "*.egg-info")
TIMEOUT_S = 120
_NOT_PASSED = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME")


def copy_example(dest: Path) -> Path:
    """Copy the example app to ``dest`` as its own project would be checked out; return it."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns(*NOT_COPIED))
    return dest


def tool_env(**extra: str) -> dict[str, str]:
    """Return the environment of uv run by a test: offline, this interpreter, the pinned uv.

    It is this process's environment (uv's cache, certificates and proxies are found through
    it) less what would point uv at another environment than the one it is told to make.
    """
    env = {k: v for k, v in os.environ.items() if k not in _NOT_PASSED}
    env.update(
        PATH=f"{UV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        UV_OFFLINE="1",
        # Docker's image has one Python; here, the suite's own (3.11, as the image's).
        UV_PYTHON=sys.executable,
        UV_NO_PROGRESS="1",
    )
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one command; fail with its output when it exits non-zero."""
    result = subprocess.run(
        argv, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert result.returncode == 0, (
        f"{shlex.join(argv)} exited {result.returncode} in {cwd}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    return result


def vendor_lane_worker(project: Path) -> None:
    """Run the example's vendor script against this repository, as its README says.

    Its `uv lock` reads the package index's pages for lane-worker's dependencies (the image
    build never does): offline from uv's cache when that holds them, which it does after one
    run on a machine; else from PyPI, which `make install` reaches too.
    """
    argv = ["sh", str(VENDOR_SCRIPT), str(REPO)]
    try:
        run(argv, project, tool_env())
    except AssertionError as exc:
        if "network was disabled" not in str(exc):
            raise
        online = tool_env()
        del online["UV_OFFLINE"]
        run(argv, project, online)


def installs_uv(run_args: str) -> bool:
    """Tell whether a ``RUN`` is the one that installs uv itself (with pip, from PyPI)."""
    words = shlex.split(run_args)
    return "pip" in words and "install" in words and any(w.startswith("uv==") for w in words)


def _copy(context: Path, args: str, workdir: Path) -> None:
    """Perform a ``COPY`` from the build context as Docker does (files into a folder ``./``)."""
    sources = copy_sources(args)
    dest = workdir / shlex.split(args)[-1]
    for source in sources:
        assert not set("*?[") & set(source), f"COPY {args}: wildcards are not replayed"
        path = context / source
        assert path.exists(), f"COPY {args}: {source} is not in the build context {context}"
        if path.is_dir():
            shutil.copytree(path, dest, dirs_exist_ok=True)
        elif len(sources) > 1 or args.rstrip().endswith("/"):
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / path.name)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)


def replay_build(stage: Stage, context: Path, root: Path) -> Path:
    """Perform ``stage`` (the build stage) on ``context`` under ``root``; return the venv.

    The stage's ``UV_PROJECT_ENVIRONMENT`` (the venv the final stage copies) becomes
    ``root/venv``; its ``WORKDIR`` becomes ``root/workdir``.
    """
    venv = root / "venv"
    workdir = root / "workdir"
    assert "UV_PROJECT_ENVIRONMENT" in stage.env(), "the build stage does not name its venv"
    env = tool_env()
    for keyword, args in stage.instructions:
        if keyword == "WORKDIR":
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "ENV":
            env.update(parse_env(args))
        elif keyword == "COPY":
            assert not args.startswith("--from="), f"the build stage copies from a stage: {args}"
            _copy(context, args, workdir)
        elif keyword == "RUN" and not installs_uv(args):
            run(["/bin/sh", "-c", args], workdir, {**env, "UV_PROJECT_ENVIRONMENT": str(venv)})
        else:
            assert keyword in ("ARG", "RUN"), f"{keyword} is not replayed"
    return venv
