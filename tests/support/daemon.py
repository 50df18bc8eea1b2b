"""Run the real daemon (`python -m worker run`) as a child process and watch its logs.

A :class:`Daemon` is one process: its stdout is read line by line in a thread
(JSON objects parsed, anything else kept as ``{"event": None, "raw": ...}``) so a
test can ``await daemon.wait_for("run.completed", run_id=...)`` instead of
sleeping. :class:`Daemons` starts them against one test database and, on the
way out, kills whatever still runs (before the database is dropped) and adds
every daemon's log tail to a failing test's exception.

A daemon has ``tests/`` on its ``PYTHONPATH``, so ``--app`` names an app of
:mod:`support.apps` (default ``support.apps.basic:app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from support import REPO, TESTS_DIR, give_up_after
from worker import lanes

APP_SPEC = "support.apps.basic:app"
POLL_S = 0.02
TAIL_LINES = 40


def base_env(database_url: str, release_id: str) -> dict[str, str]:
    """Return the environment of a daemon of ``release_id`` on ``database_url``."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(TESTS_DIR),
        "PYTHONUNBUFFERED": "1",
        "WORKFLOW_RUNTIME_POSTGRES": database_url,
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": release_id,
        "LANE_WORKER_HEALTH_PORT": "0",
        "LANE_WORKER_LOG_FORMAT": "json",
        "LANE_WORKER_POLL_INTERVAL": "0.5",
        "LANE_WORKER_DRAIN_SECONDS": "5",
        "LANE_WORKER_CLAIM_TIMEOUT": "30",
    }


def queue_of(release_id: str) -> str:
    """Return the lane queue of a release."""
    return lanes.queue_name_for_release(release_id)


