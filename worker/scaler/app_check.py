"""The process backend's deploy-time check of a release's app (``module:attr``).

A process-backend machine runs ``python -m worker run --app IMAGE`` with the
scaler's interpreter, in the scaler's directory and with the scaler's
environment (``process.machine_env``). A typo in ``--image`` was found only when
the machine booted and died; ``releases deploy`` now runs this check first, in a
subprocess started as the machine would be (the live scaler's interpreter,
directory and environment, read from ``/proc`` on its host), so nothing of the
deploying process (its directory, its ``sys.path``, its variables) decides the
answer. ``python -m worker.app_check IMAGE`` imports the module and
checks the attribute is a lane-worker ``App``: exit 0, or 2 with the reason as
its last line (as ``run --app`` says it).

With the Fly backend there is no local check: the image is built elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from worker.db.store.rows import ScalerState
from worker.scaler.process import machine_env

CHECK_TIMEOUT_S = 120.0  # an import that takes longer is said, not waited on


@dataclass(frozen=True)
class CheckOutcome:
    """``problem``: why the app does not load (refuse the deploy); ``cannot``: why the
    check cannot be done here (refuse, unless skipped); both None: it loads."""

    problem: str | None = None
    cannot: str | None = None


def _interpreter(argv0: str, cwd: str, env: dict[str, str]) -> str:
    """The scaler's interpreter from its argv[0], as its directory and PATH resolve it."""
    if os.sep in argv0:
        return os.path.join(cwd, argv0)
    return shutil.which(argv0, path=env.get("PATH")) or argv0


def check_app(image: str, release_id: str, scaler: ScalerState | None) -> CheckOutcome | None:
    """Check ``image`` as ``scaler``'s machines would load it; None when no process-backend
    scaler has reported (nothing to check against: the Fly backend, or none yet)."""
    if scaler is None or scaler.backend != "process":
        return None
    host, _, pid_text = scaler.holder.rpartition(":")
    if host != socket.gethostname():
        return CheckOutcome(
            cannot=f"the process-backend scaler runs on host {host!r}, not here: deploy "
            "from its host (as its user)"
        )
    proc = Path(f"/proc/{pid_text if pid_text.isdigit() else 'unknown'}")
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        if b"scaler" not in argv:
            raise OSError("not a scaler")
        cwd = os.readlink(proc / "cwd")
        environ = (proc / "environ").read_bytes()
    except OSError:
        return CheckOutcome(
            cannot=f"the process-backend scaler (pid {pid_text or '?'}) is not running here "
            "or cannot be read by this user: start it (or deploy as its user)"
        )
    env = dict(
        item.split("=", 1) for item in environ.decode(errors="replace").split("\0") if "=" in item
    )
    # Its interpreter as started (a virtualenv's python, not the file it links to:
    # /proc's exe resolves the link and loses the virtualenv).
    python = _interpreter(argv[0].decode(errors="replace"), cwd, env)
    try:
        done = subprocess.run(  # noqa: S603 (the scaler's own interpreter, the image as an argument)
            [python, "-m", "worker.app_check", image],
            cwd=cwd,
            env=machine_env(env, release_id, "app-check"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CheckOutcome(
            cannot=f"importing {image} did not finish in {CHECK_TIMEOUT_S:g} s (does it block?)"
        )
    except OSError as exc:
        return CheckOutcome(cannot=f"could not run the check with {python}: {exc}")
    if done.returncode == 0:
        return CheckOutcome()
    lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines()]
    said = next((line for line in reversed(lines) if line), f"exit {done.returncode}")
    return CheckOutcome(problem=f"{said.removeprefix('lane-worker: ')} (checked in {cwd})"[:1000])
