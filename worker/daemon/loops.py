"""The loop registry: which claim loops one worker runs, attaching and detaching them.

One own loop on the release's queue, plus one ``:continuations`` loop per queue
the lane registry says this release must watch: queues holding runs it adopted
(whatever their lane's status), and, while its own lane claims, older retired
lanes with open runs. The loop kind is decided here, once, when a loop is
attached, and handed to the ``Poller``; readiness reads its facts from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import structlog
from anyio.abc import TaskGroup

from worker import lanes
from worker.daemon.listener import Listener, Wakeups
from worker.db import engine
from worker.db.pool import Database
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
        )
    return wanted


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
        self.polled_queues: set[str] = set()  # every queue a loop claimed from
        self.listener: Listener | None = None

    def queues(self) -> set[str]:
        """Return the queues whose loops still claim (what LISTEN follows)."""
        return {q for q, p in self.pollers.items() if not p.stopped.is_set()}

    def listening(self) -> bool:
        """Tell whether LISTEN is connected (the loops' long poll holds only then)."""
        return self.listener is not None and self.listener.connected

    def poke_all(self) -> None:
        """Wake every loop to claim again (what it may claim changed)."""
        for queue in self.pollers:
            self.wakeups.poke(queue)

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
        shared = LoopShared(
            self.capacity, self.poll_interval_s, self.metrics, runs, self.on_guard_failure,
            listen_poll_interval_s=self.listen_poll_interval_s, listening=self.listening,
        )  # fmt: skip
        poller = Poller(runtime, queue, self.wakeups.for_queue(queue), shared)
        self.pollers[queue] = poller
        self.polled_queues.add(queue)
        side.start_soon(self._run, poller)
        if poller.kind == "continuation":
            self.metrics.adoptable_queues.set(len(self.continuations()))
            self.log.info("loop.attached", queue=queue)
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
        for queue in sorted(wanted - set(self.continuations())):
            if not stopping:
                await db.run(lambda c, q=queue: engine.ensure_queue(c, q))  # type: ignore[misc]
                await db.run(lambda c, q=queue: engine.watch_queue(c, q))  # type: ignore[misc]
                self.attach(runtime, queue, runs, side)
        for queue in self.continuations():
            if queue not in wanted:
                self.pollers[queue].stop(_detach_reason(registry.get(queue)))

    def stop_all(self, reason: str) -> None:
        """Stop every loop claiming (in-flight runs go on)."""
        for poller in self.pollers.values():
            poller.stop(reason)

    async def wait_finished(self) -> None:
        """Wait until every loop has returned."""
        for poller in list(self.pollers.values()):
            await poller.finished.wait()
