"""The daemon: claim loops, adoption refresh, maintenance, health, SIGTERM drain.

``run_daemon`` boots (``worker.daemon.boot``: the environment and the app before
the event loop; the health port, the database, the schemas and the lane's
registration first thing in ``Supervisor.main``), then starts, in one task
group: the own claim loop, one ``:continuations`` loop per retired lane that
still has open runs (kept current), the LISTEN connection, heartbeats and
maintenance. The first SIGTERM / SIGINT (or a SIGHUP, which never does more)
drains; a second exits at once. A side
loop (heartbeat, maintenance, lane refresh, LISTEN) rides out a database
outage with readiness false; any other error in one drains and exits 1. The
ledger relay (``relay.py``) is a side loop too, but nothing it meets stops the
worker.

(About 490 lines: one class holding one process's state; split further it would
need a mixin with stub attributes, the pattern the run package dropped.)
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from types import FrameType
from typing import Any, NoReturn

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from worker.app import App
from worker.config.settings import Settings
from worker.config.stopping import POLLER_STOP_GRACE_S, STOP_MARK_TIMEOUT_S
from worker.daemon import boot
from worker.daemon.health import HealthServer
from worker.daemon.listener import Listener, Wakeups
from worker.daemon.loops import LoopRegistry, wanted_continuations
from worker.daemon.maintenance import Rotation, maintain
from worker.daemon.processes import EXIT_NOW, PARENT_GONE
from worker.daemon.relay import IDLE_POLL_S, Relay, RelayConfig
from worker.daemon.report_cache import (
    REPORT_RETRY_FOR_S,
    ReportReader,
    SharedRead,
    application_name,
)
from worker.db.pool import Connection, Database, PoolOptions, is_transient
from worker.db.store import Store
from worker.db.store.rows import RegistryLane
from worker.errors import EXIT_FAILURE, NotBootedError
from worker.metrics import Metrics
from worker.ops.report import LaneView
from worker.ops.run_view import RunView
from worker.run.begin import DeferLimits
from worker.run.claim import Capacity
from worker.run.execute import Runtime
from worker.run.handle import WorkerSeat
from worker.run.sandbox import DaytonaDeleter
from worker.states import LaneState, LaneStatus
from worker.version import VERSION

log = structlog.get_logger("lane_worker.supervisor")

# The first of these drains (Fly's kill_signal and the Dockerfile's STOPSIGNAL is SIGTERM).
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
HEARTBEAT_S = 10.0
# Between beats, how often the heartbeat looks whether a loop stopped or resumed claiming:
# such a change is written at once (the lanes page reads it), not at the next beat.
CLAIM_CHECK_S = 1.0
ADOPTION_REFRESH_S = 5.0
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
# /readyz's database probe: `select 1` through the daemon's pool, one at a time, reused briefly.
READY_PROBE_TIMEOUT_S = 2.0
READY_PROBE_FRESH_S = 1.0


def run_daemon(env: Mapping[str, str], app_spec: str) -> int:
    """Run the worker daemon until it is stopped; return the process exit code."""

    async def serve(settings: Settings, app: App) -> int:
        return await Supervisor(settings, app).main()

    return boot.run_worker(env, app_spec, serve)


class Supervisor:
    """Owns the daemon's loops and side tasks for one release lane."""

    def __init__(self, settings: Settings, app: App) -> None:
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
        # The handlers the stop's last part replaced (``_signals``), until it ends.
        self._before_late: dict[int, Any] = {}
        # Side loops whose last pass failed on a database outage: loop -> error type.
        self.side_loop_outages: dict[str, str] = {}
        self.exit_code = 0
        # claiming, or retired: draining (runs only this release may run remain) / drained.
        self.lane_state = LaneState.CLAIMING
        self.stop_requested = anyio.Event()
        self.ready = anyio.Event()
        self.db: Database | None = None
        # Set once boot has installed the schemas: a page view must never run a migration.
        self.schemas_ready = False
        # The health port's reads: single flight, reused briefly; the report on its own pool.
        self.report_reader = ReportReader(
            PoolOptions(
                url=settings.database_url,
                max_size=1,
                application_name=application_name("lane-worker-report", settings.release_id),
                pgbouncer=settings.tuning.pgbouncer,
                retry_for_s=REPORT_RETRY_FOR_S,
            ),
            self.store,
        )
        self.database_probe = SharedRead(
            self._probe_database, fresh_s=READY_PROBE_FRESH_S, failure_fresh_s=READY_PROBE_FRESH_S
        )
        self.health_port: int | None = None  # bound first thing in main
        self.log = log.bind(
            release_id=settings.release_id, queue=settings.queue, worker_id=self.worker_id
        )
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

    async def main(self) -> int:
        """Boot, run until stopped, drain; return the exit code.

        The health port is bound before anything else: a busy one raises
        HealthPortError (exit 1, one sentence) before any connection, and the
        probes answer (/readyz 503, ``booting``) during the connect retry and boot.
        A boot refusal (``boot.BOOT_REFUSALS``) is raised, for ``run_worker`` to say.
        """
        health = HealthServer(
            self.settings.tuning.health_port, self.metrics, self._readiness, self._lanes_view,
            run=self._run_view, scrape=self.loops.claim_gauges,
            host=self.settings.tuning.health_host,
        )  # fmt: skip
        self.health_port = await health.start()
        try:
            self.db = await boot.open_database(self.settings)
            self.lane_state = await boot.install_and_register(self.db, self.store, self.settings)
            await self._heartbeat_once(self.db)
            await self._serve(self.db, health)
            return self.exit_code
        finally:
            # Every way out (boot refused, database unreachable, a crash, the drain) stops
            # the server, before the pools close under a page that reads from them.
            with anyio.CancelScope(shield=True):
                await health.stop()
                await self.database_probe.close()
                await self.report_reader.close()
            if self.db is not None:
                await self.db.close()

    async def _lanes_view(self) -> list[LaneView]:
        """The /lanes page's report: NotBootedError (503) until boot installed the schemas.

        Read through the report's own 1-connection pool, one read at a time for
        every viewer, reused for 2 s: never through the hot path's pool.
        """
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.report()

    async def _run_view(self, run_id: uuid.UUID) -> RunView | None:
        """The run page's read, on the report's pool: NotBootedError (503) until boot is done."""
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.run(run_id)

    def _runtime(self, db: Database) -> Runtime:
        tuning = self.settings.tuning
        seat = WorkerSeat.of(
            self.settings.release_id, worker_base=self.worker_id, lease_s=tuning.claim_timeout_s
        )
        defer = DeferLimits(tuning.defer_alert_after_s, tuning.defer_fail_after_s)
        deleter, why_not = DaytonaDeleter.from_env(self.settings.daytona_env)
        return Runtime(
            db, self.store, self.app, seat, defer=defer, metrics=self.metrics,
            sandboxes=deleter, sandboxes_why_not=why_not,
        )  # fmt: skip

    async def _serve(self, db: Database, health: HealthServer) -> None:
        s = self.settings
        runtime = self._runtime(db)
        runtime.draining = self.lane_state != "claiming"
        # Boot migrated both schemas: the report may be read from now on.
        self.schemas_ready = True
        try:
            async with anyio.create_task_group() as side:
                # Started (the handler installed) before worker.ready is logged: an
                # orchestrator may send SIGTERM the moment it reads that line.
                await side.start(self._signals)
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
                    side.start_soon(self._adoption_refresh, db, runtime, runs, side)
                    self.log.info(
                        "worker.ready",
                        schema=s.scheduler_schema,
                        store_schema=s.store_schema,
                        concurrency=s.tuning.concurrency,
                        health_port=self.health_port,
                        listen=not s.tuning.pgbouncer,
                        lane=self.lane_state,
                        event_loop=boot.running_loop(),
                    )
                    if self.lane_state == LaneState.DRAINING:
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
                    claims=_total(self.metrics.claims),
                    outcomes=_by_label(self.metrics.attempts),
                )
                self._restore_signals()

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
        runs.cancel_scope.cancel()

    async def _signals(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # One of a LANE_WORKER_PROCESSES supervisor's processes drains on its first
        # stop signal and ignores the rest: the supervisor and systemd's
        # control-group kill (or pkill) may both send one. Its supervisor asks for
        # the exit without a drain with EXIT_NOW, which a lone daemon takes too.
        supervised = self.settings.supervised
        try:
            with anyio.open_signal_receiver(*DRAIN_SIGNALS, PARENT_GONE, EXIT_NOW) as received:
                task_status.started()
                async for signum in received:
                    name = signal.Signals(signum).name
                    if signum == EXIT_NOW:
                        self._exit_now(name)
                    if self.stop_requested.is_set():
                        # SIGHUP drains as a first SIGTERM does but never ends a drain
                        # under way: a terminal that hangs up, or the supervisor's death.
                        if signum == PARENT_GONE or supervised:
                            self.log.info("worker.signal", signal=name, already_stopping=True)
                            continue
                        self._exit_now(name)
                    self.log.info("worker.signal", signal=name)
                    self.stop_requested.set()
        finally:
            # The stop's last part (hand-backs, the stop mark) runs after this
            # receiver is gone: the same rules hold there, not the signals' default
            # actions (a death without the hand-backs, or click's "Aborted!").
            again = signal.SIG_IGN if supervised else self._exit_now_handler
            late = {PARENT_GONE: signal.SIG_IGN, signal.SIGTERM: again, signal.SIGINT: again,
                    EXIT_NOW: self._exit_now_handler}  # fmt: skip
            self._before_late = {signum: signal.signal(signum, h) for signum, h in late.items()}

    def _restore_signals(self) -> None:
        """Once the stop is over, the handlers from before it (``dev`` then stops Postgres)."""
        for signum, handler in self._before_late.items():
            signal.signal(signum, handler)
        self._before_late = {}

    def _exit_now(self, signal_name: str) -> NoReturn:
        """The exit without a drain (a second stop, or the supervisor's EXIT_NOW)."""
        self.log.warning("worker.exit_now", signal=signal_name)
        os._exit(EXIT_FAILURE)

    def _exit_now_handler(self, signum: int, _frame: FrameType | None) -> None:
        self._exit_now(signal.Signals(signum).name)

    def _guard_failed(self, message: str) -> None:
        self.guard_error = message
        self.log.error("lane.own_loop_stopped", error=message)

    async def _adoption_refresh(
        self, db: Database, runtime: Runtime, runs: TaskGroup, side: TaskGroup
    ) -> None:
        """Keep the continuation loops this release needs; follow its own lane's state.

        Runs on every lane-registry NOTIFY and every 5 s. ``_refresh_lanes`` says
        which loops are wanted; a loop no longer wanted detaches.
        """
        listen_refresh_s = self._idle_poll(ADOPTION_REFRESH_S)

        def refresh_s() -> float:
            # Draining ends with no NOTIFY (its last run finishes): watch for it.
            draining = self.lane_state == LaneState.DRAINING
            return ADOPTION_REFRESH_S if draining else listen_refresh_s()

        while True:
            self.wakeups.lanes_changed.clear()
            notified = self.wakeups.take_lanes_notified()
            before = _claim_view(runtime)
            if not await self._side_pass(
                "lane_refresh", lambda: self._refresh_lanes(db, runtime, runs, side)
            ):
                return
            if notified or _claim_view(runtime) != before:
                # What a loop may claim changed (a lane retired or activated, a
                # machine of this lane came or went): claim again now, not at the
                # next poll, which is rare while LISTEN is connected. A LISTEN
                # (re)connect poked every loop itself and asks only for this
                # refresh: poking again re-checked a thousand quiet loops twice.
                self.loops.poke_all()
            with anyio.move_on_after(refresh_s()):
                await self.wakeups.lanes_changed.wait()

    async def _refresh_lanes(
        self, db: Database, runtime: Runtime, runs: TaskGroup, side: TaskGroup
    ) -> None:
        s = self.settings
        registry = {r.queue: r for r in await db.run(self._lane_registry)}
        own = registry.get(s.queue)
        if own is not None:
            if own.status != LaneStatus.RETIRED:
                state = LaneState.CLAIMING
            else:
                state = LaneState.DRAINING if own.draining_work else LaneState.DRAINED
            self._set_lane_state(runtime, state)
            runtime.foreign_adoptees = own.foreign_adopted
        runtime.claiming_queues = frozenset(
            q for q, lane in registry.items() if lane.status == LaneStatus.CLAIMING and q != s.queue
        )
        # A loop on every queue that holds runs this release adopted (its own work,
        # whatever that lane's status), and, while this lane claims, on every
        # older retired lane with open runs (to adopt its parked runs as they come due).
        wanted = wanted_continuations(registry, s.queue, s.release_id, self.lane_state)
        await self.loops.follow(
            db, runtime, registry, wanted, runs, side, stopping=self.stop_requested.is_set()
        )

    async def _lane_registry(self, conn: Connection) -> list[RegistryLane]:
        return await self.store.lanes.registry(conn, own_queue=self.settings.queue)

    def _set_lane_state(self, runtime: Runtime, state: LaneState) -> None:
        """Follow this release's lane: claiming, draining or drained."""
        if state == self.lane_state:
            return
        self.lane_state = state
        # A retired lane's loops claim only what no other release may run: its
        # parked runs are left to the claiming releases, which adopt them.
        runtime.draining = state != LaneState.CLAIMING
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

    def _idle_poll(self, polling_s: float) -> Callable[[], float]:
        """A side loop's period: ``polling_s``, or the long one while LISTEN is connected.

        With LISTEN up, its NOTIFY (registry changes, ledger facts) wakes the side
        loop and the period is only a safety net (``LANE_WORKER_LISTEN_POLL_INTERVAL``).
        """
        listen_s = max(polling_s, self.settings.tuning.listen_poll_interval_s)
        return lambda: listen_s if self.loops.listening() else polling_s

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
                ),
            ):
                return
            failed = "maintenance" in self.side_loop_outages
            await anyio.sleep(MAINTENANCE_RETRY_S if failed else MAINTENANCE_S)

    async def _ledger_relay(self, db: Database) -> None:
        """Deliver ledger facts to runtime APIs; a failure of it never stops the worker's runs."""
        t = self.settings.tuning
        relay = Relay(
            db, self.store, worker_id=self.worker_id, metrics=self.metrics,
            wakeup=self.wakeups.ledger, idle_poll_s=self._idle_poll(IDLE_POLL_S),
            config=RelayConfig(t.ledger_path, t.ledger_concurrency, t.ledger_per_endpoint,
                               t.ledger_timeout_s, t.ledger_retry_for_s),
        )  # fmt: skip
        while True:
            try:
                await relay.run()
            except Exception as exc:
                # An outage, or a bug: either way claiming goes on, and the relay
                # tries again (its facts wait in the store, leased or due).
                self.log.error("ledger.relay_failed", error=repr(exc))
            await anyio.sleep(MAINTENANCE_RETRY_S)

    async def _probe_database(self) -> bool:
        """Tell whether `select 1` through the daemon's pool answers within 2 s."""
        if self.db is None:
            return False
        try:
            with anyio.fail_after(READY_PROBE_TIMEOUT_S):
                await self.db.fetchval("select 1")
        except Exception:
            return False
        return True

    async def _readiness(self) -> dict[str, Any]:
        # Served from before the database is opened: until worker.ready, report booting.
        booting = not self.ready.is_set()
        # One probe in flight for every client (it holds at most one of the pool's two
        # connections), its answer reused for 1 s.
        database = self.db is not None and await self.database_probe.get()
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
            "lane": None if booting else self.lane_state,  # unknown before registration
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


def _total(counter: Any) -> int:
    samples = [s for metric in counter.collect() for s in metric.samples]
    return int(sum(s.value for s in samples if s.name.endswith("_total")))


def _by_label(counter: Any) -> dict[str, int]:
    return {
        sample.labels.get("outcome", "?"): int(sample.value)
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def _claim_view(runtime: Runtime) -> tuple[object, ...]:
    """What the claim loops' filters read from the registry (``Runtime.claim_mode``)."""
    return (runtime.draining, runtime.claiming_queues, runtime.foreign_adoptees,
            runtime.lane_plays_differ)  # fmt: skip
