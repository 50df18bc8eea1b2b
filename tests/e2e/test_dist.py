"""The package a user installs: `make dist`'s wheel and sdist, and a git URL, in a user's project.

As a user would: `make dist` builds both files (into a temporary folder here, not ``dist/``); a
fresh venv outside the repository gets the wheel (no extra: the test database is a server of
its own, as a user's is); a project of its own (``myproj/plays.py``, one async play) runs
`lane-worker run --app myproj.plays:app` from its folder with no ``PYTHONPATH``, after that
venv's `lane-worker migrate` installed the schemas from the wheel's SQL files into an empty
database; that venv's ``LaneClient`` submits a run and waits for it; SIGTERM drains the worker
(exit 0). The wheel's dependencies are held to the versions ``uv.lock`` pins (constraints, as
a user's lock would pin them), so the test proves the wheel, not what PyPI published today:
offline from the cache `make install` filled, else from PyPI. One venv per session.
"""

from __future__ import annotations

import asyncio
import email.parser
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import REPO
from support.daemon import Daemons, base_env
from support.db import fetch
from support.example_app import run, tool_env
from worker import lanes
from worker.version import VERSION

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

RELEASE = "myproj-1a2b3c4"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# What the package must never carry: the repository's own suites, benchmarks and examples.
NOT_SHIPPED = ("tests/", "bench/", "examples/", "docs/", "docker/", ".ci/")

PLAYS = '''\
"""A user's plays: one async play, with one step."""

import worker
from worker import App, TaskContext

app = App()


@app.play("greet")
async def greet(ctx: TaskContext, input: dict) -> dict:
    greeting = await ctx.step("compose", lambda: f"hello, {input['name']}")
    # Where lane-worker was imported from: the venv's copy, not a checkout.
    return {"greeting": greeting, "release": ctx.release_id, "lane_worker": worker.__file__}
'''

SUBMIT = '''\
"""The app's side: submit one run and wait for its end."""

import asyncio
import json
import sys

from worker.client import LaneClient


async def main() -> None:
    async with await LaneClient.connect() as client:  # reads WORKFLOW_RUNTIME_POSTGRES
        run = await client.submit("greet", {"name": sys.argv[1]})
        report = await client.wait(run.run_id, timeout=float(sys.argv[2]))
        print(json.dumps({"runId": run.run_id, "status": report.status, "output": report.output}))


asyncio.run(main())
'''


@dataclass(frozen=True)
class Dist:
    """The two files `make dist` built."""

    wheel: Path
    sdist: Path


