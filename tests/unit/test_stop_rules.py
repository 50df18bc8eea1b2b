"""The stop rules, cell by cell: role x phase x signal -> action, and the daemon following them.

``EXPECTED`` is the table written out again by hand (docs/DESIGN.md "Stop rules"
shows it too): every cell of ``STOP_RULES`` must be there with that action, and no
other. The daemon's receiver (``worker/daemon/signals.py``) is then driven with
real signals, one cell at a time, in each phase it serves in.
"""

from __future__ import annotations

import os
import signal
from typing import Any, NoReturn

import anyio
import pytest
import structlog

from worker.config.stopping import (
    EXIT_NOW,
    PARENT_GONE,
    SIGNALS,
    STOP_RULES,
    Phase,
    Role,
    StopAction,
    asks_again,
    handled_signals,
    parent_phase,
    phases,
    stop_action,
)
from worker.daemon.signals import StopSignals

# One letter per signal, in this order: D drain, X exit now, I ignore, - default.
ORDER = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT)
LETTER = {"D": StopAction.DRAIN, "X": StopAction.EXIT_NOW, "I": StopAction.IGNORE,
          "-": StopAction.DEFAULT}  # fmt: skip
DAEMON = {
    Phase.BOOTING: "-----",
    Phase.SERVING: "DDDX-",
    Phase.DRAINING: "XXIX-",
    Phase.HANDING_BACK: "XXIX-",
    Phase.RECORDING_STOP: "XXIX-",
}
EXPECTED: dict[Role, dict[Phase, str]] = {
    Role.WORKER: DAEMON,
    Role.DEV: DAEMON,
    # Only the parent's EXIT_NOW ends a supervised daemon's drain: the parent and a
    # control-group kill may both send a stop.
    Role.SUPERVISED: {
        Phase.BOOTING: "-----",
        Phase.SERVING: "DDDX-",
        Phase.DRAINING: "IIIX-",
        Phase.HANDING_BACK: "IIIX-",
        Phase.RECORDING_STOP: "IIIX-",
    },
    Role.PROCESSES: {
        Phase.BOOTING: "-----",
        Phase.SERVING: "DDD--",
        Phase.DRAINING: "XXD--",
        Phase.EXITING: "XXX--",
    },
    Role.SCALER: {Phase.BOOTING: "-----", Phase.SERVING: "DD---", Phase.DRAINING: "-----"},
    Role.MACHINE: {Phase.BOOTING: "-----", Phase.SERVING: "DDD--", Phase.DRAINING: "III--"},
}
CELLS = [
    (role, phase, signum, LETTER[letters[i]])
    for role, rows in EXPECTED.items()
    for phase, letters in rows.items()
    for i, signum in enumerate(ORDER)
]


def test_the_table_has_every_cell_and_no_other() -> None:
    """Every role has each of its phases for each signal, and nothing else is in the table."""
    assert SIGNALS == ORDER
    assert set(EXPECTED) == set(Role)
    assert set(STOP_RULES) == {(role, phase, signum) for role, phase, signum, _ in CELLS}
    for role, rows in EXPECTED.items():
        assert phases(role) == tuple(rows), role


@pytest.mark.parametrize(
    ("role", "phase", "signum", "expected"),
    CELLS,
    ids=[f"{r.value}-{p.value}-{s.name}" for r, p, s, _ in CELLS],
)
def test_each_cell(role: Role, phase: Phase, signum: signal.Signals, expected: StopAction) -> None:
    """One cell: what ``role`` does with ``signum`` in ``phase``."""
    assert stop_action(role, phase, signum) is expected
    assert (signum in handled_signals(role, phase)) is (expected is not StopAction.DEFAULT)


def test_the_signals_named_in_the_rules() -> None:
    """EXIT_NOW and the parent's death are the signals the rows above treat as such."""
    assert EXIT_NOW == signal.SIGUSR1
    assert PARENT_GONE == signal.SIGHUP


def test_the_parents_phase_counts_the_operators_stops_not_hang_ups() -> None:
    """SIGTERM and SIGINT move the parent on; a hang-up drains but never asks twice."""
    assert [parent_phase(n) for n in range(4)] == [
        Phase.SERVING, Phase.DRAINING, Phase.EXITING, Phase.EXITING,
    ]  # fmt: skip
    assert [asks_again(s) for s in ORDER] == [True, True, False, False, False]


