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
its last line (as ``run --app`` says it), after the traceback of an import that
raised. The child has the scaler's environment: what is shown of its output (the
reason, the traceback's last ``TRACEBACK_LINES`` lines) is masked with the scaler's
secrets (``backend.scaler_secrets``), as the scaler masks its own records.

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
from worker.masking import mask_response
from worker.scaler.backend import scaler_secrets
from worker.scaler.process import machine_env

CHECK_TIMEOUT_S = 120.0  # an import that takes longer is said, not waited on
SAID_CHARS = 1000  # of the child's reason
TRACEBACK_LINES = 20  # of its traceback's last lines (after its first) shown
LINE_CHARS = 500  # of each
_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class CheckOutcome:
    """``problem``: why the app does not load (refuse the deploy); ``cannot``: why the
    check cannot be done here (refuse, unless skipped); both None: it loads."""

    problem: str | None = None
    cannot: str | None = None
    traceback: tuple[str, ...] = ()  # the last lines of the traceback ``problem`` speaks of


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
    return refusal_of(done.stderr.decode(errors="replace"), done.returncode, cwd, env)


def refusal_of(stderr: str, returncode: int, cwd: str, env: dict[str, str]) -> CheckOutcome:
    """The child's reason (its last line) and its traceback's last lines, masked.

    The child runs with the scaler's environment: an import error may quote it (the
    database URL, the API token), so all of it is masked with the scaler's secrets.
    """
    secrets = scaler_secrets(env)
    lines = [line.rstrip() for line in stderr.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    said = lines.pop().strip() if lines else f"exit {returncode}"
    problem = f"{said.removeprefix('lane-worker: ')} (checked in {cwd})"
    return CheckOutcome(
        problem=mask_response(problem, secrets, SAID_CHARS),
        traceback=_traceback_of(lines, secrets),
    )


def _traceback_of(lines: list[str], secrets: tuple[str, ...]) -> tuple[str, ...]:
    """The child's traceback (from its first ``Traceback`` line), at most
    ``TRACEBACK_LINES`` of its last lines after its first, each masked and cut."""
    first = next((i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)), None)
    if first is None:
        return ()
    shown = lines[first:]
    if len(shown) > TRACEBACK_LINES + 1:
        left_out = len(shown) - 1 - TRACEBACK_LINES
        shown = [shown[0], f"  ... ({left_out} lines not shown)", *shown[-TRACEBACK_LINES:]]
    return tuple(mask_response(line, secrets, LINE_CHARS) for line in shown)
