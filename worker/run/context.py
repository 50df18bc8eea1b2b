"""What a play sees while it runs: ``ctx.step``, ``ctx.sleep`` and ``ctx.wait_for_event``.

Steps are engine checkpoints (``step:<name>``): once committed they are never
executed again, only replayed. Sleeps and event waits park the engine run
durably; the checkpoint envelope in the store records when each wait was armed
(its wake time or deadline, under ``armedWaits``) and, once over, how it
resolved (``resolvedBoundaries``), so a resumed run replays to the same point
and a timeout is measured from when the wait was armed, not from a reclaim.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import queue
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from worker import checkpoint
from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store import Store
from worker.errors import FatalRunError, LeaseLostError
from worker.jsonvalue import require_json

_log = structlog.get_logger("lane_worker.runtime")

ARMED_WAITS = "armedWaits"  # our envelope key; unknown to other builds, so kept by them


class Suspended(BaseException):
    """Raised through the play when its run parked in a durable wait.

    A BaseException so that a play's ``except Exception`` cannot swallow it.
    """


# Step-key mappings (runs.step_keys). None: the first one, where a name with a
# '#' could meet a repeated name's key; kept for runs whose steps it wrote.
STEP_KEYS_LEGACY = None
STEP_KEYS_ESCAPED = 2
STEP_KEYS_CURRENT = STEP_KEYS_ESCAPED


def step_checkpoint_name(name: str, occurrence: int, step_keys: int | None) -> str:
    """Return the engine checkpoint of the ``occurrence``-th use (from 1) of step ``name``.

    One-to-one: every '#' in the name is doubled, and a lone '#' starts the
    occurrence number, so ``a#2`` (once) and ``a`` (twice) cannot meet. Names
    without '#' keep the keys they always had.
    """
    key = name if step_keys is STEP_KEYS_LEGACY else name.replace("#", "##")
    return f"step:{key}" if occurrence == 1 else f"step:{key}#{occurrence}"


@dataclass(frozen=True)
class DbClock:
    """The database's clock, read at the claim and advanced by this process's monotonic clock.

    The engine wakes runs by the database's clock; measuring a sleep or a
    timeout on the worker's wall clock would wake a skewed worker early or late.
    """

    db_ms: int
    monotonic_s: float = field(default_factory=time.monotonic)

    def now_ms(self) -> int:
        """Return the database's time now, in Unix milliseconds."""
        return self.db_ms + round((time.monotonic() - self.monotonic_s) * 1000)


def local_clock() -> DbClock:
    """Return a clock on this process's wall time (tests and tools without a claim)."""
    return DbClock(int(time.time() * 1000))


@dataclass
class RunHandle:
    """The engine and store identity of the run being executed, and its fence."""

    run_id: uuid.UUID
    queue: str
    task_id: uuid.UUID
    engine_run_id: uuid.UUID
    attempt: int
    attempt_id: int
    lease_s: int
    clock: DbClock = field(default_factory=local_clock)
    step_keys: int | None = STEP_KEYS_CURRENT