def offline_first(
    argv: list[str], cwd: Path, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run a uv command offline (uv's cache), then online when the cache lacks something."""
    env = {k: v for k, v in tool_env(UV_PYTHON_DOWNLOADS="never").items() if k not in drop}
    try:
        return run(argv, cwd, env)
    except AssertionError:
        del env["UV_OFFLINE"]
        return run(argv, cwd, env)


async def run_async(
    argv: list[str], cwd: Path, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run one command in a thread (the daemon's log readers keep going meanwhile)."""
    return await asyncio.to_thread(run, argv, cwd, env)


def package_files(root: Path, ref: str | None = None) -> set[str]:
    """Return the files of ``worker/`` git has at ``ref``, or in the work tree (not ignored)."""
    if ref is not None:
        argv = ["git", "ls-tree", "-r", "--name-only", ref, "worker"]
    else:
        argv = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "worker"]
    listed = run(argv, root, os.environ).stdout.split()
    return {name for name in listed if ref is not None or (root / name).is_file()}


def wheel_metadata(wheel: Path) -> email.message.Message:
    """Return the wheel's METADATA (its name, version, dependencies and extras)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def wheel_files(wheel: Path) -> list[str]:
    """Return the names of the files in a wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return [n for n in archive.namelist() if not n.endswith("/")]


def assert_the_package_and_nothing_else(wheel: Path, expected: set[str]) -> None:
    """The wheel holds exactly ``expected`` under worker/, its dist-info, and nothing more."""
    names = wheel_files(wheel)
    shipped = {n for n in names if n.startswith("worker/")}
    assert shipped == expected, (
        f"missing: {sorted(expected - shipped)}; not in the package: {sorted(shipped - expected)}"
    )
    others = {n.split("/")[0] for n in names if not n.startswith("worker/")}
    assert others == {f"lane_worker-{wheel_metadata(wheel)['Version']}.dist-info"}, others


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """Build the wheel and the sdist once, with `make dist` into a folder of the session's."""
    out = tmp_path_factory.mktemp("dist")
    under_make = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # when the suite runs under `make test`
    offline_first(["make", "-s", "dist", f"DIST_DIR={out}"], REPO, drop=under_make)
    (wheel,) = out.glob("lane_worker-*.whl")
    (sdist,) = out.glob("lane_worker-*.tar.gz")
    return Dist(wheel, sdist)


@pytest.fixture(scope="session")
def venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the repository with the wheel installed, as a user's would be."""
    root = tmp_path_factory.mktemp("user-venv")
    assert not root.resolve().is_relative_to(REPO.resolve())
    venv = root / "venv"
    pins = root / "constraints.txt"
    offline_first(
        [
            "uv", "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes",
            "--all-extras", "--format", "requirements.txt", "--output-file", str(pins),
        ],
        REPO,
    )  # fmt: skip
    offline_first(["uv", "venv", "--python", sys.executable, str(venv)], root)
    python = str(venv / "bin" / "python")
    offline_first(
        ["uv", "pip", "install", "--python", python, "-c", str(pins), str(dist.wheel)], root
    )
    return venv


def user_env(venv: Path, database_url: str) -> dict[str, str]:
    """Return a user's shell with the venv activated: its bin first, no PYTHONPATH."""
    return {
        "PATH": f"{venv / 'bin'}:{SYSTEM_PATH}",
        "VIRTUAL_ENV": str(venv),
        "WORKFLOW_RUNTIME_POSTGRES": database_url,
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE,
    }


def write_project(root: Path) -> Path:
    """Write a user's project (a package of plays and a submitting script); return its folder."""
    (root / "myproj").mkdir(parents=True)
    (root / "myproj" / "__init__.py").write_text("")
    (root / "myproj" / "plays.py").write_text(PLAYS)
    (root / "submit.py").write_text(SUBMIT)
    return root


def test_the_wheel_carries_the_whole_package_and_nothing_else(dist: Dist) -> None:
    """Every file of worker/ (SQL, py.typed), none of tests/bench/examples; version, extras."""
    files = package_files(REPO)
    assert "worker/py.typed" in files
    assert any(n.startswith("worker/sql/store/") and n.endswith(".sql") for n in files)
    assert any(n.startswith("worker/sql/engine/") and n.endswith(".sql") for n in files)
    assert_the_package_and_nothing_else(dist.wheel, files)
    assert not [n for n in wheel_files(dist.wheel) if n.startswith(NOT_SHIPPED)]

    meta = wheel_metadata(dist.wheel)
    assert meta["Name"] == "lane-worker"
    assert meta["Version"] == VERSION  # worker/version.py, the one place it is written
    assert dist.wheel.name == f"lane_worker-{VERSION}-py3-none-any.whl"
    assert set(meta.get_all("Provides-Extra") or []) >= {"embedded", "daytona"}
    with zipfile.ZipFile(dist.wheel) as archive:
        entry = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "lane-worker = worker.cli:main" in archive.read(entry).decode()


def test_the_sdist_builds_and_holds_the_sql_files(dist: Dist) -> None:
    """The sdist (which `make dist` built the wheel from) holds every SQL file and the version."""
    prefix = f"lane_worker-{VERSION}/"
    with tarfile.open(dist.sdist) as archive:
        names = {m.name.removeprefix(prefix) for m in archive.getmembers() if m.isfile()}
        info = archive.extractfile(prefix + "PKG-INFO")
        assert info is not None
        pkg_info = email.parser.Parser().parsestr(info.read().decode())
    sql = {n for n in package_files(REPO) if n.endswith(".sql")}
    assert sql <= names, sorted(sql - names)
    assert {"pyproject.toml", "README.md", "worker/version.py", "worker/py.typed"} <= names
    assert pkg_info["Version"] == VERSION


def test_a_git_url_builds_the_same_package(tmp_path: Path) -> None:
    """`pip install "lane-worker @ git+URL@REF"` builds the package of that commit, whole.

    pip builds the wheel from a clone as it does for that install (its build backend from
    PyPI); the work tree's uncommitted changes are not in it, so it is compared with HEAD.
    """
    head = run(["git", "rev-parse", "HEAD"], REPO, os.environ).stdout.strip()
    # The README's form for a local checkout: named, with the host localhost, which pip
    # before 24.1 (.tools' is 23.2) needs after a name (git+file:///path is refused there).
    url = f"lane-worker[embedded] @ git+file://localhost{REPO}@{head}"
    env = {k: v for k, v in tool_env().items() if not k.startswith("UV_")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pip = str(REPO / ".tools" / "bin" / "pip")
    run([pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path), url], tmp_path, env)
    (wheel,) = tmp_path.glob("lane_worker-*.whl")
    assert_the_package_and_nothing_else(wheel, package_files(REPO, head))
    version = run(["git", "show", f"{head}:worker/version.py"], REPO, os.environ).stdout
    match = re.search(r'^VERSION = "([^"]+)"$', version, re.MULTILINE)
    assert match is not None
    assert wheel_metadata(wheel)["Version"] == match.group(1)


async def test_a_user_project_runs_its_plays_on_the_installed_wheel(
    venv: Path, empty_database_url: str, tmp_path: Path
) -> None:
    """--version, migrate, run --app myproj.plays:app, submit and wait, SIGTERM: exit 0."""
    project = write_project(tmp_path / "myproj-project")
    env = user_env(venv, empty_database_url)
    shown = run(["lane-worker", "--version"], project, env).stdout.strip()
    assert shown == f"lane-worker, version {VERSION}"
    # The schemas come from the wheel's SQL files: the database has none of lane-worker's.
    run(["lane-worker", "migrate"], project, env)
    migrations = {int(p.name[:4]) for p in (REPO / "worker" / "sql" / "store").glob("[0-9]*.sql")}
    applied = await fetch(
        empty_database_url, "select version from runtime_scheduler.schema_migrations"
    )
    assert {row["version"] for row in applied} == migrations

    daemon_env: Mapping[str, str] = {
        **{k: v for k, v in base_env(empty_database_url, RELEASE).items() if k != "PYTHONPATH"},
        **env,
    }
    argv = ["lane-worker", "run", "--app", "myproj.plays:app"]
    async with Daemons(empty_database_url) as pool:
        daemon = pool.start_raw("myproj", daemon_env, argv=argv, cwd=project)
        await daemon.ready(timeout_s=60)
        done = await run_async(["python", "submit.py", "ada", "120"], project, env)
        result = json.loads(done.stdout)
        assert result["status"] == "completed", result
        output = result["output"]
        assert output["greeting"] == "hello, ada"
        assert output["release"] == lanes.launch_release_id(env)
        assert Path(output["lane_worker"]).is_relative_to(venv), output
        await daemon.wait_for("run.completed", run_id=result["runId"])

        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 0
        assert not daemon.malformed_lines()


def quickstart_blocks() -> list[tuple[str, str]]:
    """Return the README Quickstart's code blocks, (language, text), in order."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quickstart\n") : text.index("\n## ", text.index("## Quickstart"))]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def commands(block: str) -> list[str]:
    """Return a shell block's commands, without comments and the `# or:` alternatives."""
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


async def test_the_readme_quickstart_runs_as_written(
    venv: Path, empty_database_url: str, tmp_path: Path
) -> None:
    """The Quickstart on a database of one's own: its plays file, migrate, run, the CLI block.

    Its install block is what the venv fixture did (from the wheel rather than a git URL:
    test_a_git_url_builds_the_same_package shows both build the same package); `dev` is
    test_dev's. Each command of the submit block runs in bash (set -e) as written.
    """
    blocks = quickstart_blocks()
    (plays,) = [body for lang, body in blocks if lang == "python"]
    project = tmp_path / "quickstart"
    (project / "myproj").mkdir(parents=True)
    (project / "myproj" / "__init__.py").write_text("")
    (project / "myproj" / "plays.py").write_text(plays)
    env = user_env(venv, empty_database_url)
    del env["DEEPLINE_RUNTIME_DEPLOY_VERSION"]  # the Quickstart's worker serves the dev lane
    shells = [commands(body) for lang, body in blocks if lang == "sh"]
    (worker_block,) = [c for c in shells if "lane-worker migrate" in c]
    (submit_block,) = [c for c in shells if any(line.startswith("RUN=") for line in c)]
    assert worker_block[-2:] == ["lane-worker migrate", "lane-worker run --app myproj.plays:app"]
    run(["bash", "-ec", worker_block[-2]], project, env)

    daemon_env = {
        **{k: v for k, v in base_env(empty_database_url, "x").items() if k != "PYTHONPATH"},
        **env,
    }
    del daemon_env["DEEPLINE_RUNTIME_DEPLOY_VERSION"]
    async with Daemons(empty_database_url) as pool:
        daemon = pool.start_raw(
            "quickstart", daemon_env, argv=worker_block[-1].split(), cwd=project
        )
        await daemon.ready(timeout_s=60)
        script = "\n".join([*submit_block, 'echo "RUN=$RUN"'])
        said = (await run_async(["bash", "-ec", script], project, env)).stdout
        assert "status: completed" in said, said
        assert '{"greeting": "hello, ada"}' in said, said
        run_id = said.split("RUN=")[-1].strip()
        await daemon.wait_for("run.completed", run_id=run_id)
        (row,) = await fetch(
            empty_database_url,
            "select status, output from runtime_scheduler.runs where run_id = $1::uuid",
            run_id,
        )
        assert row["status"] == "completed"
        assert row["output"] == {"order": "A-7", "approved": True, "by": "ada"}
        daemon.terminate()
        assert await daemon.wait_exit(timeout_s=60) == 0
