"""One claim loop: the own queue, or one retired lane's queue as ``:continuations``.

The loop claims only what there is capacity for, hands each run to the
supervisor's run group, and when idle waits for the first of: a NOTIFY on its
queue, the next due sleeper, the poll interval, or stop. A quiet loop (a
``:continuations`` one) has no poll interval of its own: the loop registry's
safety net checks every quiet loop's queue, a batch to a statement, and pokes
or ``hint``s it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import asyncpg
import structlog
from anyio.abc import TaskGroup

from worker import lanes
from worker.db import engine
from worker.errors import LaneMismatchError
from worker.metrics import Counted, Metrics
from worker.run.claim_health import ClaimHealth
from worker.run.execute import Handled
from worker.states import Disposition, Outcome

# Attempt outcomes that end their run for good (lane_worker_runs_total counts those).
TERMINAL_OUTCOMES = frozenset({Outcome.COMPLETED, Outcome.FAILED, Outcome.CANCELLED})

log = structlog.get_logger("lane_worker.poller")

CLAIM_BATCH = 16
# Under a backlog (the last claim came back full), wait up to this long for a
# batch (half the slots, at most a whole claim) to free up before claiming:
# every claim sorts the queue's pending set (about 2 ms of the server's time at
# 3,000 pending, 29 ms at 30,000), so claims of 4 cost three times what claims
# of 16 do, per run. The wait ends sooner once no slot has freed for the gap:
# slots held by long runs must not idle the free ones for the whole patience.
BACKLOG_BATCH = CLAIM_BATCH
BACKLOG_PATIENCE_S = 0.025
BACKLOG_GAP_S = 0.005
_BACKOFF_MAX_S = 15.0


class Capacity:
    """Run slots shared by every loop of the process (``LANE_WORKER_CONCURRENCY``)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._changed = asyncio.Event()

    @property
    def in_use(self) -> int:
        """Return how many slots are taken."""
        return self.total - self.free

    async def reserve(
        self, most: int, *, at_least: int = 1, patience_s: float = 0.0, gap_s: float | None = None
    ) -> int:
        """Wait for a free slot and take up to ``most``; return how many.

        With ``at_least`` > 1, wait up to ``patience_s`` (from the first free slot)
        for that many to be free, so a loop under a backlog claims a batch
        instead of one run per finished run; with ``gap_s``, stop waiting sooner
        once no slot has been freed for that long (the rest are held by longer
        runs, and waiting for them would only idle the free ones).
        """
        want = max(1, min(at_least, most, self.total))
        deadline: float | None = None
        while self.free < want:
            timeout: float | None = None
            if self.free > 0:
                now = time.monotonic()
                deadline = now + patience_s if deadline is None else deadline
                if now >= deadline:
                    break
                timeout = deadline - now if gap_s is None else min(deadline - now, gap_s)
            # No await between clear() and wait(): a release cannot slip in.
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:  # patience ran out, or the frees stopped: take what is free
                if self.free > 0:
                    break
                # Another loop took them meanwhile: wait for a slot again. Returning
                # none would read as "stopped" to the loop, which would end for good.
                deadline = None
        taken = min(self.free, most)
        self.free -= taken
        return taken

    def release(self, count: int = 1) -> None:
        """Give ``count`` slots back (synchronous, so it is safe in a cancelled task)."""
        if count > 0:
            self.free += count
            self._changed.set()

    async def wait_idle(self) -> None:
        """Wait until no slot is taken."""
        while self.free < self.total:
            self._changed.clear()
            await self._changed.wait()


class LoopRuntime(Protocol):
    """What a claim loop needs of the runtime (``worker.run.execute.Runtime``), no more."""

    @property
    def queue(self) -> str:
        """The worker's own queue."""
        ...

    @property
    def release_id(self) -> str:
        """The worker's release."""
        ...

    def worker_id_for(self, queue: str) -> str:
        """Return the engine worker id it claims ``queue`` with."""
        ...

    async def claim(self, queue: str, qty: int) -> engine.ClaimBatch:
        """Claim up to ``qty`` runs of ``queue`` as the claim policy says."""
        ...

    async def next_due_in_s(self, queue: str) -> float | None:
        """Return seconds until the next run it may claim on ``queue`` is due, if any."""
        ...

    async def queue_exists(self, queue: str) -> bool:
        """Tell whether ``queue``'s engine tables exist."""
        ...

    async def handle(
        self, claimed: engine.ClaimedRun, *, on_refuse: Callable[[], None] | None = None
    ) -> Handled:
        """Take one claimed run to its next durable point."""
        ...


