"""The TypeScript client (``clients/typescript``), built for the tests that run it with Node.

:func:`built_client` installs its pinned dependencies with ``npm ci`` when they are
missing or older than its ``package-lock.json`` (a clean clone has none) and compiles
it and its tests with ``tsc`` when a source is newer than the last build. A file lock
makes the test workers of one machine build it once, one at a time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from support import REPO

CLIENT = REPO / "clients" / "typescript"
BUILT = CLIENT / "build" / ".built"  # written after a build of the package and its tests
INSTALLED = CLIENT / "node_modules" / ".package-lock.json"  # npm writes it on every install
# Hang guards only (a cold npm cache on a slow network takes minutes).
INSTALL_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 600


def _newest(paths: Iterable[Path]) -> float:
    return max((p.stat().st_mtime for p in paths if p.is_file()), default=0.0)


def _sources() -> list[Path]:
    found = [CLIENT / "package.json", CLIENT / "package-lock.json"]
    found += CLIENT.glob("tsconfig*.json")
    for folder in ("src", "test"):
        found += (CLIENT / folder).rglob("*.ts")
    return found


def _run(argv: list[str], timeout_s: int) -> None:
    done = subprocess.run(
        argv, cwd=CLIENT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"`{' '.join(argv[1:])}` in {CLIENT} failed ({done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-4000:]}",
            pytrace=False,
        )


def built_client() -> str:
    """Return the path of ``node`` once the client and its tests are built and current."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "the TypeScript client's tests need Node 18+ and npm on PATH (CI installs them)",
            pytrace=False,
        )
    key = hashlib.sha256(str(CLIENT).encode()).hexdigest()[:12]
    lock_path = Path(tempfile.gettempdir()) / f"lane-worker-tsclient-{key}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock_file = CLIENT / "package-lock.json"
        if not INSTALLED.exists() or INSTALLED.stat().st_mtime < lock_file.stat().st_mtime:
            # `npm ci` also runs the package's `prepare` (its build).
            _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], INSTALL_TIMEOUT_S)
        if not BUILT.exists() or BUILT.stat().st_mtime < _newest(_sources()):
            _run([npm, "run", "--silent", "build"], BUILD_TIMEOUT_S)
            _run([npm, "run", "--silent", "build:test"], BUILD_TIMEOUT_S)
            BUILT.touch()
    return node


def node_env(database_url: str, schema: str, **more: str) -> Mapping[str, str]:
    """Return the environment of a client script on ``database_url``'s store ``schema``."""
    return {**os.environ, "DATABASE_URL": database_url, "STORE_SCHEMA": schema, **more}


# What a README snippet may use without defining it (the client of an earlier snippet).
_SNIPPET_GIVEN = {
    "lanes": "import type { LaneClient as GivenClient } from '@lane-worker/client';\n"
    "declare const lanes: GivenClient;\n",
    "executorToken": "declare const executorToken: string;\n",
}
_IMPORTS = re.compile(r"^import\b[^;]*?from '[^']+';\n", re.MULTILINE)


def snippet_module(block: str) -> str:
    """Return a README ```ts block as a module: imports first, the rest in an async function."""
    imports = "".join(_IMPORTS.findall(block))
    body = _IMPORTS.sub("", block)
    given = "".join(
        text
        for name, text in _SNIPPET_GIVEN.items()
        if re.search(rf"\b{name}\b", body) and not re.search(rf"\bconst {name}\b", body)
    )
    indented = "".join(f"  {line}\n" if line else "\n" for line in body.splitlines())
    return f"{imports}{given}\nexport async function example(): Promise<void> {{\n{indented}}}\n"


def typecheck_snippets(blocks: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    """Compile ``blocks`` (README ```ts code) in ``folder`` against the client's sources."""
    for i, block in enumerate(blocks):
        (folder / f"snippet_{i}.ts").write_text(snippet_module(block))
    config = {
        "extends": str(CLIENT / "tsconfig.json"),
        "compilerOptions": {
            "noEmit": True,
            "rootDir": "/",
            "typeRoots": [str(CLIENT / "node_modules" / "@types")],
            "paths": {"@lane-worker/client": [str(CLIENT / "src" / "index.ts")]},
        },
        "include": ["*.ts"],
    }
    (folder / "tsconfig.json").write_text(json.dumps(config))
    tsc = CLIENT / "node_modules" / "typescript" / "bin" / "tsc"
    node = shutil.which("node") or "node"
    return subprocess.run(
        [node, str(tsc), "-p", str(folder)],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
