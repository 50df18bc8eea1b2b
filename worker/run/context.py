"""What a play sees while it runs: ``ctx.step``, ``ctx.sleep``, ``ctx.wait_for_event``,
``ctx.run_detached`` and ``ctx.register_sandbox``.

Steps are engine checkpoints (``step:<name>``): once committed they are never
executed again, only replayed. Sleeps and event waits park the engine run
durably; the checkpoint envelope in the store records when each wait was armed
(its wake time or deadline, under ``armedWaits``) and, once over, how it
resolved (``resolvedBoundaries``), so a resumed run replays to the same point
and a timeout is measured from when the wait was armed, not from a reclaim.

(About 510 lines: ``TaskContext`` is the play API, one class; each kind of wait
is a few methods over the same envelope bookkeeping and the same park, which a
split would have to share through private attributes.)
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from worker import checkpoint
from worker.db import engine
from worker.db.pool import Connection
from worker.errors import SHOWN_CHARS, FatalRunError, PlayValueError
from worker.jsonvalue import require_json, require_readable
from worker.run.attempt import Attempt
from worker.run.handle import STEP_KEYS_LEGACY
from worker.run.threads import run_in_daemon_thread
from worker.run.transition import Park

_log = structlog.get_logger("lane_worker.runtime")

ARMED_WAITS = "armedWaits"  # our envelope key; unknown to other builds, so kept by them
# The engine counts a wait's timeout in int32 seconds: a longer one failed every
# attempt without parking. Longer durations are clamped to it (about 68 years).
MAX_WAIT_S = 2**31 - 1


class Suspended(BaseException):
    """Raised through the play when its run parked in a durable wait.

    A BaseException so that a play's ``except Exception`` cannot swallow it.
    """


def _seconds(value: Any) -> float:
    """Return ``value`` as a float of seconds (NaN when it is no number, inf past a double)."""
    seconds = math.nan
    if not isinstance(value, bool | str | bytes):  # float() would read "5" and True
        try:
            seconds = float(value)  # numpy's and Decimal's numbers too
        except OverflowError:  # an int past a double: as long (or short) as a wait can be
            seconds = math.inf if value > 0 else -math.inf
        except (TypeError, ValueError):
            pass
    return seconds


def _duration_s(value: Any, what: str) -> float:
    """Return ``value`` as seconds within [0, MAX_WAIT_S] (below 0 is 0).

    A value that is no number (NaN, a string, None) fails the run for good
    (``PlayValueError``): every attempt would compute it again.
    """
    seconds = _seconds(value)
    if math.isnan(seconds):
        raise PlayValueError(
            f"{what} needs a number of seconds, not {_shown(value)}; the run fails for good"
            " (a retry would compute the same value)"
        )
    return min(max(seconds, 0.0), float(MAX_WAIT_S))


def _shown(value: Any) -> str:
    """Return ``repr(value)``, cut to 100 characters (a 400-digit int stays readable)."""
    try:
        text = repr(value)
    except ValueError:  # an int past the interpreter's digit limit for str()
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def step_checkpoint_name(name: str, occurrence: int, step_keys: int | None) -> str:
    """Return the engine checkpoint of the ``occurrence``-th use (from 1) of step ``name``.

    One-to-one: every '#' in the name is doubled, and a lone '#' starts the
    occurrence number, so ``a#2`` (once) and ``a`` (twice) cannot meet. Names
    without '#' keep the keys they always had.
    """
    key = name if step_keys is STEP_KEYS_LEGACY else name.replace("#", "##")
    return f"step:{key}" if occurrence == 1 else f"step:{key}#{occurrence}"


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
        return await self._step_at(step_checkpoint_name(name, uses, self._h.step_keys), name, fn)

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
        delay_ms = round(_duration_s(seconds, "sleep") * 1000)
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
        resolved = self._resolved_output(boundary_id)
        if resolved is not None:
            return resolved
        self._check_key_unused(boundary_id, event_key)
        armed = self._armed(boundary_id, checkpoint.INTEGRATION_EVENT_BOUNDARY)
        if armed is None:
            now_ms = self._now_ms()
            deadline = (
                None
                if timeout is None
                else now_ms + round(_duration_s(timeout, "wait_for_event's timeout") * 1000)
            )
            armed = {
                "kind": "integration_event",
                "eventKey": event_key,
                "deadlineMs": deadline,
                "armedAtMs": now_ms,
            }
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

    def _resolved_output(
        self, boundary_id: str, kind: str = checkpoint.INTEGRATION_EVENT_BOUNDARY
    ) -> dict[str, Any] | None:
        if not checkpoint.boundary_resolved(self._envelope, boundary_id):
            return None
        entry = self._envelope["resolvedBoundaries"][boundary_id]
        if entry.get("kind") != kind:
            raise FatalRunError(
                f"boundary {boundary_id!r} was resolved as a {entry.get('kind')!r}, but the play "
                f"now waits for a {kind!r} there; boundary ids must not change meaning."
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
        await self._save(self._disarm(envelope, boundary_id))
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
        # The engine's timeout is whole seconds from now: round up, never below 1,
        # so the run is not woken before the armed deadline.
        remaining_s = (
            None
            if deadline_ms is None
            else min(MAX_WAIT_S, max(1, math.ceil((deadline_ms - self._now_ms()) / 1000)))
        )
        envelope = self._arm(boundary_id, armed)
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
        if not isinstance(name, str) or not name.strip():
            raise PlayValueError(
                "run_detached needs a name (a non-blank string); the run fails for good"
            )
        # Any number above 0 (inf and an int past a double wait as long as the engine
        # counts, as 1e300 does); NaN, 0 or below, or no number fails the run for good.
        if not _seconds(timeout) > 0:
            raise PlayValueError(
                f"run_detached needs a timeout in seconds above 0, not {_shown(timeout)};"
                " the run fails for good (a retry would compute the same value)"
            )
        timeout_s = _duration_s(timeout, "run_detached's timeout")
        # A name used again is the next call, as a step name is the next step
        # (a loop that relaunches until a runner reports in time): its own launch
        # step and boundary. The first use keeps the keys it always had; later
        # ones cannot meet any first one (`runner#2:` is no `runner:` prefix).
        uses = self._detached_uses.get(name, 0) + 1
        self._detached_uses[name] = uses
        boundary_id = f"runner:{name}" if uses == 1 else f"runner#{uses}:{name}"
        launch_name = f"runner-launch:{name}"
        launch_key = step_checkpoint_name(launch_name, uses, self._h.step_keys)
        resolved = self._resolved_output(boundary_id, checkpoint.RUNNER_BOUNDARY)
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
        armed = self._armed(boundary_id, checkpoint.RUNNER_BOUNDARY)
        if armed is None:
            now_ms = self._now_ms()
            armed = {
                "kind": checkpoint.RUNNER_BOUNDARY,
                "runnerAttempt": number,
                "deadlineMs": now_ms + max(1, round(timeout_s * 1000)),
                "armedAtMs": now_ms,
            }
        wait = {"kind": checkpoint.RUNNER_BOUNDARY, "boundaryId": boundary_id,
                "runnerAttempt": number, "deadlineMs": armed["deadlineMs"]}  # fmt: skip
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
            envelope = self._disarm(
                checkpoint.checkpoint_with_runner(
                    self._envelope, boundary_id, runner_attempt=number, output=output,
                    now_ms=self._now_ms(),
                ),
                boundary_id,
            )  # fmt: skip
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
