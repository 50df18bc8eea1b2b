"""``lane-worker scaler``: one active per database, a reconcile pass every few seconds.

The active scaler holds a session advisory lock on its own connection; a second
one waits as a standby and takes over when the lock is free (its holder died or
stopped). The lock is a lease: its session has ``idle_session_timeout`` set to
``LEASE_S`` and the active scaler speaks on it every ``LEASE_S / 6``, so a
scaler that hangs (stopped, frozen, or cut off from the database) loses the lock
within ``LEASE_S`` and a standby takes over; the hung one, if it wakes, finds
its connection closed and acts on nothing (every action checks the lock first).
Each pass is stateless (``reconcile.py``), writes what it saw to the
store (``scaler_state``: ``releases`` and ``releases deploy --wait`` read it)
and is exposed on the health port: ``/healthz``, ``/readyz`` (ready while it is
the active scaler and its last pass succeeded), ``/metrics``. SIGTERM stops it;
the machines keep running, and a pass in progress (a backend call waiting
to retry) ends at once.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import asyncpg
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.client import LaneClient
from worker.config.stopping import Phase, Role, StopAction, handled_signals, stop_action
from worker.daemon.health import HealthServer
from worker.masking import mask_value
from worker.metrics import build_info
from worker.ops.releases import actor
from worker.scaler.backend import RUNNING_STATES, STOPPING, Backend
from worker.scaler.gate import Gates
from worker.scaler.reconcile import Reconciler

PASS_S = 2.0
STANDBY_RETRY_S = 2.0
LEASE_S = 30.0

log = structlog.get_logger("lane_worker.scaler")


class LockLost(Exception):
    """The connection holding the lock failed: this scaler no longer holds it."""


# What losing the lock (or not reaching the database) looks like: the scaler
# stands by and tries again.
_LOCK_LOST = (LockLost, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


def lock_key(schema: str) -> int:
    """The advisory lock one active scaler per store holds (a signed 64-bit number)."""
    digest = hashlib.sha256(f"lane_worker.scaler:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def _lost() -> None:
    raise LockLost("the scaler does not hold its lock")


class _Lease:
    """The connection that holds the lock, spoken on by one task at a time."""

    def __init__(self, conn: asyncpg.Connection[Any]) -> None:
        self.conn = conn
        self._turn = anyio.Lock()

    async def check(self) -> object:
        """Fail unless the lock's connection still answers (the lock is still held)."""
        async with self._turn:
            try:
                return await self.conn.fetchval("select 1", timeout=5)
            except Exception as exc:
                # However it fails (the server ended the idle session of a scaler
                # that hung: asyncpg may say so in several ways), the lock is gone.
                raise LockLost(f"the lock's connection failed: {type(exc).__name__}") from exc

    async def keep(self) -> None:
        """Speak on the connection well within its idle timeout, until it fails."""
        while True:
            await self.check()
            await anyio.sleep(LEASE_S / 6)


