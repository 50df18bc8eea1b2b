"""The daemon: claim loops, lane following, maintenance, health, SIGTERM drain.

``run_daemon`` boots (``worker.daemon.boot``: the environment and the app before
the event loop; the health port, the database, the schemas and the lane's
registration first thing in ``Supervisor.main``), then starts, in one task
group: the own claim loop, the lane follower (``lane_follower.py``: the claim
policy, and one ``:continuations`` loop per retired lane that still has open
runs), the LISTEN connection, heartbeats and maintenance. A stop signal does
what the stop rules say (``worker/config/stopping.py``, followed by
``signals.py``): the first SIGTERM / SIGINT drains (``_drain``). A side loop
(heartbeat, maintenance, lane refresh, LISTEN) rides out a database outage with
readiness false; any other error in one drains and exits 1. The ledger relay
(``relay.py``) is a side loop too, but nothing it meets stops the worker.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup

from worker.app import App
from worker.config.settings import Settings
from worker.config.stopping import POLLER_STOP_GRACE_S, STOP_MARK_TIMEOUT_S, Role
from worker.daemon import boot
from worker.daemon.health import HealthServer
from worker.daemon.lane_follower import LaneFollower
from worker.daemon.listener import Listener, Wakeups
from worker.daemon.loops import LoopRegistry
from worker.daemon.maintenance import Rotation, maintain
from worker.daemon.operator import OperatorPages
from worker.daemon.relay import IDLE_POLL_S, Relay, RelayConfig
from worker.daemon.report_cache import HealthReads
from worker.daemon.signals import StopSignals
from worker.db.pool import Database, is_transient
from worker.db.store import Store
from worker.errors import EXIT_FAILURE
from worker.metrics import Metrics
from worker.run.begin import DeferLimits
from worker.run.claim import Capacity
from worker.run.execute import Runtime
from worker.run.handle import WorkerSeat
from worker.run.sandbox import DaytonaDeleter
from worker.states import LaneState
from worker.version import VERSION

log = structlog.get_logger("lane_worker.supervisor")

HEARTBEAT_S = 10.0
# Between beats, how often the heartbeat looks whether a loop stopped or resumed claiming:
# such a change is written at once (the lanes page reads it), not at the next beat.
CLAIM_CHECK_S = 1.0
MAINTENANCE_S = 60.0
# After a pass that failed on an outage, so readiness turns true soon after the database is back.
MAINTENANCE_RETRY_S = 10.0
# The event a side loop logs when the database is away (stable names, see docs/DESIGN.md).
SIDE_LOOP_OUTAGE_EVENTS = {
    "heartbeat": "worker.heartbeat_failed",
    "maintenance": "maintenance.failed",
    "lane_refresh": "adoption.refresh_failed",
    "listener": "listener.failed",
}


def run_daemon(env: Mapping[str, str], app_spec: str) -> int:
    """Run the worker daemon until it is stopped; return the process exit code."""

    async def serve(settings: Settings, app: App) -> int:
        return await Supervisor(settings, app).main()

    return boot.run_worker(env, app_spec, serve)


class Supervisor:
    """Owns the daemon's loops and side tasks for one release lane."""

    def __init__(self, settings: Settings, app: App, *, dev: bool = False) -> None:
        self.settings = settings
        self.app = app
        # The token: containers often share a hostname and run as pid 1, and two
        # workers with one id would hand back each other's runs at shutdown.
        self.worker_id = (
            f"{settings.release_id}@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        )
        self.metrics = Metrics()
        self.wakeups = Wakeups()
        self.capacity = Capacity(settings.tuning.concurrency)
        self.store = Store(settings.store_schema)
        self.guard_error: str | None = None
        # Side loops whose last pass failed on a database outage: loop -> error type.
        self.side_loop_outages: dict[str, str] = {}
        self.exit_code = 0
        self.stop_requested = anyio.Event()
        self.ready = anyio.Event()
        self.db: Database | None = None
        # The health port's reads: single flight, reused briefly; the report on its own pool.
        self.reads = HealthReads(settings, self.store, lambda: self.db)
        self.health_port: int | None = None  # bound first thing in main
        self.log = log.bind(
            release_id=settings.release_id, queue=settings.queue, worker_id=self.worker_id
        )
        # The stop rules this process follows (worker/config/stopping.py).
        role = Role.SUPERVISED if settings.supervised else Role.DEV if dev else Role.WORKER
        self.signals = StopSignals(role, self.stop_requested, self.log)
        self.loops = LoopRegistry(
            own_queue=settings.queue,
            capacity=self.capacity,
            wakeups=self.wakeups,
            poll_interval_s=settings.tuning.poll_interval_s,
            listen_poll_interval_s=settings.tuning.listen_poll_interval_s,
            metrics=self.metrics,
            on_guard_failure=self._guard_failed,
            log=self.log,
        )
        # Follows this release's lane; owns the claim policy the loops read.
        self.follower = LaneFollower(
            queue=settings.queue,
            release_id=settings.release_id,
            store=self.store,
            loops=self.loops,
            wakeups=self.wakeups,
            log=self.log,
        )

    async def main(self) -> int:
        """Boot, run until stopped, drain; return the exit code.

        The health port is bound before anything else: a busy one raises
        HealthPortError (exit 1, one sentence) before any connection, and the
        probes answer (/readyz 503, ``booting``) during the connect retry and boot.
        A boot refusal (``boot.BOOT_REFUSALS``) is raised, for ``run_worker`` to say.
        """
        health = HealthServer(
            self.settings.tuning.health_port,
            self.metrics,
            self._readiness,
            self.reads.lanes_view,
            run=self.reads.run_view,
            operator=OperatorPages(
                self.reads, self.store, token=self.settings.page_token, worker_id=self.worker_id
            ),
            scrape=self.loops.claim_gauges,
            host=self.settings.tuning.health_host,
        )
        self.health_port = await health.start()
        try:
            self.db = await boot.open_database(self.settings)
            lane_state = await boot.install_and_register(self.db, self.store, self.settings)
            self.follower.booted(lane_state)
            await self._heartbeat_once(self.db)
            await self._serve(self.db, health)
            return self.exit_code
        finally:
            # Every way out (boot refused, database unreachable, a crash, the drain) stops
            # the server, before the pools close under a page that reads from them.
            with anyio.CancelScope(shield=True):
                await health.stop()
                await self.reads.close()
            if self.db is not None:
                await self.db.close()

    def _runtime(self, db: Database) -> Runtime:
        tuning = self.settings.tuning
        seat = WorkerSeat.of(
            self.settings.release_id,
            worker_base=self.worker_id,
            lease_s=tuning.claim_timeout_s,
            own_queue=self.settings.queue,
        )
        defer = DeferLimits(
            tuning.defer_alert_after_s, tuning.defer_fail_after_s, tuning.unknown_play_grace_s
        )
        deleter, why_not = DaytonaDeleter.from_env(self.settings.daytona_env)
        return Runtime(
            db,
            self.store,
            self.app,
            seat,
            defer=defer,
            metrics=self.metrics,
            sandboxes=deleter,
            sandboxes_why_not=why_not,
            policy=self.follower.policy,
        )

    async def _serve(self, db: Database, health: HealthServer) -> None:
        s = self.settings
        runtime = self._runtime(db)
        # Boot migrated both schemas: the report may be read from now on.
        self.reads.schemas_ready = True
        try:
            async with anyio.create_task_group() as side:
                # Started (the handler installed) before worker.ready is logged: an
                # orchestrator may send SIGTERM the moment it reads that line.
                await side.start(self.signals.receive)
                if not s.tuning.pgbouncer:
                    listener = Listener(
                        s.database_url, self.wakeups, self.loops.queues, self.loops.poke_all
                    )
                    self.loops.listener = listener
                    # It reconnects through outages by itself; only a crash comes out.
                    side.start_soon(self._side_pass, "listener", listener.run)
                side.start_soon(self._heartbeats, db)
                side.start_soon(self._maintenance, db)
                side.start_soon(self._ledger_relay, db)
                async with anyio.create_task_group() as runs:
                    self.loops.attach(runtime, s.queue, runs, side)
                    side.start_soon(self.loops.sweep, db, runtime)
                    follow = partial(
                        self.follower.run, side_pass=self._side_pass, stopping=self.stop_requested
                    )
                    side.start_soon(follow, db, runtime, runs, side)
                    self.log.info(
                        "worker.ready",
                        schema=s.scheduler_schema,
                        store_schema=s.store_schema,
                        concurrency=s.tuning.concurrency,
                        health_port=self.health_port,
                        listen=not s.tuning.pgbouncer,
                        lane=self.follower.lane_state,
                        event_loop=boot.running_loop(),
                    )
                    if self.follower.lane_state == LaneState.DRAINING:
                        self.log.warning(
                            "lane.draining",
                            detail="booted on a retired lane: finishing the runs only this "
                            "release may run; parked runs are left to newer releases",
                        )
                    self.ready.set()
                    # The ready mark a scaler waits for, now rather than a beat later.
                    side.start_soon(self._side_pass, "heartbeat", lambda: self._heartbeat_once(db))
                    await self.stop_requested.wait()
                    await self._drain(runs)
                side.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await health.stop()  # main stops it too; here it stops before the stop mark
                # A database that is away must not hold up the exit: leftovers then
                # wait for their lease, and the stop mark is display only.
                with anyio.move_on_after(STOP_MARK_TIMEOUT_S):
                    await self._give_back_leftovers(runtime)
                    await db.run(
                        lambda c: self.store.lanes.worker_stopped(c, worker_id=self.worker_id)
                    )
                self.log.info(
                    "worker.stopped",
                    claims=self.metrics.claims_total(),
                    outcomes=self.metrics.attempts_by_outcome(),
                )
                self.signals.restore()

    async def _give_back_leftovers(self, runtime: Runtime) -> None:
        """Hand back claims that committed while their loop was being cancelled."""
        queues = sorted(self.loops.polled_queues)
        try:
            given = await runtime.give_back_leftovers(queues)
            self.log.info("worker.leftovers_checked", queues=len(queues), handed_back=given)
        except Exception as exc:
            self.log.warning("worker.leftover_hand_back_failed", error=repr(exc))

    def request_stop(self) -> None:
        """Start the drain, as a first SIGTERM does."""
        self.stop_requested.set()

    async def _side_pass(self, loop: str, work: Callable[[], Awaitable[object]]) -> bool:
        """Run one pass of side loop ``loop``; return False when the loop must end.

        A database outage (a transient error, also once the pool's retry budget
        is spent on one) is logged and left to the loop's next pass, with
        readiness false until a pass succeeds. Anything else is a bug or a
        broken schema that no retry fixes: the worker drains as on SIGTERM and
        exits 1, so the orchestrator restarts it and the crash is visible.
        """
        try:
            await work()
        except Exception as exc:
            if is_transient(exc):
                self.side_loop_outages[loop] = type(exc).__name__
                self.log.warning(SIDE_LOOP_OUTAGE_EVENTS[loop], error=repr(exc))
                return True
            self.side_loop_outages.pop(loop, None)
            self.log.error("worker.side_loop_crashed", loop=loop, error=repr(exc), exc_info=exc)
            self.exit_code = EXIT_FAILURE
            self.request_stop()
            return False
        self.side_loop_outages.pop(loop, None)
        return True

    async def _drain(self, runs: TaskGroup) -> None:
        """Stop claiming, let in-flight runs finish within the window, hand back the rest."""
        drain_s = self.settings.tuning.drain_s
        self.log.info("worker.stopping", in_flight=self.capacity.in_use, drain_s=drain_s)
        self.loops.stop_all("shutdown")
        with anyio.move_on_after(POLLER_STOP_GRACE_S):
            await self.loops.wait_finished()
        with anyio.move_on_after(drain_s):
            await self.capacity.wait_idle()
        if self.capacity.in_use:
            self.log.info("worker.handing_back", in_flight=self.capacity.in_use)
        # Each unfinished run unwinds its play and hands itself back (shielded).
        self.signals.handing_back()
        runs.cancel_scope.cancel()

    def _guard_failed(self, message: str) -> None:
        self.guard_error = message
        self.log.error("lane.own_loop_stopped", error=message)

    async def _heartbeat_once(self, db: Database) -> None:
        s = self.settings
        ready = self.ready.is_set()
        await db.run(
            lambda c: self.store.lanes.heartbeat(
                c,
                worker_id=self.worker_id,
                release_id=s.release_id,
                queue=s.queue,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                concurrency=s.tuning.concurrency,
                plays=sorted(self.app.plays),
                machine_id=s.machine_id,
                ready=ready,
                version=VERSION,
                not_claiming=[v.as_json() for v in self.loops.not_claiming()],
            )
        )

    async def _heartbeats(self, db: Database) -> None:
        written = self._claiming_view()
        while True:
            # Every 10 s, or as soon as a loop stops or resumes claiming (a verdict that
            # time alone changes: no event to wait for).
            for _ in range(round(HEARTBEAT_S / CLAIM_CHECK_S)):
                await anyio.sleep(CLAIM_CHECK_S)
                if self._claiming_view() != written:
                    break
            written = self._claiming_view()
            if not await self._side_pass("heartbeat", lambda: self._heartbeat_once(db)):
                return

    def _claiming_view(self) -> frozenset[tuple[str, str]]:
        """The loops (queue, kind) that do not claim now: what the heartbeat row says."""
        return frozenset((v.queue, v.loop) for v in self.loops.not_claiming())

    async def _maintenance(self, db: Database) -> None:
        # Each pass takes the next slice of queues: a pass is bounded whatever their number.
        rotation = Rotation()
        while True:
            if not await self._side_pass(
                "maintenance",
                lambda: maintain(
                    db,
                    self.store,
                    worker_id=self.worker_id,
                    metrics=self.metrics,
                    rotation=rotation,
                    prune_after_s=self.settings.tuning.prune_after_s,
                    dev_idle_after_s=self.settings.tuning.dev_lane_idle_after_s,
                ),
            ):
                return
            failed = "maintenance" in self.side_loop_outages
            await anyio.sleep(MAINTENANCE_RETRY_S if failed else MAINTENANCE_S)

    async def _ledger_relay(self, db: Database) -> None:
        """Deliver ledger facts to runtime APIs; a failure of it never stops the worker's runs."""
        t = self.settings.tuning
        relay = Relay(
            db,
            self.store,
            worker_id=self.worker_id,
            metrics=self.metrics,
            wakeup=self.wakeups.ledger,
            idle_poll_s=self.loops.idle_poll(IDLE_POLL_S),
            config=RelayConfig(
                t.ledger_path,
                t.ledger_concurrency,
                t.ledger_per_endpoint,
                t.ledger_timeout_s,
                t.ledger_retry_for_s,
            ),
        )
        while True:
            try:
                await relay.run()
            except Exception as exc:
                # An outage, or a bug: either way claiming goes on, and the relay
                # tries again (its facts wait in the store, leased or due).
                self.log.error("ledger.relay_failed", error=repr(exc))
            await anyio.sleep(MAINTENANCE_RETRY_S)

    async def _readiness(self) -> dict[str, Any]:
        # Served from before the database is opened: until worker.ready, report booting.
        booting = not self.ready.is_set()
        database = await self.reads.database_answers()
        own_running = self.loops.own_running()
        not_claiming = [v.as_json() for v in self.loops.not_claiming()]
        ready = (
            not booting
            and database
            and own_running
            and self.guard_error is None
            and not self.side_loop_outages
            and not not_claiming
            and not self.stop_requested.is_set()
        )
        return {
            "ready": ready,
            "booting": booting,
            "database": database,
            "ownLoop": "running" if own_running else "stopped",
            "lane": None if booting else self.follower.lane_state,  # unknown before registration
            "continuationLoops": sorted(self.loops.continuations()),
            "laneGuardError": self.guard_error,
            "sideLoopOutages": dict(sorted(self.side_loop_outages.items())),
            # Loops whose claims keep failing: the worker serves nothing through them.
            "notClaiming": not_claiming,
            "listening": bool(self.loops.listener and self.loops.listener.connected),
            "inFlight": self.capacity.in_use,
            "releaseId": self.settings.release_id,
            "queue": self.settings.queue,
        }
