"""``LANE_WORKER_PROCESSES``: N worker processes of one release on one machine, one supervisor.

One daemon is one asyncio loop on one core. A machine with more cores runs N
whole daemons side by side, each with its own pool, LISTEN connection, loops,
worker id and heartbeat, so nothing about lanes, claims or draining changes:
the store sees N workers of the release on one machine.

The supervisor only starts them, forwards each stop signal to every one of
them (the first drains, a second exits at once, as for one daemon; a process
is sent one stop, never a second one the operator did not ask for) and exits
once all have ended: 0 when each exited 0, else the first failure's code, 78
when one refused its configuration. A process that ends by itself while the
others run (a crash, a refused boot) stops the others with SIGTERM, a normal
drain, and the supervisor exits with its code: the orchestrator then restarts
the machine whole, instead of it serving short of a process unnoticed.

The first process serves the health port as configured; the others serve
theirs on a free port each (the orchestrator probes the first; the supervisor
itself watches every process).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from worker.config.env import HEALTH_PORT_ENV, PROCESSES_ENV, SUPERVISOR_PID_ENV, whole_number
from worker.config.stopping import (
    EXIT_NOW,
    PARENT_GONE,
    Phase,
    Role,
    StopAction,
    asks_again,
    handled_signals,
    parent_phase,
    stop_action,
)
from worker.config.tuning import MAX_PROCESSES
from worker.errors import EXIT_CONFIG

# The parent's stop signals (the stop rules' `processes` rows): a supervised process
# ignores every stop after its first, so a stop sent to the parent and to it directly
# (systemd's control-group kill, pkill) is still one drain.
FORWARDED = handled_signals(Role.PROCESSES, Phase.SERVING)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def wanted_processes(env: Mapping[str, str]) -> int:
    """Return how many processes ``env`` asks for; 1 for a value the daemon will refuse.

    The daemon itself validates the variable (exit 78 naming it), so an
    unreadable value runs one daemon here, which then refuses it.
    """
    n = whole_number(env.get(PROCESSES_ENV, "").strip())
    return n if n is not None and 1 <= n <= MAX_PROCESSES else 1


def child_env(env: Mapping[str, str], index: int) -> dict[str, str]:
    """The environment of process ``index``: one process each, the health port for the first."""
    out = dict(env)
    out[PROCESSES_ENV] = "1"
    out[SUPERVISOR_PID_ENV] = str(os.getpid())
    if index > 0:
        out[HEALTH_PORT_ENV] = "0"  # a free port: only the first is the machine's
    return out


def supervise(argv: Sequence[str], env: Mapping[str, str], n: int) -> int:
    """Run ``n`` processes of ``argv`` until all have ended; return the machine's exit code."""
    children: list[subprocess.Popen[bytes]] = []
    told: set[int] = set()  # pids already sent a stop: another would make them exit at once
    asked = 0  # stop signals the supervisor itself received
    stopping = False
    first_alone: int | None = None  # the code of the first process that ended by itself

    def stop(child: subprocess.Popen[bytes], todo: StopAction) -> None:
        # The drain, once per process; the exit now, as often as it is asked.
        if todo is StopAction.EXIT_NOW:
            _tell(child, EXIT_NOW)
        elif todo is StopAction.DRAIN and child.pid not in told:
            told.add(child.pid)
            _tell(child, signal.SIGTERM)

    def standing() -> StopAction:
        # What a process the stop has not reached yet gets: the phase's own order.
        return StopAction.EXIT_NOW if parent_phase(asked) is Phase.EXITING else StopAction.DRAIN

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping, asked
        todo = stop_action(Role.PROCESSES, parent_phase(asked), signum)
        stopping = True
        if asks_again(signum):  # a hang-up never asks for more than a drain
            asked += 1
        for child in children:
            stop(child, todo)

    def stop_unforwarded(some: list[subprocess.Popen[bytes]]) -> None:
        # Held back meanwhile: a forward() between the test and the send would
        # send the same process a second stop.
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        try:
            for child in some:
                stop(child, standing())
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        for index in range(n):
            if stopping:
                break
            child = subprocess.Popen(  # noqa: S603 (this interpreter, this package)
                list(argv),
                env=child_env(env, index),
                # Its own process group: a terminal's Ctrl-C reaches it once,
                # forwarded, not twice (a second signal exits without draining).
                process_group=0,
                preexec_fn=functools.partial(_stop_with_parent, os.getpid()),  # no thread here
            )
            children.append(child)
            if stopping:
                # The stop came while it was being started, before the list had it.
                stop_unforwarded([child])
        while True:
            codes = [c.poll() for c in children]  # every one polled: any() would stop early
            if all(code is not None for code in codes):
                break
            ended = [code for code in codes if code is not None]
            if ended and not stopping:
                # One ended by itself: drain the others, so the machine restarts whole.
                stopping = True
                first_alone = ended[0]
                stop_unforwarded(children)
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    # A process the drain's SIGTERM reached before its daemon handled signals
    # ended by it: it had claimed nothing, so it stopped cleanly.
    exits = [
        0 if c.pid in told and c.returncode == -signal.SIGTERM else c.returncode for c in children
    ]
    if EXIT_CONFIG in exits:
        return EXIT_CONFIG
    if first_alone is not None:
        return _exit_code(first_alone) or 1  # ending by itself is a failure
    return next((_exit_code(c) for c in exits if c != 0), 0)


def _tell(child: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to ``child`` if it runs, and continue it should it be stopped.

    A stopped process (SIGSTOP, a debugger's detach gone wrong) holds a signal
    pending until continued: without the SIGCONT the supervisor, and with it the
    machine's stop, waited on it for good.
    """
    if child.poll() is None:
        child.send_signal(signum)
        child.send_signal(signal.SIGCONT)


def _stop_with_parent(supervisor: int) -> None:
    # Linux: PARENT_GONE (a drain, never an exit without one, even mid-drain) to
    # this process when the supervisor dies, even by SIGKILL, so no worker
    # outlives its machine's supervisor unnoticed. A supervisor that died before
    # this call sends nothing: the process must not start at all.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, PARENT_GONE)
    if os.getppid() != supervisor:
        os._exit(1)


def _exit_code(code: int) -> int:
    # A process killed by a signal reports -n: exit as a shell would, 128 + n.
    return 128 - code if code < 0 else code


def run_processes(app: str, env: Mapping[str, str]) -> int:
    """Supervise ``LANE_WORKER_PROCESSES`` daemons running ``app``."""
    argv = [sys.executable, "-m", "worker", "run", "--app", app]
    return supervise(argv, env, wanted_processes(env))
