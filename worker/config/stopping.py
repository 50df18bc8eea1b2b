"""How lane-worker's processes stop: the stop rules, one table, and the stop's bounds.

``STOP_RULES`` says, for each role (a worker daemon, one of a
``LANE_WORKER_PROCESSES`` parent's processes, ``dev``, that parent, the scaler,
a process-backend machine's wrapper), in each phase of its life and for each
signal, what it does (``StopAction``). The daemon, the parent, the scaler and
the wrapper look their signals up here; docs/DESIGN.md "Stop rules" shows the
same table. A signal a role does not handle in a phase keeps its default action
(``DEFAULT``): Python's ``KeyboardInterrupt`` for SIGINT, the end of the process
for the others.

The bounds: how long a worker takes at most to stop on SIGTERM, its drain window
plus fixed bounds. Configuration, not the daemon's internals: the daemon waits
each bound, and the scaler (its destroy deadline, Fly's stop timeout) and the
deploy files read the sum from here, with the drain window they configure.
"""

from __future__ import annotations

import enum
import signal

# How long the claim loops get to stop claiming.
POLLER_STOP_GRACE_S = 5.0
# How long unfinished runs get to hand themselves back after the drain window.
HAND_BACK_TIMEOUT_S = 10.0
# How long the worker's stop mark gets to be written.
STOP_MARK_TIMEOUT_S = 5.0

# What a LANE_WORKER_PROCESSES parent sends for an operator's second stop: the exit
# without a drain (a lone daemon takes it too).
EXIT_NOW = signal.SIGUSR1
# What a process of that parent gets when the parent dies (PR_SET_PDEATHSIG).
PARENT_GONE = signal.SIGHUP


def longest_stop_s(drain_s: float) -> float:
    """Return the longest a SIGTERM can take to end the process, with drain window ``drain_s``.

    Claim loops stop, runs drain, unfinished ones hand themselves back, the stop is
    recorded: an orchestrator's kill timeout must exceed this, or runs are cut off
    and resume only after their lease expires.
    """
    return POLLER_STOP_GRACE_S + drain_s + HAND_BACK_TIMEOUT_S + STOP_MARK_TIMEOUT_S


class Role(enum.Enum):
    """Who receives the signal."""

    WORKER = "worker"  # `lane-worker run`: one daemon
    SUPERVISED = "supervised"  # one daemon of a LANE_WORKER_PROCESSES parent
    DEV = "dev"  # `lane-worker dev`: the daemon in dev's process, then dev stops PostgreSQL
    PROCESSES = "processes"  # the LANE_WORKER_PROCESSES parent (worker/daemon/processes.py)
    SCALER = "scaler"  # `lane-worker scaler` (also in `dev --roll`)
    MACHINE = "machine"  # the process backend's machine wrapper (worker/scaler/machine.py)


class Phase(enum.Enum):
    """Where the role is in its life when the signal arrives."""

    BOOTING = "booting"  # before its handlers are installed (a daemon: until it serves)
    SERVING = "serving"  # handlers installed, no stop yet (the parent: none asked)
    DRAINING = "draining"  # a stop under way: a daemon's loops stop, runs finish
    HANDING_BACK = "handing back"  # a daemon's drain window is over: runs hand themselves back
    RECORDING_STOP = "recording the stop"  # a daemon's leftovers and stop mark, receiver gone
    EXITING = "exiting"  # the parent after a second stop: its processes were told to exit now


class StopAction(enum.Enum):
    """What the role does with the signal."""

    DEFAULT = "default"  # not handled: the signal's default action
    # The orderly stop: a daemon drains; the parent has each process drain (one SIGTERM
    # each); the scaler ends its pass and lets go of its lock; a machine's wrapper
    # forwards the signal to its worker.
    DRAIN = "drain"
    # A daemon exits 1 at once, no hand-back, no stop mark (`worker.exit_now`); the
    # parent sends EXIT_NOW to each process.
    EXIT_NOW = "exit now"
    IGNORE = "ignore"  # nothing more: the stop under way goes on


SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT)

