"""Sync step bodies on reusable daemon threads: a step that blocks never holds the process."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any


class _DaemonThreads:
    """Reusable daemon threads for sync step bodies: one more starts when none is idle.

    Daemon threads, unlike anyio's or concurrent.futures' workers (joined at
    interpreter exit), cannot hold the process past its stop bound when a step
    is still blocking. Reused, because a thread started per step cost about a
    third of the backlog drain rate. A thread idle for a minute exits.
    """

    IDLE_EXIT_S = 60.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on an idle thread, or on a new one."""
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # that idle thread is now promised this job
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._serve, name="lane-worker-step", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody was promised this thread: leave
                        self._idle -= 1
                        return
                continue  # a job was promised to an idle thread: it is on its way
            job()
            with self._lock:
                self._idle += 1


_step_threads = _DaemonThreads()


async def run_in_daemon_thread(
    fn: Callable[[], Any], *, on_return: Callable[[], None] | None = None
) -> Any:
    """Run sync ``fn`` on a daemon thread and return its result.

    Abandoned on cancel: a drain hands the run back without waiting for the
    thread (its step never committed, so it runs again elsewhere). ``on_return``
    is called on the event loop once ``fn`` returned or raised, even when
    nobody awaits it any more.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Callable[[], None]) -> None:
        if on_return is not None:
            on_return()
        if not done.done():  # cancelled meanwhile: nobody waits for it
            outcome()

    def work() -> None:
        try:
            result = context.run(fn)
        except BaseException as exc:  # handed to the awaiting coroutine, whatever it is
            # A future refuses StopIteration (it would end a generator silently).
            failure = (
                RuntimeError(f"step raised {exc!r}") if isinstance(exc, StopIteration) else exc
            )
            report = lambda: settle(lambda: done.set_exception(failure))  # noqa: E731
        else:
            report = lambda: settle(lambda: done.set_result(result))  # noqa: E731
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is ending
            loop.call_soon_threadsafe(report)

    _step_threads.submit(work)
    return await done