def test_nothing_is_handled_while_booting() -> None:
    """A daemon that has not started its receiver leaves every signal to its default."""
    for role in (Role.WORKER, Role.SUPERVISED, Role.DEV):
        signals = StopSignals(role, anyio.Event(), structlog.get_logger("test"))
        assert signals.phase is Phase.BOOTING
        assert handled_signals(role, Phase.BOOTING) == ()


class Exited(Exception):
    """What the receiver under test raises where the daemon would ``os._exit(1)``."""


class Said:
    """A log that keeps what the receiver says and tells a waiter that it said something."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.acted = anyio.Event()

    def _say(self, event: str, **fields: Any) -> None:
        self.lines.append({"event": event, **fields})
        self.acted.set()

    info = warning = _say


def receiver(role: Role) -> tuple[StopSignals, Said]:
    said = Said()
    signals = StopSignals(role, anyio.Event(), said)  # type: ignore[arg-type]

    def exit_now(name: str) -> NoReturn:
        said.warning("worker.exit_now", signal=name)
        raise Exited(name)

    signals._exit_now = exit_now  # type: ignore[method-assign]
    return signals, said


LIVE = [
    (role, phase, signum, expected)
    for role, phase, signum, expected in CELLS
    if role in (Role.WORKER, Role.SUPERVISED, Role.DEV)
    and phase in (Phase.SERVING, Phase.DRAINING, Phase.HANDING_BACK)
    and expected is not StopAction.DEFAULT  # a default action would end the test process
]
OUTCOME = {
    ("worker.signal", False): StopAction.DRAIN,
    ("worker.signal", True): StopAction.IGNORE,
    ("worker.exit_now", False): StopAction.EXIT_NOW,
}


@pytest.mark.parametrize(
    ("role", "phase", "signum", "expected"),
    LIVE,
    ids=[f"{r.value}-{p.value}-{s.name}" for r, p, s, _ in LIVE],
)
async def test_the_daemons_receiver_does_what_its_cell_says(
    role: Role, phase: Phase, signum: signal.Signals, expected: StopAction
) -> None:
    """A real signal to a serving daemon's receiver, in each phase it receives in."""
    signals, said = receiver(role)
    exited: list[str] = []

    async def receive(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await signals.receive(task_status=task_status)
        except Exited as exc:
            exited.append(str(exc))

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(receive)
            if phase is not Phase.SERVING:
                signals.stop_requested.set()
            if phase is Phase.HANDING_BACK:
                signals.handing_back()
            assert signals.phase is phase
            os.kill(os.getpid(), signum)
            with anyio.fail_after(10):
                await said.acted.wait()
            tg.cancel_scope.cancel()
    finally:
        signals.restore()
    [line] = said.lines
    assert line["signal"] == signum.name
    assert OUTCOME[line["event"], line.get("already_stopping", False)] is expected
    assert exited == ([signum.name] if expected is StopAction.EXIT_NOW else [])
    # A drain sets the daemon's stop; nothing else starts one.
    assert signals.stop_requested.is_set() is (
        phase is not Phase.SERVING or expected is StopAction.DRAIN
    )


@pytest.mark.parametrize("role", [Role.WORKER, Role.SUPERVISED, Role.DEV])
async def test_the_stops_last_part_installs_its_cells_and_restore_undoes_them(role: Role) -> None:
    """Once the receiver is gone: IGNORE is SIG_IGN, EXIT_NOW exits, DEFAULT is left alone."""
    # asyncio's runner has a SIGINT handler of its own, which the end of any signal
    # receiver replaces with Python's: start from there, as the daemon's stop does.
    with anyio.open_signal_receiver(signal.SIGINT):
        pass
    before = {s: signal.getsignal(s) for s in ORDER}
    signals, _ = receiver(role)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(signals.receive)
            signals.stop_requested.set()
            signals.handing_back()
            tg.cancel_scope.cancel()
        assert signals.phase is Phase.RECORDING_STOP
        for signum in ORDER:
            expected = stop_action(role, Phase.RECORDING_STOP, signum)
            installed = signal.getsignal(signum)
            if expected is StopAction.IGNORE:
                assert installed == signal.SIG_IGN, signum
            elif expected is StopAction.EXIT_NOW:
                assert installed == signals._exit_now_handler, signum
                with pytest.raises(Exited):
                    signals._exit_now_handler(signum, None)
            else:
                assert installed == before[signum], signum
    finally:
        signals.restore()
    assert {s: signal.getsignal(s) for s in ORDER} == before
