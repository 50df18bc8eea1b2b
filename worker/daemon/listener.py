"""LISTEN for NOTIFY hints on one dedicated connection; polling stays the guarantee.

Channels: ``lane_worker_<queue>`` per claimed queue (a submit, signal or
hand-back on that queue), ``lane_worker_lanes`` (a lane was retired or
activated) and ``lane_worker_ledger`` (a ledger fact waits for delivery).
A notification only sets the matching wake-up event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
import structlog

from worker.db.pool import is_transient
from worker.db.tasks import LANES_CHANNEL, LEDGER_CHANNEL, notify_channel

log = structlog.get_logger("lane_worker.listener")

_RECONNECT_MAX_S = 30.0
KEEPALIVE_S = 15.0
# The keepalive query's bound: a connection whose peer vanished without a reset
# (a network cut) would otherwise hang until TCP gives up, minutes later.
KEEPALIVE_TIMEOUT_S = 5.0


class Wakeups:
    """One asyncio event per queue (and one for the lane registry)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self.lanes_changed = asyncio.Event()
        # A lane NOTIFY came (not only a LISTEN (re)connect, which pokes every loop itself).
        self.lanes_notified = False
        self.ledger = asyncio.Event()  # a ledger fact is waiting for delivery

    def take_lanes_notified(self) -> bool:
        """Tell whether a lane NOTIFY came since the last call, and forget it."""
        notified, self.lanes_notified = self.lanes_notified, False
        return notified

    def for_queue(self, queue: str) -> asyncio.Event:
        """Return the wake-up event of ``queue``."""
        return self._events.setdefault(queue, asyncio.Event())

    def poke(self, queue: str) -> None:
        """Wake the loop of ``queue``."""
        self.for_queue(queue).set()


class Listener:
    """Keeps one LISTEN connection for a changing set of queues, reconnecting with backoff."""

    def __init__(
        self,
        url: str,
        wakeups: Wakeups,
        queues: Callable[[], set[str]],
        poke_loops: Callable[[], None] | None = None,
    ) -> None:
        self._url = url
        self._wakeups = wakeups
        self._queues = queues
        # How every claim loop is told to claim again (by default: poke each queue).
        self._poke_loops = poke_loops
        self._changed = asyncio.Event()
        self.connected = False

    def queues_changed(self) -> None:
        """Tell the listener to re-read its queue set."""
        self._changed.set()

    def _on_lost(
        self, _conn: asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any]
    ) -> None:
        # The server ended the connection (a terminated backend, a restart): the
        # loops must not keep their long poll on a LISTEN that is gone.
        self.connected = False
        self._changed.set()

    def _wake_everyone(self) -> None:
        # Whatever was notified while LISTEN was not up is found by a claim now.
        if self._poke_loops is not None:
            self._poke_loops()
        else:
            for queue in self._queues():
                self._wakeups.poke(queue)
        self._wakeups.lanes_changed.set()
        self._wakeups.ledger.set()

    def _on_notify(
        self,
        _conn: asyncpg.Connection[Any] | asyncpg.pool.PoolConnectionProxy[Any],
        _pid: int,
        channel: str,
        _payload: object,
    ) -> None:
        if channel == LANES_CHANNEL:
            self._wakeups.lanes_notified = True
            self._wakeups.lanes_changed.set()
            return
        if channel == LEDGER_CHANNEL:
            self._wakeups.ledger.set()
            return
        prefix = notify_channel("")
        if channel.startswith(prefix):
            self._wakeups.poke(channel[len(prefix) :])

    async def run(self) -> None:
        """Listen until cancelled; on a dropped connection, wake everyone and reconnect.

        Only an error that is not a connection problem (``is_transient``) comes out.
        """
        failures = 0
        while True:
            conn: asyncpg.Connection[asyncpg.Record] | None = None
            try:
                conn = await asyncpg.connect(
                    self._url,
                    timeout=10,
                    statement_cache_size=0,
                    server_settings={"application_name": "lane-worker-listen"},
                )
                conn.add_termination_listener(self._on_lost)
                listening: set[str] = set()
                await conn.add_listener(LANES_CHANNEL, self._on_notify)
                await conn.add_listener(LEDGER_CHANNEL, self._on_notify)
                while not conn.is_closed():
                    wanted = {notify_channel(q) for q in self._queues()}
                    for channel in sorted(wanted - listening):
                        await conn.add_listener(channel, self._on_notify)
                    for channel in sorted(listening - wanted):
                        await conn.remove_listener(channel, self._on_notify)
                    listening = wanted
                    self._changed.clear()
                    if not self.connected and not conn.is_closed():
                        # Up only once every channel is listened to; then one
                        # claim each finds what was notified before that.
                        self.connected = True
                        failures = 0
                        self._wake_everyone()
                    # Wake on a queue-set change, a lost connection, or now and
                    # then to notice one the peer dropped without a word (the
                    # loops poll rarely only while this connection holds).
                    try:
                        await asyncio.wait_for(self._changed.wait(), timeout=KEEPALIVE_S)
                    except TimeoutError:
                        await conn.fetchval("select 1", timeout=KEEPALIVE_TIMEOUT_S)
                raise ConnectionResetError("LISTEN connection closed")
            except Exception as exc:
                if not is_transient(exc):
                    # Reconnecting cannot fix it: the supervisor stops the worker.
                    raise
                self.connected = False
                failures += 1
                # The loops poll at their short interval from now on.
                self._wake_everyone()
                delay = min(_RECONNECT_MAX_S, 0.5 * 2 ** min(failures, 6))
                log.warning("listener.reconnecting", error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
            finally:
                self.connected = False
                if conn is not None and not conn.is_closed():
                    await conn.close(timeout=2)
