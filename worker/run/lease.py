"""A play under its lease: extended while it runs, and a lost lease stops it.

The attempt ends only once every sync step body it started has returned: a
thread cannot be stopped, and an attempt recorded as ended while its step
still executes would let a retry or a newer claim run that step beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

import asyncpg

from worker.db import engine
from worker.db.pool import Database
from worker.errors import LeaseLostError
from worker.metrics import Metrics
from worker.run.attempt import Attempt
from worker.run.context import TaskContext
from worker.run.handback import really_cancelled

T = TypeVar("T")


class _PlayExit(Exception):
    """Carries a play's SystemExit or KeyboardInterrupt out of its task.

    asyncio re-raises those two from a task into the event loop, which would
    stop the daemon; carried, they fail the attempt like any other error.
    """

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


async def _contain_exits(work: Awaitable[T]) -> T:
    try:
        return await work
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _PlayExit(exc) from None


# How soon a lease extension that found its run's row locked is tried again, at most.
BLOCKED_RETRY_S = 2.0


class _Keeper:
    """Extends one attempt's lease every third of it; on a lost lease, cancels the play's host."""

    def __init__(
        self, db: Database, metrics: Metrics | None, attempt: Attempt, ctx: TaskContext
    ) -> None:
        host = asyncio.current_task()
        assert host is not None
        self.host = host
        self.db, self.metrics, self.attempt, self.ctx = db, metrics, attempt, ctx
        self.lost: LeaseLostError | None = None
        self.cancelled_host = False
        self.task: asyncio.Task[None] | None = None

    def first_pause_s(self) -> float:
        """Return how long after the play starts the first extension is due."""
        return max(1.0, self.attempt.handle.lease_s / 3)

    def start(self) -> None:
        """Start extending: ``with_lease`` calls this once the first extension is due."""
        self.task = asyncio.get_running_loop().create_task(self.keep())

    async def keep(self) -> None:
        h, bound = self.attempt.handle, self.attempt.log
        blocked = 0  # extensions in a row that found the row locked
        while True:
            pause_s = max(1.0, h.lease_s / 3)
            try:
                await self.db.run(
                    lambda c: engine.extend_claim(c, h.queue, h.engine_run_id, h.lease_s)
                )
                blocked = 0
                if self.metrics is not None:
                    self.metrics.lease_extensions.inc()
            except LeaseLostError as exc:
                self.lost = exc
                if self.ctx.sync_steps_running():
                    # Its next checkpoint fails on the lost lease by itself.
                    bound.warning("run.step_still_running", detail=str(exc))
                    await self.ctx.sync_steps_returned()
                self.cancelled_host = True
                self.host.cancel()
                return
            except asyncpg.LockNotAvailableError:
                # Its row is locked (an operator's open transaction): try again
                # soon, without holding a connection for the lock meanwhile.
                # Each try holds a connection for the lock wait (100 ms): several
                # blocked runs must not keep the pool's other connection busy. A
                # short lease is tried more often: two tries 2 s apart outlasted a
                # 5 s lease whose row another worker's statement held a moment.
                pause_s = min(BLOCKED_RETRY_S, h.lease_s / 10)
                if blocked % 15 == 0:  # the first time, then every 15 tries
                    bound.warning(
                        "lease.extend_blocked",
                        detail=f"the run's row is locked by another session; retrying every "
                        f"{pause_s:g} s",
                        tries=blocked + 1,
                    )
                blocked += 1
            except Exception as exc:  # the database is away: keep trying while the lease lasts
                bound.warning("lease.extend_failed", error=repr(exc))
            await asyncio.sleep(pause_s)

    def take_back_cancel(self) -> bool:
        """Undo the keeper's cancel of the host, if it made one; say whether it did."""
        if not self.cancelled_host:
            return False
        self.host.uncancel()
        self.cancelled_host = False
        return True


async def with_lease(
    db: Database, metrics: Metrics | None, attempt: Attempt, ctx: TaskContext, work: Awaitable[T]
) -> T:
    """Run ``work`` while extending the lease; cancel it if the lease is lost.

    The attempt ends only once every sync step body it started has
    returned: a thread cannot be stopped, and an attempt recorded as ended
    while its step still executes would let a retry or a newer claim run
    that step beside it. A drain does not wait (the process exits).
    """
    keeper = _Keeper(db, metrics, attempt, ctx)
    # The keeper's task starts when the first extension is due: most runs end
    # before, and a timer costs a fraction of a task started and cancelled per run.
    due = asyncio.get_running_loop().call_later(keeper.first_pause_s(), keeper.start)
    # The play runs in a task of its own: what it does to its task's cancel
    # count (Python 3.11's TaskGroup leaves one behind when a child fails
    # while the group exits) must not make this run look like a drain. A
    # cancel of this task (a drain, a lost lease) reaches the play's task.
    runner = asyncio.ensure_future(_contain_exits(work))
    try:
        try:
            return await runner
        except _PlayExit as carried:
            raise carried.exc from None
        finally:
            if not really_cancelled() and ctx.sync_steps_running():
                # The play ended (a task group gave up a step's await) while
                # a step body still runs: the lease stays held until it returns.
                attempt.log.warning("run.step_still_running")
                await ctx.sync_steps_returned()
    except asyncio.CancelledError:
        if keeper.take_back_cancel():
            assert keeper.lost is not None
            raise keeper.lost from None
        raise
    finally:
        due.cancel()
        if keeper.task is not None:
            keeper.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper.task
        # The keeper cancelled the host just as the work returned: take that
        # cancel back, or the run would later look like a drain.
        keeper.take_back_cancel()