class TaskContext:
    """The ``ctx`` a play receives."""

    def __init__(
        self,
        *,
        db: Database,
        store: Store,
        handle: RunHandle,
        release_id: str,
        envelope: dict[str, Any],
        checkpoints: dict[str, Any],
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self._log = log if log is not None else _log.bind(run_id=str(handle.run_id))
        self._db = db
        self._store = store
        self._h = handle
        self._envelope = checkpoint.checkpoint_base(envelope)
        self._checkpoints = checkpoints
        self._step_uses: dict[str, int] = {}
        self.run_id = str(handle.run_id)
        self.release_id = release_id
        self.attempt = handle.attempt
        # Sync step bodies whose thread has not returned: the attempt is still
        # executing them even after its await was cancelled (a thread cannot be
        # stopped), so it records no end until they return.
        self._threads_running = 0
        self._threads_idle = asyncio.Event()
        self._threads_idle.set()

    @property
    def envelope(self) -> dict[str, Any]:
        """Return the checkpoint envelope as this attempt last wrote it."""
        return self._envelope

    async def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` once for this run; on replay return its committed result instead.

        An async callable runs on the event loop; a sync one in a worker thread,
        so a slow sync step blocks neither lease extension nor other runs.
        """
        uses = self._step_uses.get(name, 0) + 1
        self._step_uses[name] = uses
        # A name used twice in one run names two steps, in order.
        key = step_checkpoint_name(name, uses, self._h.step_keys)
        if key in self._checkpoints:
            return self._checkpoints[key]
        if inspect.iscoroutinefunction(fn):
            result = await fn()
        else:
            result = await self._run_sync(fn)
            if inspect.isawaitable(result):  # a lambda returning a coroutine
                result = await result
        require_json(result, f"the result of step {name!r}")
        h = self._h
        await self._db.run(
            lambda conn: engine.set_checkpoint(
                conn, h.queue, h.task_id, key, result, h.engine_run_id, extend_lease_s=h.lease_s
            )
        )
        self._checkpoints[key] = result
        return result

    async def _run_sync(self, fn: Callable[[], Any]) -> Any:
        self._threads_running += 1
        self._threads_idle.clear()

        def returned() -> None:
            self._threads_running -= 1
            if self._threads_running == 0:
                self._threads_idle.set()

        return await run_in_daemon_thread(fn, on_return=returned)

    def sync_steps_running(self) -> int:
        """Return how many sync step bodies of this attempt are still executing."""
        return self._threads_running

    async def sync_steps_returned(self) -> None:
        """Wait until every sync step body this attempt started has returned."""
        await self._threads_idle.wait()

    async def sleep(self, boundary_id: str, seconds: float) -> None:
        """Sleep durably: the run parks and resumes after ``seconds``, surviving restarts."""
        if checkpoint.boundary_resolved(self._envelope, boundary_id):
            return
        delay_ms = max(0, round(seconds * 1000))
        armed = self._armed(boundary_id, checkpoint.SLEEP_BOUNDARY)
        now_ms = self._now_ms()
        if armed is None:
            armed = {"kind": "sleep", "wakeAtMs": now_ms + delay_ms, "armedAtMs": now_ms}
        if now_ms >= armed["wakeAtMs"]:
            resolved = checkpoint.checkpoint_with_sleep(
                self._envelope, boundary_id, delay_ms, now_ms=now_ms
            )
            await self._save(self._disarm(resolved, boundary_id))
            return
        envelope = self._arm(boundary_id, armed)
        wake_at = engine.datetime_from_ms(armed["wakeAtMs"])
        wait = {"kind": "sleep", "boundaryId": boundary_id, "wakeAtMs": armed["wakeAtMs"]}

        async def park(conn: Connection) -> None:
            await engine.schedule(conn, self._h.queue, self._h.engine_run_id, wake_at)
            await self._park_store(conn, wait, envelope)

        await self._db.transaction(park)
        raise Suspended

    async def wait_for_event(
        self,
        boundary_id: str,
        event_key: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (a durable deadline, the public play API)
    ) -> dict[str, Any]:
        """Wait durably for integration event ``event_key``; return the boundary output.

        The output has ``timed_out`` True when ``timeout`` seconds passed since the
        wait was first armed. The payload comes from the store's signal row.
        """
        resolved = self._resolved_output(boundary_id)
        if resolved is not None:
            return resolved
        self._check_key_unused(boundary_id, event_key)
        armed = self._armed(boundary_id, checkpoint.INTEGRATION_EVENT_BOUNDARY)
        if armed is None:
            now_ms = self._now_ms()
            deadline = None if timeout is None else now_ms + max(0, round(timeout * 1000))
            armed = {
                "kind": "integration_event",
                "eventKey": event_key,
                "deadlineMs": deadline,
                "armedAtMs": now_ms,
            }
        timeout_ms = 0 if armed["deadlineMs"] is None else armed["deadlineMs"] - armed["armedAtMs"]
        engine_payload: Any = None
        # Two turns at most: a stale engine wake-up is consumed by the first
        # await_event call, so the second one parks.
        for _ in range(3):
            output = await self._take_signal(boundary_id, event_key, timeout_ms, engine_payload)
            if output is not None:
                return output
            deadline_ms = armed["deadlineMs"]
            if deadline_ms is not None and self._now_ms() >= deadline_ms:
                return await self._resolve_timeout(boundary_id, event_key, timeout_ms)
            # Not parked. Either the event exists already (its signal row committed
            # with it: the next turn reads the authoritative payload from the
            # store), or the engine took a stale wake-up for a timeout: only the
            # armed deadline decides that, and the next turn parks until it.
            engine_payload = await self._park_for_event(boundary_id, event_key, armed)
        raise FatalRunError(
            f"wait {boundary_id!r} of run {self.run_id} neither parked nor resolved; "
            f"the engine and the store disagree about event {event_key!r}."
        )

    # -- envelope bookkeeping -------------------------------------------------

    def _now_ms(self) -> int:
        return self._h.clock.now_ms()

    def _armed(self, boundary_id: str, kind: str) -> dict[str, Any] | None:
        table = self._envelope.get(ARMED_WAITS)
        entry = table.get(boundary_id) if isinstance(table, dict) else None
        if entry is None:
            return None
        if not isinstance(entry, dict) or entry.get("kind") != kind:
            found = entry.get("kind") if isinstance(entry, dict) else entry
            raise FatalRunError(
                f"boundary {boundary_id!r} of run {self.run_id} was armed as a {found!r} wait, "
                f"but this build resumes it as a {kind!r} wait; it cannot be resumed here."
            )
        return dict(entry)

    def _arm(self, boundary_id: str, armed: dict[str, Any]) -> dict[str, Any]:
        envelope = dict(self._envelope)
        table = envelope.get(ARMED_WAITS)
        envelope[ARMED_WAITS] = {**(table if isinstance(table, dict) else {}), boundary_id: armed}
        return envelope

    @staticmethod
    def _disarm(envelope: dict[str, Any], boundary_id: str) -> dict[str, Any]:
        table = envelope.get(ARMED_WAITS)
        if isinstance(table, dict) and boundary_id in table:
            envelope = dict(envelope)
            envelope[ARMED_WAITS] = {k: v for k, v in table.items() if k != boundary_id}
        return envelope

    def _resolved_output(self, boundary_id: str) -> dict[str, Any] | None:
        if not checkpoint.boundary_resolved(self._envelope, boundary_id):
            return None
        entry = self._envelope["resolvedBoundaries"][boundary_id]
        if entry.get("kind") != checkpoint.INTEGRATION_EVENT_BOUNDARY:
            raise FatalRunError(
                f"boundary {boundary_id!r} was resolved as a {entry.get('kind')!r}, but the play "
                "now waits for an event there; boundary ids must not change meaning."
            )
        output: dict[str, Any] = entry.get("output") or {}
        return output

    def _check_key_unused(self, boundary_id: str, event_key: str) -> None:
        boundaries = self._envelope.get("resolvedBoundaries") or {}
        armed = self._envelope.get(ARMED_WAITS) or {}
        for table in (boundaries, armed):
            if not isinstance(table, dict):
                continue
            for other_id, entry in table.items():
                if (
                    other_id != boundary_id
                    and isinstance(entry, dict)
                    and entry.get("kind") == checkpoint.INTEGRATION_EVENT_BOUNDARY
                    and entry.get("eventKey") == event_key
                ):
                    raise FatalRunError(
                        f"event key {event_key!r} is waited on twice in run {self.run_id} "
                        f"(boundaries {other_id!r} and {boundary_id!r}); an event key can be "
                        "waited on once per run."
                    )

    # -- store and engine writes ---------------------------------------------

    async def _save(self, envelope: dict[str, Any]) -> None:
        async def write(conn: Connection) -> None:
            await self._fenced(conn, "save_checkpoint", envelope)

        await self._db.run(write)
        self._envelope = envelope

    async def _fenced(self, conn: Connection, query: str, *args: Any) -> None:
        h = self._h
        if await self._store.fetchval(conn, query, h.run_id, h.attempt_id, *args) is None:
            raise LeaseLostError(
                f"run {h.run_id} was taken over by a newer claim; attempt {h.attempt_id} stops",
                engine_run_id=h.engine_run_id,
            )

    async def _park_store(
        self, conn: Connection, wait: dict[str, Any], envelope: dict[str, Any]
    ) -> None:
        await self._fenced(conn, "park_run", wait, envelope)
        await self._store.execute(conn, "finish_attempt", self._h.attempt_id, "parked", None)
        self._envelope = envelope

    async def _take_signal(
        self, boundary_id: str, event_key: str, timeout_ms: int, engine_payload: Any
    ) -> dict[str, Any] | None:
        """Resolve the wait from the store's signal row, if the signal has arrived.

        ``engine_payload`` is what the engine delivered, used only when an event
        was emitted without a signal row (not by ``LaneClient.signal``).
        """

        async def take(conn: Connection) -> dict[str, Any] | None:
            row = await self._store.fetchrow(
                conn, "consume_signal", self._h.run_id, event_key, self._h.attempt_id
            )
            if row is not None:
                payload = row["payload"]
            elif engine_payload is not None:
                self._log.warning("wait.event_without_signal_row", event_key=event_key)
                payload = engine_payload
            else:
                return None
            output = checkpoint.integration_event_boundary_output(
                event_key=event_key,
                # Signal data that is not an object is offered under "value".
                signal_data=(
                    payload if payload is None or isinstance(payload, dict) else {"value": payload}
                ),
                timed_out=False,
            )
            envelope = self._disarm(
                checkpoint.checkpoint_with_integration_event(
                    checkpoint=self._envelope,
                    boundary_id=boundary_id,
                    event_key=event_key,
                    timeout_ms=timeout_ms,
                    output=output,
                    now_ms=self._now_ms(),
                ),
                boundary_id,
            )
            await self._fenced(conn, "save_checkpoint", envelope)
            self._envelope = envelope
            return output

        return await self._db.transaction(take)

    async def _resolve_timeout(
        self, boundary_id: str, event_key: str, timeout_ms: int
    ) -> dict[str, Any]:
        output = checkpoint.integration_event_boundary_output(
            event_key=event_key, signal_data=None, timed_out=True
        )
        envelope = checkpoint.checkpoint_with_integration_event(
            checkpoint=self._envelope,
            boundary_id=boundary_id,
            event_key=event_key,
            timeout_ms=timeout_ms,
            output=output,
            now_ms=self._now_ms(),
        )
        await self._save(self._disarm(envelope, boundary_id))
        return output

    async def _park_for_event(self, boundary_id: str, event_key: str, armed: dict[str, Any]) -> Any:
        """Park until the event or the armed deadline (raises ``Suspended``).

        Returns the engine's payload when the event is already there (or None
        when the engine believes the wait timed out).
        """
        h = self._h
        deadline_ms = armed["deadlineMs"]
        # The engine's timeout is whole seconds from now: round up, never below 1,
        # so the run is not woken before the armed deadline.
        remaining_s = (
            None
            if deadline_ms is None
            else max(1, math.ceil((deadline_ms - self._now_ms()) / 1000))
        )
        envelope = self._arm(boundary_id, armed)
        wait = {
            "kind": "integration_event",
            "boundaryId": boundary_id,
            "eventKey": event_key,
            "deadlineMs": deadline_ms,
        }
        event_name = checkpoint.integration_event_name(self.run_id, event_key)

        async def park(conn: Connection) -> tuple[bool, Any]:
            suspend, payload = await engine.await_event(
                conn, h.queue, h.task_id, h.engine_run_id, f"wait:{boundary_id}", event_name,
                remaining_s,
            )  # fmt: skip
            if suspend:
                await self._park_store(conn, wait, envelope)
            return suspend, payload

        suspended, payload = await self._db.transaction(park)
        if suspended:
            raise Suspended
        return payload


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


PlayFn = Callable[[TaskContext, Any], Awaitable[Any]]