@dataclass(frozen=True)
class LoopShared:
    """What every claim loop of one worker shares."""

    capacity: Capacity
    poll_interval_s: float
    metrics: Metrics
    runs: TaskGroup  # where claimed runs are handled
    on_guard_failure: Callable[[str], None]  # the own loop met another lane's run
    # While ``listening`` says LISTEN is connected, an idle loop polls only every
    # ``listen_poll_interval_s`` (at least ``poll_interval_s``): every way a run
    # becomes claimable then sends a NOTIFY (a submit, a signal, the engine-table
    # trigger) or has a due time the loop waits for (a sleep, a retry, a lease).
    listen_poll_interval_s: float = 0.0
    listening: Callable[[], bool] = lambda: False
    # A quiet loop never polls by itself: idle, it waits for a NOTIFY, its known
    # next due time, a poke or ``hint`` from the registry's one safety-net
    # statement for all such loops (``loops.LoopRegistry.sweep``), or stop; and it
    # starts idle, for that statement to say whether anything is due.
    quiet: bool = False
    # The database URL's secrets, kept out of what a failing claim's error says.
    secrets: tuple[str, ...] = ()


class Poller:
    """The claim loop of one queue."""

    def __init__(
        self, runtime: LoopRuntime, queue: str, wakeup: asyncio.Event, shared: LoopShared
    ) -> None:
        self.runtime = runtime
        self.queue = queue
        self.kind = lanes.loop_kind(queue, runtime.queue)
        self.capacity = shared.capacity
        self.wakeup = wakeup
        self.poll_interval_s = shared.poll_interval_s
        self.listen_poll_interval_s = max(shared.listen_poll_interval_s, shared.poll_interval_s)
        self.listening = shared.listening
        self.metrics = shared.metrics
        self._claims = Counted(shared.metrics.claims)
        self._attempts = Counted(shared.metrics.attempts)
        self._runs = Counted(shared.metrics.runs)
        self.runs = shared.runs
        self.on_guard_failure = shared.on_guard_failure
        self.quiet = shared.quiet
        self.stopped = asyncio.Event()
        self.finished = asyncio.Event()
        self.detach_reason: str | None = None
        # Whether its claims keep failing: readiness, the heartbeat row and /metrics read it.
        self.health = ClaimHealth(queue, self.kind, secrets=shared.secrets)
        # While idle: when the wait ends (monotonic; inf: only a wake-up ends it),
        # and an event that makes the wait read that time again (``hint``).
        self.claimed = False  # it has sent a claim (a run may be held from it)
        self.idle = False
        self._wake_at = math.inf
        self._rearm = asyncio.Event()
        self.log = log.bind(
            queue=queue,
            loop=self.kind,
            release_id=runtime.release_id,
            worker_id=runtime.worker_id_for(queue),
        )

    def stop(self, reason: str) -> None:
        """Stop claiming (in-flight runs are not touched)."""
        if not self.stopped.is_set():
            self.detach_reason = reason
            self.stopped.set()

    def hint(self, due_in_s: float) -> None:
        """Have the idle wait end ``due_in_s`` from now at the latest (at once when <= 0)."""
        if due_in_s <= 0:
            self.wakeup.set()
            return
        at = time.monotonic() + due_in_s
        if at < self._wake_at:
            self._wake_at = at
            self._rearm.set()

    async def run(self) -> None:
        """Claim until stopped."""
        failures = 0
        backlog = False
        empty = 0  # claims in a row that found nothing
        try:
            if self.quiet:
                await self._idle(math.inf, due_in=None)
            while not self.stopped.is_set():
                slots = await self._reserve(backlog)
                if slots == 0:
                    break
                # Cleared before the claim, not after: a NOTIFY that lands while
                # the claim runs must still cut the idle wait short.
                self.wakeup.clear()
                self.health.started()
                self.claimed = True
                try:
                    batch = await self.runtime.claim(self.queue, slots)
                except Exception as exc:
                    self.capacity.release(slots)
                    if await self._dropped(exc):
                        # `lanes prune` dropped this retired lane's queue: nothing is
                        # left there to adopt, so the loop detaches (not an error).
                        self.stop("queue dropped")
                        break
                    self.health.failed(exc)
                    failures += 1
                    self.metrics.loop_errors.labels(self.kind).inc()
                    delay = min(_BACKOFF_MAX_S, 0.5 * 2 ** min(failures, 6))
                    self.log.warning("loop.claim_failed", error=repr(exc), retry_in_s=delay)
                    await self._idle(delay, due_in=None)
                    continue
                failures = 0
                self.health.succeeded()
                empty = 0 if batch.runs else empty + 1
                backlog = len(batch.runs) == slots
                self.capacity.release(slots - len(batch.runs))
                for claimed in batch.runs:
                    self.runs.start_soon(self._handle, claimed)
                if len(batch.runs) < slots:
                    listening = self.listening()
                    poll_s = self.listen_poll_interval_s if listening else self.poll_interval_s
                    if self.quiet:
                        poll_s = math.inf  # the registry's safety net polls for it
                    # The claim read the next due time itself, unless it could not tell.
                    due = batch.due_in_s if batch.due_known else await self._next_due_in_s()
                    await self._idle(poll_s, due_in=due, empty_claims=empty)
        finally:
            self.finished.set()

    async def _dropped(self, exc: Exception) -> bool:
        """Tell whether a claim failed because this continuation loop's queue was pruned."""
        if self.kind != "continuation" or not isinstance(exc, asyncpg.UndefinedTableError):
            return False
        try:
            exists = await self.runtime.queue_exists(self.queue)
        except Exception:
            return False  # the database is away: retry the claim as for any failure
        return not exists

    async def _reserve(self, backlog: bool) -> int:
        # Waiting for a slot must not outlive a stop request.
        at_least = min(BACKLOG_BATCH, max(1, self.capacity.total // 2)) if backlog else 1
        reserve = asyncio.ensure_future(
            self.capacity.reserve(
                CLAIM_BATCH, at_least=at_least, patience_s=BACKLOG_PATIENCE_S, gap_s=BACKLOG_GAP_S
            )
        )
        stop = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait({reserve, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if reserve.done():
            slots = reserve.result()
            if self.stopped.is_set():
                self.capacity.release(slots)
                return 0
            return slots
        reserve.cancel()
        try:
            slots = await reserve
        except asyncio.CancelledError:
            return 0
        self.capacity.release(slots)
        return 0

    async def _idle(self, cap_s: float, *, due_in: float | None, empty_claims: int = 0) -> None:
        """Wait for a NOTIFY, the next due run (``due_in`` seconds), ``cap_s``, a hint, or stop."""
        wait_s = cap_s
        if due_in is not None and due_in > 0:
            wait_s = min(wait_s, due_in)
        elif due_in is not None:
            # A run already due that claims keep not returning (another session
            # holds its row lock, say) must not turn into a busy loop. Only then:
            # empty claims pile up in normal work too (a NOTIFY for each run that
            # parks), and a floor on a future due time made sleeps start late.
            wait_s = min(wait_s, 0.005 if empty_claims <= 1 else 0.05 * 2 ** min(empty_claims, 5))
        self._wake_at = time.monotonic() + wait_s
        self.idle = True
        wake = asyncio.ensure_future(self.wakeup.wait())
        stop = asyncio.ensure_future(self.stopped.wait())
        try:
            while not (wake.done() or stop.done()):
                left = self._wake_at - time.monotonic()
                if left <= 0:
                    return
                self._rearm.clear()
                rearm = asyncio.ensure_future(self._rearm.wait())
                try:
                    await asyncio.wait(
                        {wake, stop, rearm},
                        timeout=None if math.isinf(left) else left,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    rearm.cancel()
        finally:
            self.idle = False
            self._wake_at = math.inf
            wake.cancel()
            stop.cancel()

    async def _next_due_in_s(self) -> float | None:
        """Return seconds until the next run on this queue becomes claimable, if any."""
        try:
            due_in = await self.runtime.next_due_in_s(self.queue)
        except Exception as exc:
            self.log.warning("loop.next_due_failed", error=repr(exc))
            return None
        return due_in

    async def _handle(self, claimed: engine.ClaimedRun) -> None:
        started = time.monotonic()
        ended = False  # the run reached a terminal outcome
        self.metrics.in_flight.inc()
        try:
            handled = await self.runtime.handle(claimed, on_refuse=self._refused)
            ended = handled.outcome in TERMINAL_OUTCOMES
        except LaneMismatchError as exc:
            self.metrics.claims.labels(self.kind, Disposition.REFUSE).inc()
            self.stop("lane guard failed")
            self.on_guard_failure(str(exc))
            return
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # A stray CancelledError (not this task's cancellation) must not take
            # the run group, and every other run with it, down.
            self.metrics.loop_errors.labels(self.kind).inc()
            self.log.error(
                "run.handling_failed", run_task_id=str(claimed.task_id), error="CancelledError"
            )
            return
        except Exception as exc:
            # The runtime gave the claim back (or its lease will return it).
            self.metrics.loop_errors.labels(self.kind).inc()
            self.log.error("run.handling_failed", run_task_id=str(claimed.task_id), error=repr(exc))
            return
        finally:
            self.metrics.in_flight.dec()
            self.metrics.run_duration.observe(time.monotonic() - started)
            self.capacity.release(1)
            if not ended and not self.listening():
                # Without LISTEN nothing else tells this loop that the run went
                # back to the queue (a sleep, a retry, a put-back): its due time
                # must cut the idle wait short, not the next poll.
                self.wakeup.set()
        if handled.foreign:
            return  # another system's task, put back for its owner: none of lane-worker's
        self._claims.inc(self.kind, handled.disposition)
        self._attempts.inc(handled.outcome)
        if handled.outcome in TERMINAL_OUTCOMES:
            self._runs.inc(handled.outcome)

    def _refused(self) -> None:
        if self.kind == "continuation":
            self.stop("lane still claims")
