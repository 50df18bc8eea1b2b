"""The loop registry: which claim loops one worker runs, attaching and detaching them.

One own loop on the release's queue, plus one ``:continuations`` loop per queue
the lane registry says this release must watch: queues holding runs it adopted
(whatever their lane's status), and, while its own lane claims, older retired
lanes with open runs. The loop kind is decided here, once, when a loop is
attached, and handed to the ``Poller``; readiness reads its facts from here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping

import anyio
import asyncpg
import structlog
from anyio.abc import TaskGroup

from worker import lanes
from worker.config.dburl import url_secrets
from worker.daemon.listener import Listener, Wakeups
from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store.lanes import LaneQueries
from worker.db.store.rows import RegistryLane
from worker.metrics import Metrics
from worker.run.claim import Capacity, LoopShared, Poller
from worker.run.claim_health import NotClaiming
from worker.run.execute import Runtime
from worker.states import LaneState, LaneStatus


def wanted_continuations(
    registry: Mapping[str, RegistryLane], own_queue: str, release_id: str, lane_state: str
) -> set[str]:
    """Return the queues this worker must run a continuation loop on, from the lane registry.

    ``registry`` maps each lane's queue to its ``lane_registry`` row.
    """
    own = registry.get(own_queue)
    wanted = {q for q, lane in registry.items() if lane.mine_open and q != own_queue}
    if lane_state == LaneState.CLAIMING and own is not None:
        # Only from older lanes (the store's lane_older, which the claim filter
        # asks too): releases roll forward, never back.
        adoptable = [
            r
            for r in registry.values()
            if r.status == LaneStatus.RETIRED and r.has_open and r.older_than_mine
        ]
        wanted |= set(
            lanes.adoption_queues(release_id, [i for r in adoptable for i in r.release_ids])
        ) - {own_queue}
    return wanted


# The safety net's statement reads at most this many queues: each one's run table
# and its indexes (5 relations) stay locked until it commits.
SWEEP_BATCH = 100


async def prepare_queue(conn: Connection, queue: str, store_lanes: LaneQueries) -> None:
    """Create ``queue`` if missing (with its policy and its record) and its NOTIFY trigger.

    In one transaction. A worker connecting as its own role (``lane-worker roles``,
    issue 33) may not create either (DDL in the engine schema): then the store's
    owner makes both, through ``prepare_lane_queue`` (store migration 0042).
    """
    try:
        async with conn.transaction():
            await engine.ensure_queue(conn, queue, record=store_lanes.record_created_queue)
            await engine.watch_queue(conn, queue)
    except asyncpg.InsufficientPrivilegeError:
        await store_lanes.prepare_queue_as_owner(conn, queue)


def _detach_reason(lane: RegistryLane | None) -> str:
    if lane is None:
        return "lane gone"
    return "lane drained" if lane.status == LaneStatus.RETIRED else "lane claims"


class LoopRegistry:
    """The running claim loops of one worker, by queue."""

    def __init__(
        self,
        *,
        own_queue: str,
        capacity: Capacity,
        wakeups: Wakeups,
        poll_interval_s: float,
        listen_poll_interval_s: float,
        metrics: Metrics,
        on_guard_failure: Callable[[str], None],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.log = log
        self.own_queue = own_queue
        self.capacity = capacity
        self.wakeups = wakeups
        self.poll_interval_s = poll_interval_s
        self.listen_poll_interval_s = listen_poll_interval_s
        self.metrics = metrics
        self.on_guard_failure = on_guard_failure
        self.pollers: dict[str, Poller] = {}
        self._attached: list[Poller] = []  # every loop ever attached, detached ones too
        self.listener: Listener | None = None
        self._unswept: set[str] = set()  # quiet loops attached since the last sweep
        self._sweep_now = asyncio.Event()
        self._sweep_after = ""  # the rotation of the listening safety net

    @property
    def polled_queues(self) -> set[str]:
        """Return every queue a loop has claimed from (where a claim may be left over at stop).

        A quiet loop that never claimed holds nothing: checking each of a thousand
        idle lanes at stop took longer than the stop mark's 5 s.
        """
        return {p.queue for p in self._attached if p.claimed}

    def queues(self) -> set[str]:
        """Return the queues whose loops still claim (what LISTEN follows)."""
        return {q for q, p in self.pollers.items() if not p.stopped.is_set()}

    def listening(self) -> bool:
        """Tell whether LISTEN is connected (the loops' long poll holds only then)."""
        return self.listener is not None and self.listener.connected

    def idle_poll(self, polling_s: float) -> Callable[[], float]:
        """A side loop's period: ``polling_s``, or the long one while LISTEN is connected.

        With LISTEN up, its NOTIFY (registry changes, ledger facts) wakes the side
        loop and the period is only a safety net (``LANE_WORKER_LISTEN_POLL_INTERVAL``).
        """
        listen_s = max(polling_s, self.listen_poll_interval_s)
        return lambda: listen_s if self.listening() else polling_s

    def poke_all(self) -> None:
        """Wake every loop to claim again (what it may claim changed).

        A quiet loop is checked by the safety net's next statement instead, at
        once: a thousand loops claiming at every lane change cost a thousand
        transactions, where their batched check costs ten.
        """
        for queue, poller in self.pollers.items():
            if poller.quiet:
                self._unswept.add(queue)
            else:
                self.wakeups.poke(queue)
        self._sweep_now.set()

    def continuations(self) -> list[str]:
        """Return the queues with a continuation loop."""
        return [q for q, p in self.pollers.items() if p.kind == "continuation"]

    def own_running(self) -> bool:
        """Tell whether the own loop runs (readiness)."""
        own = self.pollers.get(self.own_queue)
        return own is not None and not own.stopped.is_set()

    def not_claiming(self) -> list[NotClaiming]:
        """Return the running loops whose claims keep failing (readiness, the heartbeat row)."""
        running = [self.pollers[q] for q in sorted(self.pollers)]
        found = (p.health.verdict() for p in running if not p.stopped.is_set())
        return [v for v in found if v is not None]

    def claim_gauges(self) -> None:
        """Set each running loop's claim-failing gauges (at a scrape); drop stopped loops'."""
        self.metrics.loop_claim_failing.clear()
        self.metrics.loop_claim_failing_seconds.clear()
        for queue, poller in sorted(self.pollers.items()):
            if poller.stopped.is_set():
                continue
            failing = poller.health.verdict() is not None
            self.metrics.loop_claim_failing.labels(queue, poller.kind).set(1 if failing else 0)
            seconds = poller.health.failing_s()
            self.metrics.loop_claim_failing_seconds.labels(queue, poller.kind).set(seconds)

    def attach(self, runtime: Runtime, queue: str, runs: TaskGroup, side: TaskGroup) -> Poller:
        """Start the claim loop of ``queue``; its runs go to ``runs``, the loop to ``side``."""
        quiet = lanes.loop_kind(queue, self.own_queue) == "continuation"
        shared = LoopShared(
            self.capacity,
            self.poll_interval_s,
            self.metrics,
            runs,
            self.on_guard_failure,
            listen_poll_interval_s=self.listen_poll_interval_s,
            listening=self.listening,
            quiet=quiet,
            secrets=url_secrets(runtime.db.options.url),
        )
        poller = Poller(runtime, queue, self.wakeups.for_queue(queue), shared)
        self.pollers[queue] = poller
        self._attached.append(poller)
        side.start_soon(self._run, poller)
        if poller.kind == "continuation":
            self.metrics.adoptable_queues.set(len(self.continuations()))
            self.log.info("loop.attached", queue=queue)
        if quiet:
            # It starts idle: the safety net's next statement says what is due there.
            self._unswept.add(queue)
            self._sweep_now.set()
        self._queues_changed()
        return poller

    async def _run(self, poller: Poller) -> None:
        await poller.run()
        if poller.kind == "continuation" and poller.detach_reason != "shutdown":
            if self.pollers.get(poller.queue) is poller:  # not a loop attached since
                self.pollers.pop(poller.queue)
            self.metrics.adoptable_queues.set(len(self.continuations()))
            self.log.info("loop.detached", queue=poller.queue, reason=poller.detach_reason)
            self._queues_changed()

    def _queues_changed(self) -> None:
        if self.listener is not None:
            self.listener.queues_changed()

    async def follow(
        self,
        db: Database,
        runtime: Runtime,
        registry: Mapping[str, RegistryLane],
        wanted: Iterable[str],
        runs: TaskGroup,
        side: TaskGroup,
        *,
        stopping: bool,
    ) -> None:
        """Attach a loop on each wanted queue that lacks one; stop the loops no longer wanted."""
        wanted = set(wanted)
        new = sorted(wanted - set(self.continuations()))
        if new and not stopping:
            # One read for all of them: a refresh that attaches a thousand loops
            # (a boot among a week's retired lanes) must not cost two transactions each.
            missing = await db.run(lambda c: engine.queues_unprepared(c, new))
            store_lanes = runtime.store.lanes
            for queue in missing:
                await db.run(lambda c, q=queue: prepare_queue(c, q, store_lanes))  # type: ignore[misc]
            for queue in new:
                self.attach(runtime, queue, runs, side)
        for queue in self.continuations():
            if queue not in wanted:
                self.pollers[queue].stop(_detach_reason(registry.get(queue)))

    async def sweep(self, db: Database, runtime: Runtime) -> None:
        """Be the quiet loops' safety net, until cancelled: one statement per batch of queues.

        Each new quiet loop is checked at once. Then every poll period: while
        LISTEN is connected, the next ``SWEEP_BATCH`` idle quiet loops in turn
        (every way a run becomes claimable sends a NOTIFY or has a due time the
        loop waits for, so this only catches what those miss); without it, all of
        them, ``SWEEP_BATCH`` to a statement. A loop with a run due is poked, one
        with a run due later is told when. The cost is one transaction per batch,
        not one poll per loop: a thousand idle loops polled 33 times a second.
        """
        next_tick = time.monotonic()
        while True:
            listening = self.listening()
            period = self.listen_poll_interval_s if listening else self.poll_interval_s
            with anyio.move_on_after(max(0.0, next_tick - time.monotonic())):
                await self._sweep_now.wait()
            self._sweep_now.clear()
            fresh = sorted(self._unswept)
            self._unswept.clear()
            queues = fresh
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + period
                queues = fresh + [
                    q for q in self._idle_quiet(every=not listening) if q not in fresh
                ]
            for start in range(0, len(queues), SWEEP_BATCH):
                await self._check(db, runtime, queues[start : start + SWEEP_BATCH])

    def _idle_quiet(self, *, every: bool) -> list[str]:
        """The idle quiet loops' queues: all of them, or the next ``SWEEP_BATCH`` in turn."""
        idle = sorted(q for q, p in self.pollers.items() if p.quiet and p.idle)
        if every:
            return idle
        after = [q for q in idle if q > self._sweep_after] + [
            q for q in idle if q <= self._sweep_after
        ]
        chosen = after[:SWEEP_BATCH]
        if chosen:
            self._sweep_after = chosen[-1]
        return chosen

    async def _check(self, db: Database, runtime: Runtime, queues: list[str]) -> None:
        modes = [runtime.claim_mode(q) for q in queues]
        try:
            checks = await db.run(
                lambda c: engine.next_due_many(
                    c,
                    queues,
                    modes,
                    store_schema=runtime.store.schema,
                    own_queue=runtime.queue,
                    plays=runtime.plays,
                )
            )
        except Exception as exc:
            # The loops claim for themselves then (a claim that fails backs off).
            self.log.warning("loop.sweep_failed", queues=len(queues), error=repr(exc))
            for queue in queues:
                self.wakeups.poke(queue)
            return
        for check in checks:
            poller = self.pollers.get(check.queue)
            if poller is None or poller.stopped.is_set():
                continue
            if not check.present:
                self.wakeups.poke(check.queue)  # its claim finds the queue dropped and detaches
            elif check.due_in_s is not None:
                poller.hint(check.due_in_s)

    def stop_all(self, reason: str) -> None:
        """Stop every loop claiming (in-flight runs go on)."""
        for poller in self.pollers.values():
            poller.stop(reason)

    async def wait_finished(self) -> None:
        """Wait until every loop has returned."""
        for poller in list(self.pollers.values()):
            await poller.finished.wait()
