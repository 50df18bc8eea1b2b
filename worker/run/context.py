"""What a play sees while it runs: ``ctx.step``, ``ctx.sleep``, ``ctx.wait_for_event``,
``ctx.run_detached`` and ``ctx.register_sandbox``.

Steps are engine checkpoints (``step:<name>``): once committed they are never
executed again, only replayed. Sleeps and event waits park the engine run
durably; the checkpoint envelope in the store records when each wait was armed
(its wake time or deadline, under ``armedWaits``) and, once over, how it
resolved (``resolvedBoundaries``), so a resumed run replays to the same point
and a timeout is measured from when the wait was armed, not from a reclaim.
The envelope's bookkeeping and a wait's durations are pure functions
(``worker/run/waits.py``); a park ends the attempt in ``Attempt.end``
(``worker/run/attempt.py``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from worker import checkpoint
from worker.db import engine
from worker.db.pool import Connection
from worker.errors import FatalRunError
from worker.jsonvalue import require_json, require_readable
from worker.run import waits
from worker.run.attempt import Attempt
from worker.run.threads import run_in_daemon_thread
from worker.run.transition import Park

_log = structlog.get_logger("lane_worker.runtime")


class Suspended(BaseException):
    """Raised through the play when its run parked in a durable wait.

    A BaseException so that a play's ``except Exception`` cannot swallow it.
    """


class TaskContext:
    """The ``ctx`` a play receives."""

    def __init__(self, attempt: Attempt, *, release_id: str, checkpoints: dict[str, Any]) -> None:
        handle = attempt.handle
        self._attempt = attempt
        self._log = attempt.log
        self._db = attempt.db
        self._h = handle
        self._envelope = checkpoint.checkpoint_base(attempt.envelope or {})
        self._checkpoints = checkpoints
        self._step_uses: dict[str, int] = {}
        self._detached_uses: dict[str, int] = {}
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
        return await self._step_at(
            waits.step_checkpoint_name(name, uses, self._h.step_keys), name, fn
        )

    async def _step_at(self, key: str, name: str, fn: Callable[[], Any]) -> Any:
        """Run step ``name`` under checkpoint ``key``, or return its committed result."""
        if key in self._checkpoints:
            return self._checkpoints[key]
        if inspect.iscoroutinefunction(fn):
            result = await fn()
        else:
            result = await self._run_sync(fn)
            if inspect.isawaitable(result):  # a lambda returning a coroutine
                result = await result
        require_json(result, f"the result of step {name!r}")
        await self._attempt.write_step(key, result)
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
        delay_ms = round(waits.duration_s(seconds, "sleep") * 1000)
        armed = waits.armed(self._envelope, self.run_id, boundary_id, checkpoint.SLEEP_BOUNDARY)
        now_ms = self._now_ms()
        if armed is None:
            armed = {"kind": "sleep", "wakeAtMs": now_ms + delay_ms, "armedAtMs": now_ms}
        if now_ms >= armed["wakeAtMs"]:
            resolved = checkpoint.checkpoint_with_sleep(
                self._envelope, boundary_id, delay_ms, now_ms=now_ms
            )
            await self._save(waits.disarm(resolved, boundary_id))
            return
        envelope = waits.arm(self._envelope, boundary_id, armed)
        wake_at = engine.datetime_from_ms(armed["wakeAtMs"])
        wait = {"kind": "sleep", "boundaryId": boundary_id, "wakeAtMs": armed["wakeAtMs"]}
        await self._attempt.end(Park("sleep", boundary_id, wait, envelope, wake_at=wake_at))
        self._envelope = envelope
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
        resolved = waits.resolved_output(self._envelope, boundary_id)
        if resolved is not None:
            return resolved
        waits.check_key_unused(self._envelope, self.run_id, boundary_id, event_key)
        armed = waits.armed(
            self._envelope, self.run_id, boundary_id, checkpoint.INTEGRATION_EVENT_BOUNDARY
        )
        if armed is None:
            armed = waits.event_armed(event_key, timeout, self._now_ms())
        timeout_ms = 0 if armed["deadlineMs"] is None else armed["deadlineMs"] - armed["armedAtMs"]
        # What the engine delivered, if anything: an event emitted straight to the
        # engine may carry JSON null, which is still an event (not a timeout).
        engine_event: tuple[bool, Any] = (False, None)
        # Two turns at most: a stale engine wake-up is consumed by the first
        # await_event call, so the second one parks.
        for _ in range(3):
            output = await self._take_signal(boundary_id, event_key, timeout_ms, engine_event)
            if output is not None:
                return output
            deadline_ms = armed["deadlineMs"]
            if deadline_ms is not None and self._now_ms() >= deadline_ms:
                return await self._resolve_timeout(boundary_id, event_key, timeout_ms)
            # Not parked. Either the event exists already (its signal row committed
            # with it: the next turn reads the authoritative payload from the
            # store), or the engine took a stale wake-up for a timeout: only the
            # armed deadline decides that, and the next turn parks until it.
            engine_event = await self._park_for_event(boundary_id, event_key, armed)
        raise FatalRunError(
            f"wait {boundary_id!r} of run {self.run_id} neither parked nor resolved; "
            f"the engine and the store disagree about event {event_key!r}."
        )

    # -- envelope bookkeeping -------------------------------------------------

    def _now_ms(self) -> int:
        return self._h.clock.now_ms()

    # -- store and engine writes ---------------------------------------------

    async def _save(self, envelope: dict[str, Any]) -> None:
        await self._db.run(lambda conn: self._attempt.save_envelope(conn, envelope))
        self._envelope = envelope

    async def _take_signal(
        self, boundary_id: str, event_key: str, timeout_ms: int, engine_event: tuple[bool, Any]
    ) -> dict[str, Any] | None:
        """Resolve the wait from the store's signal row, if the signal has arrived.

        ``engine_event`` is ``(delivered, payload)`` as the engine answered, used
        only when an event was emitted without a signal row (not by
        ``LaneClient.signal``); its payload may be None (``emit_event`` without one).
        """
        delivered, engine_payload = engine_event

        async def take(conn: Connection) -> dict[str, Any] | None:
            found, payload = await self._attempt.consume_signal(conn, event_key)
            if not found:
                if not delivered:
                    return None
                self._log.warning("wait.event_without_signal_row", event_key=event_key)
                payload = engine_payload
            require_readable(payload, f"the payload of event {event_key!r}")
            output = checkpoint.integration_event_boundary_output(
                event_key=event_key,
                # Signal data that is not an object is offered under "value".
                signal_data=(
                    payload if payload is None or isinstance(payload, dict) else {"value": payload}
                ),
                timed_out=False,
            )
            envelope = waits.disarm(
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
            await self._attempt.save_envelope(conn, envelope)
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
        await self._save(waits.disarm(envelope, boundary_id))
        return output

    async def _park_for_event(
        self, boundary_id: str, event_key: str, armed: dict[str, Any]
    ) -> tuple[bool, Any]:
        """Park until the event or the armed deadline (raises ``Suspended``)."""
        wait = {
            "kind": "integration_event",
            "boundaryId": boundary_id,
            "eventKey": event_key,
            "deadlineMs": armed["deadlineMs"],
        }
        event_name = checkpoint.integration_event_name(self.run_id, event_key)
        return await self._park_on_event("event", boundary_id, event_name, armed, wait)

    async def _park_on_event(
        self,
        kind: Literal["event", "runner"],
        boundary_id: str,
        event_name: str,
        armed: dict[str, Any],
        wait: dict[str, Any],
    ) -> tuple[bool, Any]:
        """Park on engine event ``event_name`` until it comes or the armed deadline passes.

        Raises ``Suspended`` when parked. Returns ``(True, payload)`` when the event
        is already there (its payload may be None: JSON null) and ``(False, None)``
        when the engine believes the wait timed out.
        """
        deadline_ms = armed["deadlineMs"]
        remaining_s = waits.engine_timeout_s(deadline_ms, self._now_ms())
        envelope = waits.arm(self._envelope, boundary_id, armed)
        park = Park(kind, boundary_id, wait, envelope, event_name=event_name, timeout_s=remaining_s)
        parked = await self._attempt.end(park)
        if parked.suspended:
            self._envelope = envelope
            raise Suspended
        return parked.delivered, parked.payload

    # -- sandboxes ------------------------------------------------------------

    async def register_sandbox(self, sandbox_id: str) -> None:
        """Record a Daytona sandbox this run created: it is deleted once the run ends.

        Safe to call again on a resume (a sandbox is recorded once). When the run
        reaches a terminal state, a ``daytona-sandbox-cleanup`` task is spawned for it
        on the run's lane, in the transaction that ends the run.
        """
        if not isinstance(sandbox_id, str) or not sandbox_id.strip() or len(sandbox_id) > 255:
            raise ValueError(
                f"register_sandbox needs a sandbox id (1..255 characters), not {sandbox_id!r}"
            )
        run_id = self._h.run_id
        await self._db.run(
            lambda c: self._attempt.store.sandboxes.register(
                c, run_id=run_id, sandbox_id=sandbox_id
            )
        )

    # -- detached runners -----------------------------------------------------

    async def run_detached(
        self,
        name: str,
        launch: Callable[[DetachedRunner], Any],
        *,
        timeout: float,  # noqa: ASYNC109 (a durable deadline, the public play API)
    ) -> dict[str, Any]:
        """Start work elsewhere and wait durably for its report; return what it reported.

        As one step, ``launch(runner)`` starts the work, handing it ``runner.run_id``
        and ``runner.runner_attempt`` (numbered per run: 1, 2, 3 ... across all of its
        detached calls, so a relaunch gets the next number); whatever JSON it returns
        is kept. The run then parks until the runner reports
        (``LaneClient.report_runner_result``, ``lane-worker runner-result`` or the SQL
        function ``report_runner_result``) or ``timeout`` seconds pass. Returns
        ``{"runnerAttempt", "result", "timedOut", "launched"}``.
        """
        timeout_s = waits.runner_timeout_s(name, timeout)
        # A name used again is the next call, as a step name is the next step
        # (a loop that relaunches until a runner reports in time): its own launch
        # step and boundary. The first use keeps the keys it always had; later
        # ones cannot meet any first one (`runner#2:` is no `runner:` prefix).
        uses = self._detached_uses.get(name, 0) + 1
        self._detached_uses[name] = uses
        boundary_id = f"runner:{name}" if uses == 1 else f"runner#{uses}:{name}"
        launch_name = f"runner-launch:{name}"
        launch_key = waits.step_checkpoint_name(launch_name, uses, self._h.step_keys)
        resolved = waits.resolved_output(self._envelope, boundary_id, checkpoint.RUNNER_BOUNDARY)
        if resolved is not None:
            return resolved

        async def start() -> dict[str, Any]:
            number = await self._db.run(
                lambda c: self._attempt.store.attempts.begin_runner(
                    c, run_id=self._h.run_id, name=name
                )
            )
            said = launch(DetachedRunner(self.run_id, number))
            if inspect.isawaitable(said):
                said = await said
            return {"runnerAttempt": number, "launched": said}

        launched = await self._step_at(launch_key, launch_name, start)
        number = int(launched["runnerAttempt"])
        armed = waits.armed(self._envelope, self.run_id, boundary_id, checkpoint.RUNNER_BOUNDARY)
        if armed is None:
            armed = waits.runner_armed(number, timeout_s, self._now_ms())
        wait = {
            "kind": checkpoint.RUNNER_BOUNDARY,
            "boundaryId": boundary_id,
            "runnerAttempt": number,
            "deadlineMs": armed["deadlineMs"],
        }
        event_name = checkpoint.runner_terminal_event_name(self.run_id, number)
        engine_event: tuple[bool, Any] = (False, None)
        for _ in range(3):
            output = await self._take_runner(boundary_id, launched, engine_event, timed_out=False)
            if output is not None:
                return output
            if self._now_ms() >= armed["deadlineMs"]:
                output = await self._take_runner(
                    boundary_id, launched, (False, None), timed_out=True
                )
                assert output is not None  # at the deadline it always resolves
                return output
            engine_event = await self._park_on_event("runner", boundary_id, event_name, armed, wait)
        raise FatalRunError(
            f"runner wait {boundary_id!r} of run {self.run_id} neither parked nor resolved; "
            f"the engine and the store disagree about runner attempt {number}."
        )

    async def _take_runner(
        self,
        boundary_id: str,
        launched: dict[str, Any],
        engine_event: tuple[bool, Any],
        *,
        timed_out: bool,
    ) -> dict[str, Any] | None:
        """Resolve the runner wait from the stored report, or as timed out at the deadline."""
        number = int(launched["runnerAttempt"])
        delivered, engine_payload = engine_event
        attempts = self._attempt.store.attempts
        h = self._h

        async def take(conn: Connection) -> dict[str, Any] | None:
            if timed_out:
                reported, result = await attempts.time_out_runner(
                    conn, run_id=h.run_id, runner_attempt=number
                )
            else:
                reported, result = await attempts.take_runner_result(
                    conn, run_id=h.run_id, runner_attempt=number
                )
                if not reported and delivered:
                    # Emitted straight to the engine (a runner that does not report
                    # through lane-worker): its payload is the result.
                    self._log.warning("wait.runner_event_without_report", runner_attempt=number)
                    reported, result = True, engine_payload
                if not reported:
                    return None
            if reported:
                require_readable(result, f"the result of runner attempt {number}")
            output = {
                "runnerAttempt": number,
                "result": result if reported else None,
                "timedOut": not reported,
                "launched": launched.get("launched"),
            }
            now_ms = self._now_ms()
            with_output = checkpoint.checkpoint_with_runner(
                self._envelope, boundary_id, runner_attempt=number, output=output, now_ms=now_ms
            )
            envelope = waits.disarm(with_output, boundary_id)
            await self._attempt.save_envelope(conn, envelope)
            self._envelope = envelope
            return output

        return await self._db.transaction(take)


@dataclass(frozen=True)
class DetachedRunner:
    """What a detached call's ``launch`` receives: who the runner reports for."""

    run_id: str
    runner_attempt: int


PlayFn = Callable[[TaskContext, Any], Awaitable[Any]]
