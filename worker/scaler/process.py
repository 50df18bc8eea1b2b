"""The process backend: machines are local ``lane-worker run`` processes.

For a single VM without an orchestrator, for ``lane-worker dev``, and for tests.
Each machine is a few files under the state directory (``<id>.json``: its
release, app and store, written before it starts; ``<id>.stopping``: when its
stop was sent; ``<id>.pids``: its wrapper's and its
worker's process ids; ``<id>.exit``: how the worker exited; ``<id>.log``: what
it printed), so a scaler that restarts lists the same machines: the processes
run in their own session and outlive it. A small wrapper (``machine.py``) is
each machine's first process: it forwards the stop signal to the worker and
records its exit. The "image" of a release is the app the
worker serves (``module:attr``, as ``lane-worker run --app`` takes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import anyio

from worker.config.env import DATABASE_URL_ENV, MACHINE_URL_ENV
from worker.lanes import QUEUE_SUFFIX_ENV
from worker.scaler.backend import (
    FAILED,
    RELEASE_METADATA,
    STARTED,
    STARTING,
    STOPPED,
    STOPPING,
    STORE_METADATA,
    BackendError,
    Machine,
    machine_stop_s,
)

# A machine recorded this long ago whose wrapper never said its pid did not start.
START_GRACE_S = 15.0
# Where `worker.ready` is looked for in a machine's log (its first lines: boot's).
LOG_HEAD_BYTES = 256 * 1024
# Its port, as the JSON (`"health_port": 8123`) and the console (`health_port=8123`) logs say it.
_READY_PORT = re.compile(rb'health_port"?\s*[:=]\s*([0-9]{1,5})\b')

# What a machine inherits from the scaler: the database and the store, not the
# scaler's own settings (a machine's release, machine id and port are its own),
# nor a queue suffix: a registry release's lane is its release id's (a suffix
# would put every release on one lane).
# The database URL the process backend's machines connect with (issue 33): a
# login of the worker's role, where the scaler connects as the scaler's, which
# cannot run a worker. Unset: the machines inherit the scaler's URL.
_NOT_INHERITED = (
    MACHINE_URL_ENV,
    "DEEPLINE_RUNTIME_DEPLOY_VERSION",
    "LANE_WORKER_MACHINE_ID",
    "LANE_WORKER_HEALTH_PORT",
    "LANE_WORKER_SCALER_BACKEND",
    "LANE_WORKER_SCALER_STATE_DIR",
    "FLY_API_TOKEN",
    QUEUE_SUFFIX_ENV,
)


class ProcessBackend:
    """Machines as local processes, recorded under ``state_dir``."""

    name = "process"

    def __init__(self, state_dir: Path, env: Mapping[str, str]) -> None:
        self.state_dir = state_dir
        self.store_id = ""  # the scaler sets it before its first call
        self.env = inherited(env)
        # Machines inherit the scaler's drain window: a margin above their longest stop.
        self.stop_deadline_s = machine_stop_s(self.env) + 30.0
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._ports: dict[str, int] = {}  # a machine's health port, once its log said it
        state_dir.mkdir(parents=True, exist_ok=True)

    def _record(self, machine_id: str) -> Path:
        return self.state_dir / f"{machine_id}.json"

    def _reap(self) -> None:
        for machine_id, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[machine_id]

    async def list(self) -> list[Machine]:
        self._reap()
        machines = []
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # half written by a create that was cut off: not ours yet
            if not isinstance(record, dict) or RELEASE_METADATA not in record:
                continue
            if record.get(STORE_METADATA) != self.store_id:
                continue  # another store's scaler shares this folder: its machines
            machines.append(self._machine(record))
        return machines

    def _pids(self, machine_id: str) -> tuple[int | None, int | None]:
        """The wrapper's and the worker's process ids, as the wrapper wrote them."""
        try:
            pids = json.loads((self.state_dir / f"{machine_id}.pids").read_text())
            wrapper, worker = pids.get("wrapper"), pids.get("worker")
        except (OSError, ValueError, AttributeError):
            return None, None
        return (
            wrapper if isinstance(wrapper, int) else None,
            worker if isinstance(worker, int) else None,
        )

    def _machine(self, record: dict[str, object]) -> Machine:
        machine_id = str(record["id"])
        exit_file = self.state_dir / f"{machine_id}.exit"
        exit_code: int | None = None
        if exit_file.exists():
            try:
                exit_code = int(exit_file.read_text().strip())
            except ValueError:
                exit_code = None
        age_s = max(0.0, time.time() - float(str(record["created_at"])))
        wrapper, worker = self._pids(machine_id)
        stopping_s = self._stopping_s(machine_id)
        if _alive(wrapper, machine_id) or _alive(worker, machine_id):
            state = STARTED if stopping_s is None else STOPPING
        elif wrapper is None and exit_code is None and age_s < START_GRACE_S:
            state = STARTING  # recorded, its wrapper not yet up
        elif exit_code is None or exit_code == 0:
            state = STOPPED
        else:
            state = FAILED
        return Machine(
            machine_id=machine_id,
            release_id=str(record[RELEASE_METADATA]),
            image=str(record["image"]),
            state=state,
            age_s=age_s,
            exit_code=exit_code,
            stopping_s=stopping_s,
            health_port=self._health_port(machine_id) if state in (STARTED, STOPPING) else None,
            last_line=last_line_in(self.where_log(machine_id)) if state == FAILED else None,
        )

    def _health_port(self, machine_id: str) -> int | None:
        """The port its worker listens on: each machine picks a free one (port 0)."""
        port = self._ports.get(machine_id)
        if port is None:
            port = health_port_in(self.state_dir / f"{machine_id}.log")
            if port is not None:
                self._ports[machine_id] = port
        return port

    def _stopping_s(self, machine_id: str) -> float | None:
        """Seconds since the machine's stop was sent; None if it never was."""
        try:
            sent = float((self.state_dir / f"{machine_id}.stopping").read_text())
        except (OSError, ValueError):
            return None
        return max(0.0, time.time() - sent)

    async def create(self, release_id: str, image: str) -> Machine:
        machine_id = f"m-{secrets.token_hex(4)}"
        env = machine_env(self.env, release_id, machine_id)
        # Recorded before it starts: a scaler cut off between the two leaves a
        # record the next pass finds (and cleans up), never an untracked process.
        if not self.store_id:
            raise BackendError("the process backend has no store id yet: nothing is created")
        record = {
            "id": machine_id,
            RELEASE_METADATA: release_id,
            "image": image,
            STORE_METADATA: self.store_id,
            "created_at": time.time(),
        }
        tmp = self._record(machine_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self._record(machine_id))
        # The wrapper (worker/scaler/machine.py) forwards the stop signal to the
        # worker and records its exit; its own session outlives the scaler. The
        # image (an app spec) is an argument, never shell text.
        argv = [
            sys.executable,
            "-m",
            "worker.scaler.machine",
            str(self.state_dir),
            machine_id,
            "--",
            sys.executable,
            "-m",
            "worker",
            "run",
            "--app",
            image,
        ]
        try:
            process = await anyio.to_thread.run_sync(
                lambda: subprocess.Popen(  # noqa: S603
                    argv,
                    env=env,
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        except OSError as exc:
            self._record(machine_id).unlink(missing_ok=True)
            raise BackendError(f"could not start a worker process: {exc}") from exc
        # Kept to reap it when it exits (list, destroy); a restarted scaler's
        # machines are not its children, and init reaps those.
        self._children[machine_id] = process
        return self._machine(record)

    async def stop(self, machine: Machine) -> None:
        wrapper, worker = self._pids(machine.machine_id)
        # The wrapper forwards it to the worker once (a second SIGTERM would make
        # the worker exit at once instead of draining).
        if _alive(wrapper, machine.machine_id):
            _signal(wrapper, signal.SIGTERM)
        elif _alive(worker, machine.machine_id):
            _signal(worker, signal.SIGTERM)
        # Recorded after the signal: the machine lists as stopping from now on, so
        # no scaler (this one restarted, or a standby) sends it again; one cut off
        # in between sends it again, which the wrapper ignores.
        mark = self.state_dir / f"{machine.machine_id}.stopping"
        if not mark.exists():
            tmp = mark.with_suffix(".stopping-tmp")
            tmp.write_text(repr(time.time()))
            tmp.replace(mark)

    async def destroy(self, machine: Machine) -> None:
        wrapper, worker = self._pids(machine.machine_id)
        for pid in (worker, wrapper):
            if _alive(pid, machine.machine_id):
                _signal(pid, signal.SIGKILL)
        child = self._children.pop(machine.machine_id, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(lambda: child.wait(timeout=5))
        self._ports.pop(machine.machine_id, None)
        # The log stays (a machine that failed to boot is explained there).
        for suffix in (".json", ".exit", ".pids", ".stopping"):
            (self.state_dir / f"{machine.machine_id}{suffix}").unlink(missing_ok=True)

    def where_log(self, machine_id: str) -> Path:
        return self.state_dir / f"{machine_id}.log"

    def where_logs(self, machine_id: str) -> str:
        return str(self.state_dir / f"{machine_id}.log")


def inherited(env: Mapping[str, str]) -> dict[str, str]:
    """What a machine inherits of the scaler's environment (``_NOT_INHERITED`` aside),
    with the machines' own database URL (``MACHINE_URL_ENV``) in place of the scaler's."""
    machine_url = (env.get(MACHINE_URL_ENV) or "").strip()
    kept = {k: v for k, v in env.items() if k not in _NOT_INHERITED}
    return {**kept, DATABASE_URL_ENV: machine_url} if machine_url else kept


def machine_env(env: Mapping[str, str], release_id: str, machine_id: str) -> dict[str, str]:
    """A machine's environment: the scaler's ``env`` as inherited, its release and id."""
    return {
        **inherited(env),
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": release_id,
        "LANE_WORKER_MACHINE_ID": machine_id,
        "LANE_WORKER_HEALTH_PORT": "0",
    }


def health_port_in(log: Path) -> int | None:
    """The health port a worker's `worker.ready` line names in ``log``; None before it."""
    try:
        with log.open("rb") as f:
            head = f.read(LOG_HEAD_BYTES)
    except OSError:
        return None
    for line in head.splitlines():
        if b"worker.ready" in line:
            found = _READY_PORT.search(line)
            if found is not None and 0 < int(found.group(1)) <= 65_535:
                return int(found.group(1))
    return None


def last_line_in(log: Path, limit: int = 300) -> str | None:
    """The last line a dead machine's worker printed (why it refused to boot), cut to
    ``limit`` characters; None when its log is empty or unreadable."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read()
    except OSError:
        return None
    lines = [line.strip() for line in tail.decode("utf-8", "replace").splitlines()]
    last = next((line for line in reversed(lines) if line), None)
    return None if last is None else last[:limit]


def _alive(pid: int | None, machine_id: str) -> bool:
    """Whether ``pid`` is still a process of this machine (not a reused pid).

    The wrapper names the machine in its arguments, the worker in its environment.
    """
    if pid is None:
        return False
    proc = Path(f"/proc/{pid}")
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False  # exited, not yet reaped
        mark = machine_id.encode()
        if mark in (proc / "cmdline").read_bytes():
            return True
        return b"LANE_WORKER_MACHINE_ID=" + mark + b"\0" in (proc / "environ").read_bytes()
    except (OSError, IndexError):
        return False


def _signal(pid: int | None, signum: int) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise BackendError(f"cannot signal process {pid}: {exc}") from exc