class Daemon:
    """One daemon process (`python -m worker run`, or a given command) and all it printed."""

    def __init__(
        self,
        name: str,
        env: Mapping[str, str],
        app: str = APP_SPEC,
        *,
        argv: Sequence[str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        """Start the process: ``python -m worker run --app APP``, or exactly ``argv``."""
        self.name = name
        self.env = dict(env)
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            list(argv)
            if argv is not None
            else [sys.executable, "-m", "worker", "run", "--app", app],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        #: Every stdout line, parsed: a JSON object, or ``{"event": None, "raw": line}``.
        self.records: list[dict[str, Any]] = []
        self.stderr_lines: list[str] = []
        self.exited_at: float | None = None
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True, name=f"{name}-stdout"),
            threading.Thread(target=self._read_stderr, daemon=True, name=f"{name}-stderr"),
        ]
        for reader in self._readers:
            reader.start()

    # -- reading ------------------------------------------------------------

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            text = line.rstrip("\n")
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                parsed = {"event": None, "raw": text}
            parsed.setdefault("_mono", time.monotonic())
            self.records.append(parsed)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        """Return what the process wrote to stderr so far."""
        return "\n".join(self.stderr_lines)

    @property
    def pid(self) -> int:
        """Return the process id."""
        return self.proc.pid

    def events(self, event: str | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Return the log records so far with ``event`` (any, if None) matching ``filters``."""
        return [r for r in list(self.records) if _matches(r, event, filters)]

    def index_of(self, event: str, **filters: Any) -> int:
        """Return the position of the first matching record, or -1."""
        for i, record in enumerate(list(self.records)):
            if _matches(record, event, filters):
                return i
        return -1

    def malformed_lines(self) -> list[str]:
        """Return stdout lines that break the log contract.

        Every line is a JSON object with ``event``, ``level`` and ``timestamp``;
        every line about a run also carries ``release_id``, ``queue`` and ``worker_id``.
        """
        bad = []
        for record in list(self.records):
            if record.get("event") is None:
                bad.append(f"not JSON: {record.get('raw')}")
            elif not all(record.get(k) for k in ("level", "timestamp")):
                bad.append(f"no level/timestamp: {_compact(record)}")
            elif "run_id" in record and not all(
                record.get(k) for k in ("release_id", "queue", "worker_id")
            ):
                bad.append(f"run line without release_id/queue/worker_id: {_compact(record)}")
        return bad

    def tail(self, lines: int = TAIL_LINES) -> str:
        """Return the last stdout and stderr lines, for failure messages."""
        out = [
            r.get("raw") if r.get("event") is None else _compact(r)
            for r in list(self.records)[-lines:]
        ]
        err = self.stderr_lines[-lines:]
        code = self.proc.poll()
        state = "running" if code is None else f"exited {code}"
        return (
            f"--- daemon {self.name} (pid {self.pid}, {state}) stdout tail ---\n"
            + "\n".join(str(line) for line in out)
            + f"\n--- daemon {self.name} stderr tail ---\n"
            + "\n".join(err)
        )

    async def wait_for(
        self, event: str, *, timeout_s: float = 20, since: int = 0, **filters: Any
    ) -> dict[str, Any]:
        """Return the first record from position ``since`` with ``event`` matching ``filters``.

        Fails with the log tail when ``timeout_s`` passes (``WAIT_FLOOR_S`` at least),
        or at once when the process has exited and printed everything without such a
        record.
        """
        timeout_s = give_up_after(timeout_s)
        deadline = time.monotonic() + timeout_s
        checked = since
        while True:
            records = self.records
            while checked < len(records):
                record = records[checked]
                checked += 1
                if _matches(record, event, filters):
                    return record
            if self.proc.poll() is not None and not self._readers[0].is_alive():
                if checked >= len(self.records):
                    raise AssertionError(
                        f"daemon {self.name} exited ({self.proc.returncode}) without logging "
                        f"{event} {filters}\n{self.tail()}"
                    )
                continue
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"daemon {self.name}: no {event} {filters} within {timeout_s} s\n{self.tail()}"
                )
            await asyncio.sleep(POLL_S)

    async def ready(self, timeout_s: float = 30) -> dict[str, Any]:
        """Wait for ``worker.ready`` and return it."""
        return await self.wait_for("worker.ready", timeout_s=timeout_s)

    @property
    def health_port(self) -> int:
        """Return the health port ``worker.ready`` reported (the daemon must be ready)."""
        ready = self.events("worker.ready")
        assert ready, f"daemon {self.name} is not ready yet\n{self.tail()}"
        return int(ready[0]["health_port"])

    @property
    def worker_id(self) -> str:
        """Return the worker id ``worker.ready`` reported."""
        ready = self.events("worker.ready")
        assert ready, f"daemon {self.name} is not ready yet\n{self.tail()}"
        return str(ready[0]["worker_id"])

    # -- stopping -------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Tell whether the process is still running."""
        return self.proc.poll() is None

    def terminate(self) -> None:
        """Send SIGTERM (the orchestrator's stop)."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)

    def interrupt(self) -> None:
        """Send SIGINT (Ctrl-C)."""
        if self.running:
            self.proc.send_signal(signal.SIGINT)

    def kill(self) -> None:
        """Send SIGKILL."""
        if self.running:
            self.proc.kill()

    async def wait_exit(self, timeout_s: float = 30) -> int:
        """Wait until the process exits (and its output is read); return its exit code.

        Fails when ``timeout_s`` passes (``WAIT_FLOOR_S`` at least).
        """
        timeout_s = give_up_after(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"daemon {self.name} still running after {timeout_s} s\n{self.tail()}"
                )
            await asyncio.sleep(POLL_S)
        if self.exited_at is None:
            self.exited_at = time.monotonic()
        for reader in self._readers:
            await asyncio.to_thread(reader.join, 10)
        return self.proc.returncode

    def close(self) -> None:
        """Kill the process if it still runs, reap it, close its pipes (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for reader in self._readers:
            reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def one_sentence(stderr: str) -> str:
    """Return stderr as one line, failing when it is empty, several lines or a traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


def _matches(record: dict[str, Any], event: str | None, filters: Mapping[str, Any]) -> bool:
    if event is not None and record.get("event") != event:
        return False
    return all(record.get(key) == value for key, value in filters.items())


def _compact(record: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in record.items() if k != "_mono"}, default=str)


class Daemons:
    """Starts daemons on one test database; stops them all on the way out.

    Use as ``async with Daemons(database_url) as pool:`` inside the test, so a
    failing test's exception carries every daemon's log tail and no daemon
    outlives the test (the database fixture drops the database afterwards).
    """

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.started: list[Daemon] = []

    def start(
        self, release_id: str, *, name: str | None = None, app: str = APP_SPEC, **env: str | None
    ) -> Daemon:
        """Start a daemon of ``release_id``; ``env`` overrides the defaults (None removes)."""
        values = base_env(self.database_url, release_id)
        for key, value in env.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        daemon = Daemon(name or f"{release_id}#{len(self.started) + 1}", values, app)
        self.started.append(daemon)
        return daemon

    def start_raw(
        self,
        name: str,
        env: Mapping[str, str],
        app: str = APP_SPEC,
        *,
        argv: Sequence[str] | None = None,
        cwd: Path = REPO,
    ) -> Daemon:
        """Start a daemon with exactly ``env`` (boot-guard tests), or exactly ``argv`` in ``cwd``.

        ``argv`` is looked up on ``env``'s ``PATH``, as a container runs its ``CMD``.
        """
        daemon = Daemon(name, env, app, argv=argv, cwd=cwd)
        self.started.append(daemon)
        return daemon

    async def __aenter__(self) -> Daemons:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for daemon in self.started:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(daemon.close)
        if exc is not None:
            message = str(exc)
            for daemon in self.started:
                if f"--- daemon {daemon.name} (pid {daemon.pid}," not in message:
                    exc.add_note(daemon.tail())
