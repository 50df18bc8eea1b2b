"""Child processes of the benchmarks (a lane-worker daemon, an absurd-sdk worker) and probes.

A :class:`Child` writes its stdout (JSON lines) to a file that is read as it
grows; it runs in its own session, so a terminal's Ctrl-C reaches only the
benchmark, which stops it (SIGTERM, then SIGKILL) on the way out. CPU and RSS
come from /proc.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
BENCH_APP = "bench_app:app"
SDK_WORKER = BENCH_DIR / "sdk_worker.py"
SDK_VENV = Path("/tmp/lane-worker-bench-absurd-sdk")  # noqa: S108 (a throwaway venv, by design)
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_LIVE: set[subprocess.Popen[bytes]] = set()


class BenchError(Exception):
    """A benchmark could not produce its figure; the message says why."""


def proc_cpu_s(pid: int) -> float:
    """Return the user + system CPU seconds process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def proc_rss_mb(pid: int) -> float:
    """Return the resident set size of ``pid`` in MiB (what ``ps -o rss`` shows)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def postgres_cpu() -> dict[int, float]:
    """Return the CPU seconds of every live ``postgres`` process on this machine, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if (entry / "comm").read_text().strip() == "postgres":
                    found[int(entry.name)] = proc_cpu_s(int(entry.name))
    return found


class PgCpuMeter:
    """CPU seconds Postgres spends from now on, sampled every 0.2 s while in ``async with``.

    Sampling (rather than a before/after difference) keeps the CPU of backends
    that exit meanwhile: asyncpg's pool closes a connection after 50,000
    queries, and autovacuum workers come and go. What a process used after its
    last sample is lost (at most 0.2 s worth).
    """

    def __init__(self) -> None:
        self.start = postgres_cpu()
        self.last = dict(self.start)
        self._task: asyncio.Task[None] | None = None

    @property
    def seconds(self) -> float:
        """Return the CPU seconds used since the meter was made, up to its last sample."""
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.last.items())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            self.last.update(postgres_cpu())

    async def __aenter__(self) -> PgCpuMeter:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.last.update(postgres_cpu())


def timestamp_s(record: dict[str, Any]) -> float:
    """Return a JSON log record's ISO ``timestamp`` as Unix seconds."""
    return datetime.fromisoformat(str(record["timestamp"])).timestamp()


class Child:
    """One child process (daemon or SDK worker) whose stdout is a file of JSON lines."""

    def __init__(
        self, name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path, cwd: Path = REPO
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.err_path = log_dir / f"{name}.err"
        self.spawned_at = time.time()  # for boot to ready: what a user waits after exec
        with self.log_path.open("wb") as out, self.err_path.open("wb") as err:
            # Its own session: a terminal's Ctrl-C reaches only the benchmark, which stops it.
            self.proc = subprocess.Popen(  # noqa: S603 (fixed argv built here)
                list(argv),
                cwd=cwd,  # `python -m worker` runs the tree it starts in (pair.py)
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        _LIVE.add(self.proc)
        self._reader = self.log_path.open("rb")
        self._partial = b""
        self.records: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        """Return the process id."""
        return self.proc.pid

    def read_records(self) -> list[dict[str, Any]]:
        """Parse the complete lines written since the last call; return them."""
        chunk = self._partial + self._reader.read()
        *lines, self._partial = chunk.split(b"\n")
        fresh = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    fresh.append(record)
        self.records.extend(fresh)
        return fresh

    def check_alive(self) -> None:
        """Raise ``BenchError`` (with the log tail) when the process has exited."""
        if self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.proc.returncode}\n{self.tail()}")

    async def wait_event(
        self, event: str, *, timeout_s: float, after: int = 0, **filters: Any
    ) -> dict[str, Any]:
        """Return the first record of ``event`` matching ``filters`` (from record ``after`` on)."""
        deadline = time.monotonic() + timeout_s
        seen = after
        while True:
            self.read_records()
            for record in self.records[seen:]:
                if record.get("event") == event and all(
                    record.get(k) == v for k, v in filters.items()
                ):
                    return record
            seen = len(self.records)
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: no {event} within {timeout_s} s\n{self.tail()}")
            await asyncio.sleep(0.01)

    def cpu_s(self) -> float:
        """Return the CPU seconds the process and its live children have used.

        The children count for LANE_WORKER_PROCESSES, whose supervisor runs the workers.
        """
        total = proc_cpu_s(self.pid)
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            with contextlib.suppress(OSError):  # it ended meanwhile
                total += proc_cpu_s(int(child))
        return total

    def rss_mb(self) -> float:
        """Return the process's RSS in MiB."""
        return proc_rss_mb(self.pid)

    def tail(self, lines: int = 15) -> str:
        """Return the last lines of stdout and stderr, for failure messages."""
        out = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        err = self.err_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(
            [f"--- {self.name} stdout tail ---", *out, f"--- {self.name} stderr tail ---", *err]
        )

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; reap the process (idempotent)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        _LIVE.discard(self.proc)
        self._reader.close()


@atexit.register
def _kill_leftovers() -> None:
    # A backstop for an event loop that died before its finally blocks ran.
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()


def daemon_env(url: str, release_id: str, **tuning: str) -> dict[str, str]:
    """Return the environment of a bench daemon (JSON logs, ephemeral health port)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(BENCH_DIR),
        "WORKFLOW_RUNTIME_POSTGRES": url,
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": release_id,
        "LANE_WORKER_HEALTH_PORT": "0",
        "LANE_WORKER_LOG_FORMAT": "json",
        "LANE_WORKER_CONCURRENCY": "16",
        "LANE_WORKER_DRAIN_SECONDS": "5",
    }
    env.update(tuning)
    return env


def daemon_argv(profile_to: Path | None = None) -> list[str]:
    """Return the daemon's command line, under cProfile when ``profile_to`` is given."""
    profile = ["-m", "cProfile", "-o", str(profile_to)] if profile_to else []
    return [sys.executable, *profile, "-m", "worker", "run", "--app", BENCH_APP]


def sdk_python(venv: Path, *, install: bool) -> tuple[str | None, str]:
    """Return a Python that imports absurd_sdk (or None) and how it was found or why not.

    The SDK lives in a throwaway venv (default under /tmp), never in the project's.
    """
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import absurd_sdk, importlib.metadata as m; "
             "print(m.version('absurd-sdk'))"]  # fmt: skip
    if python.exists():
        found = subprocess.run(probe, capture_output=True, text=True, check=False)  # noqa: S603
        if found.returncode == 0:
            return str(python), f"absurd-sdk {found.stdout.strip()} in {venv}"
    if not install:
        return None, f"absurd-sdk is not installed in {venv} (and --no-sdk-install was given)"
    print(f"installing absurd-sdk into the throwaway venv {venv} ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "absurd-sdk"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)  # noqa: S603
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"absurd-sdk is not installable ({' '.join(step[-2:])}: {why[0]})"
    return sdk_python(venv, install=False)
