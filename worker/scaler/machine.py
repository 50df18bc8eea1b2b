"""One machine of the process backend: ``python -m worker.scaler.machine DIR ID -- ARGV``.

The wrapper is the machine's init: it runs the worker (``ARGV``) with its output
appended to ``DIR/ID.log``, forwards the first SIGTERM, SIGINT or SIGHUP it gets
to it and ignores the rest (a stop reaches the worker once however often it is
sent, and the wrapper keeps waiting while the worker drains), runs it in a
process group of its own (a signal to the wrapper's group, as a service manager
or ``kill -- -PGID`` sends, does not reach the worker beside the forwarded one),
and records how the worker exited in ``DIR/ID.exit`` (a signal ``n`` as
``128 + n``, as a shell says it). ``DIR/ID.pids`` names the wrapper and the
worker, written before the worker can do anything, so the backend can find both
even if the scaler that created the machine died a moment later.

Standard library and the stop rules (``worker/config/stopping.py``) only: it
starts before the worker and must start fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from worker.config.stopping import Phase, Role, StopAction, handled_signals, stop_action

FORWARDED = handled_signals(Role.MACHINE, Phase.SERVING)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` whole (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(
            "usage: python -m worker.scaler.machine STATE_DIR MACHINE_ID -- ARGV...",
            file=sys.stderr,
        )
        return 2
    state_dir, machine_id, command = Path(argv[0]), argv[1], argv[3:]
    pids = state_dir / f"{machine_id}.pids"
    received: list[int] = []
    forwarded = False  # whether the worker has had its one stop signal
    worker: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        # Only the first: a worker's second stop signal means "exit now".
        nonlocal forwarded
        received.append(signum)
        todo = stop_action(Role.MACHINE, Phase.DRAINING if forwarded else Phase.SERVING, signum)
        if todo is StopAction.DRAIN and worker is not None and worker.poll() is None:
            forwarded = True
            worker.send_signal(signum)

    # Installed before the worker starts: a stop that arrives while it starts is
    # kept and forwarded as soon as the worker exists.
    for signum in FORWARDED:
        signal.signal(signum, forward)
    _write(pids, json.dumps({"wrapper": os.getpid(), "worker": None}))
    with open(state_dir / f"{machine_id}.log", "ab") as log:
        try:
            worker = subprocess.Popen(  # noqa: S603 (the machine's own command)
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, process_group=0
            )
        except OSError as exc:
            log.write(f"could not start the worker: {exc}\n".encode())
            _write(state_dir / f"{machine_id}.exit", "127")
            return 127
    _write(pids, json.dumps({"wrapper": os.getpid(), "worker": worker.pid}))
    # Held back while deciding, so a signal landing between the test and the send
    # is not forwarded a second time by the handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    if received and not forwarded:  # a stop that came while the worker started
        forwarded = True
        worker.send_signal(received[0])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    code = worker.wait()  # a forwarded signal does not end the wait (PEP 475)
    code = 128 - code if code < 0 else code
    _write(state_dir / f"{machine_id}.exit", str(code))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
