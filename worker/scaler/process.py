"""The process backend: machines are local ``lane-worker run`` processes.

For a single VM without an orchestrator, for ``lane-worker dev``, and for tests.
Each machine is a directory entry under the state directory (``<id>.json``: its
release, app and process id; ``<id>.exit``: how it exited; ``<id>.log``: what it
printed), so a scaler that restarts lists the same machines: the processes run
in their own session and outlive it. The "image" of a release is the app the
worker serves (``module:attr``, as ``lane-worker run --app`` takes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import anyio

from worker.scaler.backend import FAILED, RELEASE_METADATA, STARTED, STOPPED, BackendError, Machine

# What a machine inherits from the scaler: the database and the store, not the
# scaler's own settings (a machine's release, machine id and port are its own).
_NOT_INHERITED = (
    "DEEPLINE_RUNTIME_DEPLOY_VERSION", "LANE_WORKER_MACHINE_ID", "LANE_WORKER_HEALTH_PORT",
    "LANE_WORKER_SCALER_BACKEND", "LANE_WORKER_SCALER_STATE_DIR", "FLY_API_TOKEN",
)  # fmt: skip


class ProcessBackend:
    """Machines as local processes, recorded under ``state_dir``."""

    name = "process"

    def __init__(self, state_dir: Path, env: Mapping[str, str]) -> None:
        self.state_dir = state_dir
        self.env = {k: v for k, v in env.items() if k not in _NOT_INHERITED}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
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
            machines.append(self._machine(record))
        return machines

    def _machine(self, record: dict[str, object]) -> Machine:
        machine_id = str(record["id"])
        exit_file = self.state_dir / f"{machine_id}.exit"
        exit_code: int | None = None
        if exit_file.exists():
            try:
                exit_code = int(exit_file.read_text().strip())
            except ValueError:
                exit_code = None
        alive = _alive(int(str(record["pid"])), machine_id)
        if alive:
            state = STARTED
        elif exit_code is None or exit_code == 0:
            state = STOPPED
        else:
            state = FAILED
        return Machine(
            machine_id=machine_id,
            release_id=str(record[RELEASE_METADATA]),
            image=str(record["image"]),
            state=state,
            age_s=max(0.0, time.time() - float(str(record["created_at"]))),
            exit_code=exit_code,
        )

    async def create(self, release_id: str, image: str) -> Machine:
        machine_id = f"m-{secrets.token_hex(4)}"
        log = self.state_dir / f"{machine_id}.log"
        exit_file = self.state_dir / f"{machine_id}.exit"
        env = {
            **self.env,
            "DEEPLINE_RUNTIME_DEPLOY_VERSION": release_id,
            "LANE_WORKER_MACHINE_ID": machine_id,
            "LANE_WORKER_HEALTH_PORT": "0",
        }
        # A shell records the worker's exit code (how a machine that refused to
        # boot is told from one that stopped); its own session outlives the scaler.
        argv = ["/bin/sh", "-c", 'exec 1>>"$0" 2>&1; "$@"; echo $? > "$0.exit.tmp"; '
                'mv "$0.exit.tmp" "' + str(exit_file) + '"',
                str(log), sys.executable, "-m", "worker", "run", "--app", image]  # fmt: skip
        try:
            # The image (an app spec) is an argument of its own ("$@"), never shell text.
            process = await anyio.to_thread.run_sync(
                lambda: subprocess.Popen(  # noqa: S603
                    argv, env=env, start_new_session=True,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        except OSError as exc:
            raise BackendError(f"could not start a worker process: {exc}") from exc
        # Kept to reap it when it exits (list, destroy); a restarted scaler's
        # machines are not its children, and init reaps those.
        self._children[machine_id] = process
        record = {"id": machine_id, RELEASE_METADATA: release_id, "image": image,
                  "pid": process.pid, "created_at": time.time()}  # fmt: skip
        tmp = self._record(machine_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(self._record(machine_id))
        return self._machine(record)

    async def stop(self, machine: Machine) -> None:
        pid = self._pid(machine)
        if pid is not None and _alive(pid, machine.machine_id):
            # The whole session: the shell and the worker under it.
            _signal_group(pid, signal.SIGTERM)

    async def destroy(self, machine: Machine) -> None:
        pid = self._pid(machine)
        if pid is not None and _alive(pid, machine.machine_id):
            _signal_group(pid, signal.SIGKILL)
        child = self._children.pop(machine.machine_id, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(lambda: child.wait(timeout=5))
        # The log stays (a machine that failed to boot is explained there).
        for suffix in (".json", ".exit"):
            (self.state_dir / f"{machine.machine_id}{suffix}").unlink(missing_ok=True)

    def _pid(self, machine: Machine) -> int | None:
        try:
            return int(json.loads(self._record(machine.machine_id).read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None


def _alive(pid: int, machine_id: str) -> bool:
    """Whether ``pid`` is still this machine's process (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False  # exited, not yet reaped
    except (OSError, IndexError):
        return False
    return machine_id.encode() in cmdline


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass
    except PermissionError as exc:
        raise BackendError(f"cannot signal process group {pid}: {exc}") from exc
