"""One daemon's stop signals: the receiver while it serves, plain handlers for the stop's end.

What a signal does is not decided here: ``worker.config.stopping.STOP_RULES``
says it for the daemon's role (a worker, one of a ``LANE_WORKER_PROCESSES``
parent's processes, ``dev``) and phase. This module tracks the phase and does
the action: a drain sets the daemon's stop event, an exit now leaves with 1 and
no hand-back (``worker.exit_now``), an ignored signal is logged
(``already_stopping``). Before the receiver starts, signals keep their default
actions (booting); after it is gone (the stop's last part: leftover hand-backs
and the stop mark) the table's last phase holds through plain handlers, not the
default actions (a death without the hand-backs, or click's "Aborted!"), until
``restore`` puts back the handlers from before (``dev`` then stops PostgreSQL).
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any, NoReturn

import anyio
import structlog
from anyio.abc import TaskStatus

from worker.config.stopping import Phase, Role, StopAction, handled_signals, stop_action
from worker.errors import EXIT_FAILURE


class StopSignals:
    """Follows the stop rules for one daemon of ``role``; ``stop_requested`` is its drain."""

    def __init__(
        self, role: Role, stop_requested: anyio.Event, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        self.role = role
        self.stop_requested = stop_requested
        self.log = log
        self._phase = Phase.BOOTING
        # The handlers the stop's last part replaced, until ``restore``.
        self._before_late: dict[int, Any] = {}

    @property
    def phase(self) -> Phase:
        """Where the daemon is: a requested stop (a signal, a crash, dev) is its drain."""
        if self._phase is Phase.SERVING and self.stop_requested.is_set():
            return Phase.DRAINING
        return self._phase

    def handing_back(self) -> None:
        """The drain window is over: the runs still in flight hand themselves back."""
        self._phase = Phase.HANDING_BACK

    async def receive(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Act on each stop signal until cancelled; then install the stop's last handlers."""
        try:
            with anyio.open_signal_receiver(*handled_signals(self.role, Phase.SERVING)) as received:
                self._phase = Phase.SERVING
                task_status.started()
                async for signum in received:
                    name = signal.Signals(signum).name
                    todo = stop_action(self.role, self.phase, signum)
                    if todo is StopAction.EXIT_NOW:
                        self._exit_now(name)
                    if todo is StopAction.IGNORE:
                        self.log.info("worker.signal", signal=name, already_stopping=True)
                        continue
                    self.log.info("worker.signal", signal=name)
                    self.stop_requested.set()
        finally:
            self._phase = Phase.RECORDING_STOP
            late = {
                signum: self._handler(stop_action(self.role, self._phase, signum))
                for signum in handled_signals(self.role, self._phase)
            }
            self._before_late = {signum: signal.signal(signum, h) for signum, h in late.items()}

    def restore(self) -> None:
        """Once the stop is over, the handlers from before it."""
        for signum, handler in self._before_late.items():
            signal.signal(signum, handler)
        self._before_late = {}

    def _handler(self, todo: StopAction) -> Any:
        if todo is StopAction.IGNORE:
            return signal.SIG_IGN
        if todo is StopAction.EXIT_NOW:
            return self._exit_now_handler
        raise ValueError(f"no plain handler does {todo}")  # the table asks none: a drain is over

    def _exit_now(self, signal_name: str) -> NoReturn:
        """The exit without a drain (a second stop, or the parent's EXIT_NOW)."""
        self.log.warning("worker.exit_now", signal=signal_name)
        os._exit(EXIT_FAILURE)

    def _exit_now_handler(self, signum: int, _frame: FrameType | None) -> None:
        self._exit_now(signal.Signals(signum).name)