class ScalerMetrics:
    """The scaler's own metrics and its build: none of a worker's families (claims,
    attempts, lanes), which a scaler never sets and a dashboard would read as zeros."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.build_info = build_info(self.registry)
        self.machines_desired = Gauge(
            "lane_worker_scaler_machines_desired",
            "Machines a release should run now.",
            ["release"],
            registry=self.registry,
        )
        self.machines_running = Gauge(
            "lane_worker_scaler_machines_running",
            "Machines of a release the backend runs.",
            ["release"],
            registry=self.registry,
        )
        self.machines_unlisted = Gauge(
            "lane_worker_scaler_machines_unlisted",
            "Machines the scaler created that the backend does not list (a listing that is "
            "wrong: the release gets no new machine until it is right).",
            ["release"],
            registry=self.registry,
        )
        self.actions = Counter(
            "lane_worker_scaler_actions",
            "Machines created, stopped, destroyed or replaced.",
            ["action"],
            registry=self.registry,
        )
        self.errors = Counter(
            "lane_worker_scaler_errors",
            "Passes or backend calls that failed.",
            registry=self.registry,
        )


class Scaler:
    """The scaler process: standby until it holds the lock, then a pass every ``PASS_S``."""

    def __init__(
        self,
        client: LaneClient,
        backend: Backend,
        *,
        health_port: int,
        secrets: Sequence[str] = (),
    ) -> None:
        self.client, self.backend, self.health_port = client, backend, health_port
        # Masked in what the scaler writes for `releases` and the page to show (a
        # backend's error may quote an answer that echoed the token).
        self.secrets = tuple(secrets)
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.metrics = ScalerMetrics()
        self.active = False
        self.last_pass_ok = False
        self.stop = anyio.Event()
        self.reconciler = Reconciler(client.db, client.store, backend, actor=f"scaler {actor()}")
        self.reconciler.guard = _lost  # until it holds the lock
        self.reconciler.secrets = self.secrets  # masked in what it records of a machine's output
        self.left_running: list[str] = []  # its machines running at its last pass
        # A gated deploy's candidate: its gate runs, then promoted or retired (gate.py).
        self.gates = Gates(client, actor=f"scaler {actor()}", guard=_lost)

    async def _readiness(self) -> dict[str, Any]:
        ready = self.active and self.last_pass_ok
        return {"ready": ready, "active": self.active, "lastPassOk": self.last_pass_ok}

    async def run(self, url: str) -> int:
        health = HealthServer(self.health_port, self.metrics, self._readiness)
        port = await health.start()
        log.info("scaler.started", backend=self.backend.name, health_port=port, holder=self.holder)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._signals, tg)
                await self._lead(url)
                tg.cancel_scope.cancel()
        finally:
            await health.stop()
            # Its machines outlive it by design (a scaler restart must not cut
            # steps mid-run): said, and `releases` keeps showing them.
            log.info(
                "scaler.stopped",
                machines_left_running=self.left_running,
                detail="machines keep running: `lane-worker releases` lists them",
            )
        return 0

    async def _signals(self, tg: anyio.abc.TaskGroup) -> None:
        # The stop rules (worker/config/stopping.py): the first stop ends the scaler's
        # passes; then it is draining, where every signal keeps its default action.
        with anyio.open_signal_receiver(*handled_signals(Role.SCALER, Phase.SERVING)) as signals:
            async for signum in signals:
                if stop_action(Role.SCALER, Phase.SERVING, signum) is StopAction.DRAIN:
                    self.stop.set()
                    return

    async def _lead(self, url: str) -> None:
        """Hold the lock (waiting as a standby until it is free) and reconcile while held."""
        key = lock_key(self.client.store.schema)
        said_standby = False
        while not self.stop.is_set():
            conn: asyncpg.Connection[Any] | None = None
            try:
                # The server ends the session (and frees the lock) when it is idle
                # for LEASE_S: the active scaler hung.
                conn = await asyncpg.connect(
                    url,
                    timeout=10,
                    server_settings={
                        "idle_session_timeout": str(int(LEASE_S * 1000)),
                        "application_name": "lane-worker-scaler-lock",
                    },
                )
                if not await conn.fetchval("select pg_try_advisory_lock($1)", key):
                    if not said_standby:
                        log.info("scaler.standby", detail="another scaler is active")
                        said_standby = True
                    await conn.close()
                    conn = None
                    with anyio.move_on_after(STANDBY_RETRY_S):
                        await self.stop.wait()
                    continue
                lease = _Lease(conn)
                # Machines are marked with the store's id: read before any call.
                self.backend.store_id = await self.client.db.run(
                    self.client.store.registry.store_id
                )
                self.active = True
                self.reconciler.reset()
                log.info("scaler.active", holder=self.holder)
                self.reconciler.guard = lease.check
                self.gates.guard = lease.check
                await self._while_held(lease)
            except _LOCK_LOST as exc:
                # The lock's connection dropped (or never opened): stand by and take it again.
                if isinstance(exc, LockLost):
                    log.warning("scaler.lock_lost", error=str(exc))
                else:
                    log.warning("scaler.database_unavailable", error=type(exc).__name__)
                with anyio.move_on_after(STANDBY_RETRY_S):
                    await self.stop.wait()
            finally:
                self.active = False
                self.reconciler.guard = _lost
                self.gates.guard = _lost
                if conn is not None and not conn.is_closed():
                    await conn.close(timeout=2)  # releases the lock

    async def _while_held(self, lease: _Lease) -> None:
        """Pass after pass while the lease is kept; raise what lost it."""
        lost: list[BaseException] = []

        async def until_lost(job: Callable[[], Awaitable[None]], tg: anyio.abc.TaskGroup) -> None:
            try:
                await job()
            except _LOCK_LOST as exc:
                lost.append(exc)
            tg.cancel_scope.cancel()

        async def until_stopped(tg: anyio.abc.TaskGroup) -> None:
            # The stop signal ends a pass wherever it waits (a backend's retries).
            await self.stop.wait()
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(until_lost, lease.keep, tg)
            tg.start_soon(until_lost, lambda: self._passes(lease), tg)
            tg.start_soon(until_stopped, tg)
        if lost:
            raise lost[0]  # out of the task group: the caller stands by

    async def _beat(self, said: dict[str, Any]) -> None:
        try:
            await self.client.db.run(
                lambda c: self.client.store.registry.scaler_beat(
                    c, holder=self.holder, backend=self.backend.name, releases=said
                )
            )
        except Exception as exc:
            log.warning("scaler.beat_failed", error=type(exc).__name__)

    async def _passes(self, lease: _Lease) -> None:
        while not self.stop.is_set():
            await lease.check()  # still holding it: the connection is alive
            started = time.monotonic()
            try:
                seen = await self.reconciler.once()
                self.last_pass_ok = True
            except Exception as exc:
                self.last_pass_ok = False
                self.metrics.errors.inc()
                log.error("scaler.pass_failed", error=repr(exc))
                seen = {}
            if self.last_pass_ok:
                try:
                    await self.gates.once()  # after the pass: it reads the machines ready
                except Exception as exc:
                    # Said, and the pass's words kept: the next pass tries again.
                    self.metrics.errors.inc()
                    log.error("scaler.gate_step_failed", error=repr(exc))
            self.left_running = sorted(
                str(m.get("id"))
                for s in seen.values()
                for m in s.machines
                if m.get("state") in RUNNING_STATES or m.get("state") == STOPPING
            )
            for release_id, s in seen.items():
                self.metrics.machines_desired.labels(release_id).set(s.target)
                self.metrics.machines_running.labels(release_id).set(s.running)
                self.metrics.machines_unlisted.labels(release_id).set(s.unlisted)
                for action in s.actions:
                    self.metrics.actions.labels(action.split()[0]).inc()
            # Only while still holding the lock: a scaler that hung and woke up must
            # not write over what the active one says.
            await lease.check()
            await self._beat(mask_value({k: v.as_json() for k, v in seen.items()}, self.secrets))
            with anyio.move_on_after(max(0.1, PASS_S - (time.monotonic() - started))):
                await self.stop.wait()
