"""The lane follower: follows the lane registry, owns the claim policy, keeps the loops wanted.

On every lane-registry NOTIFY and every 5 s it reads the registry, follows this
release's lane (claiming, draining or drained: logged once per change),
publishes the claim policy the loops read (``worker/run/policy.py``: one new
value, one assignment) and attaches or detaches the ``:continuations`` loops
(``worker/daemon/loops.py``). Nothing else writes the policy; the runtime only
tells the holder what a claim taught it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import anyio
import structlog
from anyio.abc import TaskGroup

from worker import lane_kinds
from worker.daemon.listener import Wakeups
from worker.daemon.loops import LoopRegistry, prepare_queue, wanted_continuations
from worker.db.pool import Database
from worker.db.store import Store
from worker.run.execute import Runtime
from worker.run.policy import ClaimPolicy, CurrentPolicy
from worker.states import LaneState, LaneStatus

ADOPTION_REFRESH_S = 5.0

# The supervisor's side-loop pass: run one refresh, say whether the loop goes on.
SidePass = Callable[[str, Callable[[], Awaitable[object]]], Awaitable[bool]]


class LaneFollower:
    """Follows one release's lane in the registry; the one writer of its claim policy."""

    def __init__(
        self,
        *,
        queue: str,
        release_id: str,
        store: Store,
        loops: LoopRegistry,
        wakeups: Wakeups,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.queue = queue
        self.release_id = release_id
        self.store = store
        self.loops = loops
        self.wakeups = wakeups
        self.log = log
        # claiming, or retired: draining (runs only this release may run remain) / drained.
        self.lane_state = LaneState.CLAIMING
        self.policy = CurrentPolicy(ClaimPolicy(queue))

    def booted(self, state: LaneState) -> None:
        """Take the lane's state as boot's registration found it (no log: ``worker.ready`` says)."""
        self.lane_state = state
        self.policy.publish(replace(self.policy.value, draining=state != LaneState.CLAIMING))

    async def run(
        self,
        db: Database,
        runtime: Runtime,
        runs: TaskGroup,
        side: TaskGroup,
        *,
        side_pass: SidePass,
        stopping: anyio.Event,
    ) -> None:
        """Keep the continuation loops this release needs; follow its own lane's state.

        Runs on every lane-registry NOTIFY and every 5 s. ``refresh`` says which
        loops are wanted; a loop no longer wanted detaches.
        """
        listen_refresh_s = self.loops.idle_poll(ADOPTION_REFRESH_S)

        def refresh_s() -> float:
            # Draining ends with no NOTIFY (its last run finishes): watch for it.
            draining = self.lane_state == LaneState.DRAINING
            return ADOPTION_REFRESH_S if draining else listen_refresh_s()

        while True:
            self.wakeups.lanes_changed.clear()
            notified = self.wakeups.take_lanes_notified()
            before = self.policy.value
            if not await side_pass(
                "lane_refresh",
                lambda: self.refresh(db, runtime, runs, side, stopping=stopping),
            ):
                return
            if notified or self.policy.value != before:
                # What a loop may claim changed (a lane retired or activated, a
                # machine of this lane came or went): claim again now, not at the
                # next poll, which is rare while LISTEN is connected. A LISTEN
                # (re)connect poked every loop itself and asks only for this
                # refresh: poking again re-checked a thousand quiet loops twice.
                self.loops.poke_all()
            with anyio.move_on_after(refresh_s()):
                await self.wakeups.lanes_changed.wait()

    async def refresh(
        self,
        db: Database,
        runtime: Runtime,
        runs: TaskGroup,
        side: TaskGroup,
        *,
        stopping: anyio.Event,
    ) -> None:
        """Read the registry once: follow the lane, publish the policy, follow the loops."""
        registry = {
            r.queue: r
            for r in await db.run(lambda c: self.store.lanes.registry(c, own_queue=self.queue))
        }
        own = registry.get(self.queue)
        # Taken after the read: what a claim taught meanwhile is kept unless the registry says.
        policy = self.policy.value
        if own is not None:
            if own.status != LaneStatus.RETIRED:
                state = LaneState.CLAIMING
            else:
                state = LaneState.DRAINING if own.draining_work else LaneState.DRAINED
            self._follow(state)
            if state != LaneState.CLAIMING and not stopping.is_set():
                state = await self._come_back(db, state)
            # A retired lane's loops claim only what no other release may run: its
            # parked runs are left to the claiming releases, which adopt them.
            policy = replace(
                policy, draining=state != LaneState.CLAIMING, foreign_adoptees=own.foreign_adopted
            )
        claiming = frozenset(
            q for q, r in registry.items() if r.status == LaneStatus.CLAIMING and q != self.queue
        )
        self.policy.publish(replace(policy, claiming_queues=claiming))
        # A loop on every queue that holds runs this release adopted (its own work,
        # whatever that lane's status), and, while this lane claims, on every
        # older retired lane with open runs (to adopt its parked runs as they come due).
        wanted = wanted_continuations(registry, self.queue, self.release_id, self.lane_state)
        await self.loops.follow(
            db, runtime, registry, wanted, runs, side, stopping=stopping.is_set()
        )

    async def _come_back(self, db: Database, state: LaneState) -> LaneState:
        """A dev lane retired (or pruned) under its live worker claims again, as at boot.

        Maintenance retires a dev lane whose workers sent no heartbeat for a while (a
        laptop asleep, a stopped VM) and prunes it later, dropping its queue; only a
        boot made it claim again, so a worker that woke stayed drained, its loops failing
        on the dropped queue. A release lane is a deploy's: it stays retired.
        """
        if not lane_kinds.is_dev(self.release_id):
            return state
        if not await db.run(lambda c: self.store.lanes.activate_dev(c, queue=self.queue)):
            return state
        # Made again if a prune dropped it (the activation holds off any further prune).
        await db.run(lambda c: prepare_queue(c, self.queue, self.store.lanes))
        self.log.info("lane.dev_activated", queue=self.queue, release_id=self.release_id)
        self._follow(LaneState.CLAIMING)
        return LaneState.CLAIMING

    def _follow(self, state: LaneState) -> None:
        """Follow this release's lane: claiming, draining or drained (logged once per change)."""
        if state == self.lane_state:
            return
        self.lane_state = state
        if state == LaneState.DRAINING:
            self.log.warning(
                "lane.draining",
                detail="retired: finishing the runs only this release may run; "
                "parked runs are left to newer releases",
            )
        elif state == LaneState.DRAINED:
            self.log.info(
                "lane.drained",
                detail="retired and drained: nothing here only this release may run; "
                "its machines are safe to stop",
            )
        else:
            self.log.info("lane.activated")