_Row = tuple[Role, Phase, StopAction, StopAction, StopAction, StopAction, StopAction]
# The table's shorthand, for its rows only (deleted after them).
_ = StopAction.DEFAULT
D, X, I = StopAction.DRAIN, StopAction.EXIT_NOW, StopAction.IGNORE  # noqa: E741
W, S, V = Role.WORKER, Role.SUPERVISED, Role.DEV
P, C, M = Role.PROCESSES, Role.SCALER, Role.MACHINE
BOOT, SERVE, DRAIN = Phase.BOOTING, Phase.SERVING, Phase.DRAINING
BACK, MARK, EXIT = Phase.HANDING_BACK, Phase.RECORDING_STOP, Phase.EXITING

# A second SIGTERM or SIGINT is an operator asking to exit now; a hang-up (a terminal,
# the parent's death) never asks for more than a drain. A supervised daemon ignores
# every stop after its first (the parent and systemd's control-group kill may both
# send one) and exits now only on the parent's EXIT_NOW.
# fmt: off
_ROWS: tuple[_Row, ...] = (
    # role phase   SIGTERM SIGINT SIGHUP SIGUSR1 SIGQUIT
    (W,    BOOT,   _,      _,     _,     _,      _),
    (W,    SERVE,  D,      D,     D,     X,      _),
    (W,    DRAIN,  X,      X,     I,     X,      _),
    (W,    BACK,   X,      X,     I,     X,      _),
    (W,    MARK,   X,      X,     I,     X,      _),
    (S,    BOOT,   _,      _,     _,     _,      _),
    (S,    SERVE,  D,      D,     D,     X,      _),
    (S,    DRAIN,  I,      I,     I,     X,      _),
    (S,    BACK,   I,      I,     I,     X,      _),
    (S,    MARK,   I,      I,     I,     X,      _),
    (V,    BOOT,   _,      _,     _,     _,      _),
    (V,    SERVE,  D,      D,     D,     X,      _),
    (V,    DRAIN,  X,      X,     I,     X,      _),
    (V,    BACK,   X,      X,     I,     X,      _),
    (V,    MARK,   X,      X,     I,     X,      _),
    # The parent's phase counts the operator's stops: a hang-up, or a process that
    # ended by itself, drains the processes but leaves it serving (``asks_again``).
    (P,    BOOT,   _,      _,     _,     _,      _),
    (P,    SERVE,  D,      D,     D,     _,      _),
    (P,    DRAIN,  X,      X,     D,     _,      _),
    (P,    EXIT,   X,      X,     X,     _,      _),
    (C,    BOOT,   _,      _,     _,     _,      _),
    (C,    SERVE,  D,      D,     _,     _,      _),
    (C,    DRAIN,  _,      _,     _,     _,      _),
    (M,    BOOT,   _,      _,     _,     _,      _),
    (M,    SERVE,  D,      D,     D,     _,      _),
    (M,    DRAIN,  I,      I,     I,     _,      _),
)
# fmt: on
del _, D, X, I, W, S, V, P, C, M, BOOT, SERVE, DRAIN, BACK, MARK, EXIT

STOP_RULES: dict[tuple[Role, Phase, signal.Signals], StopAction] = {
    (role, phase, signum): act
    for role, phase, *acts in _ROWS
    for signum, act in zip(SIGNALS, acts, strict=True)
}


def stop_action(role: Role, phase: Phase, signum: int) -> StopAction:
    """Return what ``role`` does with signal ``signum`` in ``phase``."""
    return STOP_RULES[role, phase, signal.Signals(signum)]


def handled_signals(role: Role, phase: Phase) -> tuple[signal.Signals, ...]:
    """Return the signals ``role`` handles in ``phase`` (every one not left to its default)."""
    return tuple(s for s in SIGNALS if STOP_RULES[role, phase, s] is not StopAction.DEFAULT)


def phases(role: Role) -> tuple[Phase, ...]:
    """Return the phases ``role`` has, in the order it goes through them."""
    return tuple(dict.fromkeys(phase for r, phase, *_ in _ROWS if r is role))


def asks_again(signum: int) -> bool:
    """Tell whether ``signum`` moves the parent's phase on (an operator's stop, not a hang-up)."""
    return signum in (signal.SIGTERM, signal.SIGINT)


def parent_phase(asked: int) -> Phase:
    """The LANE_WORKER_PROCESSES parent's phase after ``asked`` stops from the operator."""
    return (Phase.SERVING, Phase.DRAINING, Phase.EXITING)[min(asked, 2)]
