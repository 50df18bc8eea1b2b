"""Earlier commits of this repository, each built into its own environment, to run beside HEAD.

A build is ``git archive <sha>`` unpacked under ``.cache/builds/<sha>`` (ignored by
git) and ``uv sync --frozen`` there from that commit's own ``uv.lock``, without its
dev tools: its daemons run its own ``worker`` and its own ``tests/support/apps``.
A finished build is marked ``.ready`` and reused; a file lock makes test workers
that need the same build at once build it once. A commit missing from this
checkout's history (a shallow clone) fails the test with one sentence saying how
to fetch it: the older-build test is never skipped silently.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import REPO

CACHE = REPO / ".cache" / "builds"
UV = REPO / ".tools" / "bin" / "uv"  # the Makefile's pinned uv
BUILD_TIMEOUT_S = 600.0

# The older builds the suite runs beside HEAD, newest first: the last build whose
# engine-side objects were unversioned (main before contracts), and two older ones the
# issue names, whose installs broke later builds' claims ("unknown claim mode all",
# issue 29); 2d22071 is also the oldest build whose app can submit through the store's
# SQL API, which the test uses. From 0.2.0 on, add every release here (its last commit
# before the next bump of worker/version.py).
OLDER_BUILDS: dict[str, str] = {
    "395febb": "main's last commit of 0.2.1: facts built by workers, releases named by segment",
    "a408570": "main's head before versioned engine contracts (unversioned claim functions)",
    "dd1325a": "the operator's view (issue 18): claim_lane without mode 'all'",
    "2d22071": "the app's SQL API: the first build with the store's submit_run",
}


@dataclass(frozen=True)
class Build:
    """One earlier commit, unpacked and installed."""

    sha: str
    root: Path

    @property
    def python(self) -> Path:
        """Return the build's own interpreter (its environment, its lock file)."""
        return self.root / ".venv" / "bin" / "python"

    @property
    def tests_dir(self) -> Path:
        """Return the build's own ``tests/`` (its ``support.apps``)."""
        return self.root / "tests"

    def argv(self, *args: str) -> list[str]:
        """Return ``python -m worker ARGS`` of this build."""
        return [str(self.python), "-m", "worker", *args]


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args],  # noqa: S607 (git from PATH, as a developer runs it)
        capture_output=True,
        timeout=120,
        check=False,
    )


def require_commit(sha: str) -> None:
    """Fail the test with one sentence when ``sha`` is not in this checkout's history."""
    try:
        found = _git("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0
    except FileNotFoundError:
        found = False
    if not found:
        pytest.fail(
            f"commit {sha} ({OLDER_BUILDS.get(sha, 'an older build')}) is not in this "
            "checkout's history, and the older-build test runs it beside HEAD; fetch the "
            "history (`git fetch --unshallow`, or a clone without --depth) and run the tests "
            "again.",
            pytrace=False,
        )


def build(sha: str) -> Build:
    """Return the build of commit ``sha``, building it first when it is not cached."""
    require_commit(sha)
    CACHE.mkdir(parents=True, exist_ok=True)
    root = CACHE / sha
    with (CACHE / f"{sha}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".ready").exists():
            _build_into(sha, root)
    return Build(sha, root)


def _build_into(sha: str, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)  # a build cut short before .ready
    archive = _git("archive", "--format=tar", sha)
    if archive.returncode != 0:
        pytest.fail(f"git archive {sha} failed: {archive.stderr.decode(errors='replace')}")
    root.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    if not UV.exists():
        pytest.fail(f"{UV} is missing; run `make install` first (it installs the pinned uv).")
    # The developer's environment (certificates, proxies, uv's cache), but never the
    # test process's own virtualenv: the build gets its own.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["UV_PROJECT_ENVIRONMENT"] = str(root / ".venv")
    synced = subprocess.run(
        [str(UV), "sync", "--frozen", "--no-dev", "--quiet"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if synced.returncode != 0:
        pytest.fail(f"uv sync of build {sha} failed:\n{synced.stderr[-4000:]}")
    (root / ".ready").touch()
