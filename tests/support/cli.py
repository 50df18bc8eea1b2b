"""Run the real CLI as an operator does: a child process with exactly the environment given.

Every helper runs ``python -m worker ARGS`` (or, with ``script=True``, the ``lane-worker``
console script that ``make install`` puts next to the interpreter) from the repository,
with the caller's environment replaced by ``env`` plus ``PATH``; stdin is empty unless
``stdin`` is given. Nothing of the test process's own environment leaks in.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support import REPO

LANE_WORKER_SCRIPT = Path(sys.executable).with_name("lane-worker")
TIMEOUT_S = 60.0


def cli_argv(*args: str | bytes, script: bool = False) -> list[str | bytes]:
    """Return the command line of ``lane-worker ARGS`` (the module, or the console script)."""
    prefix: list[str | bytes] = (
        [str(LANE_WORKER_SCRIPT)] if script else [sys.executable, "-m", "worker"]
    )
    return [*prefix, *args]


def cli_env(env: Mapping[str, str]) -> dict[str, str]:
    """Return ``env`` plus this process's ``PATH``: a child's whole environment."""
    return {"PATH": os.environ.get("PATH", ""), **env}


def operator_env(database_url: str, **extra: str) -> dict[str, str]:
    """Return an operator's environment: the database (and ``extra``), nothing else."""
    return {"WORKFLOW_RUNTIME_POSTGRES": database_url, **extra}


def run_cli(
    env: Mapping[str, str],
    *args: str | bytes,
    stdin: bytes | None = None,
    timeout: float = TIMEOUT_S,
    script: bool = False,
    errors: str = "strict",
) -> subprocess.CompletedProcess[str]:
    """Run ``lane-worker ARGS`` with exactly ``env`` (plus PATH); return what it did.

    The output is decoded as UTF-8 with ``errors`` (``"replace"`` where a test feeds the
    command undecodable bytes).
    """
    return subprocess.run(
        cli_argv(*args, script=script),
        cwd=REPO,
        env=cli_env(env),
        input=stdin.decode() if stdin is not None else None,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        encoding="utf-8",  # what the child writes: Python's UTF-8 mode in the C locale
        errors=errors,
        timeout=timeout,
        check=False,
    )


async def run_cli_async(
    env: Mapping[str, str],
    *args: str | bytes,
    stdin: bytes | None = None,
    timeout_s: float = TIMEOUT_S,
    script: bool = False,
    errors: str = "strict",
) -> subprocess.CompletedProcess[str]:
    """:func:`run_cli` from async code: the event loop goes on while the command runs.

    A child process of its own, not a thread: any number of commands run side by side
    (a thread pool would queue them, a few at a time).
    """
    argv = cli_argv(*args, script=script)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=REPO,
        env=cli_env(env),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise subprocess.TimeoutExpired(argv, timeout_s) from None
    assert proc.returncode is not None
    return subprocess.CompletedProcess(
        argv, proc.returncode, out.decode("utf-8", errors), err.decode("utf-8", errors)
    )


async def cli_json(
    env: Mapping[str, str], *args: str, exit_code: int = 0, quiet: bool = False
) -> Any:
    """Run ``lane-worker ARGS --json`` expecting ``exit_code``; return its one JSON object.

    ``quiet``: a success must also print nothing on stderr.
    """
    done = await run_cli_async(env, *args, "--json")
    assert done.returncode == exit_code, (args, done.returncode, done.stdout, done.stderr)
    if quiet and exit_code == 0:
        assert done.stderr == "", done.stderr
    return json.loads(done.stdout)


async def lane_worker(
    database_url: str, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``lane-worker ARGS`` as an operator does: the database (and ``env``), nothing else."""
    return await run_cli_async(operator_env(database_url, **(env or {})), *args)


async def lane_worker_json(database_url: str, *args: str, exit_code: int = 0) -> Any:
    """Run an operator's ``lane-worker ARGS --json`` expecting ``exit_code``; return its object.

    A success prints nothing on stderr.
    """
    return await cli_json(operator_env(database_url), *args, exit_code=exit_code, quiet=True)


UNSERVED_WARNING = "lane-worker: warning: no worker serves lane "


def submitted_id(env: Mapping[str, str], *args: str) -> str:
    """Run ``lane-worker submit ARGS`` (text mode) that must succeed; return the run id.

    On stderr only the warning that no worker serves the lane, if any (migration 0029).
    """
    result = run_cli(env, "submit", *args)
    assert result.returncode == 0, result.stderr
    assert all(line.startswith(UNSERVED_WARNING) for line in result.stderr.splitlines()), (
        result.stderr
    )
    return result.stdout.strip()


def said_line(line: str) -> str:
    """Return ``line``, or the ``lane-worker: MESSAGE`` a ``--json`` refusal's object stands for
    (``{"error": {"code", "exitCode", "message"}}``, see worker/cli/output.py)."""
    try:
        said = json.loads(line)
    except ValueError:
        return line
    if not isinstance(said, dict) or set(said) != {"error"}:
        return line
    return f"lane-worker: {said['error']['message']}"


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """Return the single ``lane-worker: ...`` line a failed command printed on stderr
    (with ``--json``: the one refusal object, as that line)."""
    lines = [said_line(line) for line in result.stderr.splitlines()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lane-worker: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]
