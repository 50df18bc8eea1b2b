"""Executing claimed runs: plays, lane dispositions, completion, failure, reconciliation.

``Runtime.handle`` takes one claimed engine run from start to its next durable
point: decide the lane disposition, record the attempt, then execute the play
(own / adopt) or put the run back without spending an attempt (defer /
refuse). Every engine transition commits in one transaction with the store
writes that go with it, fenced by the attempt row.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import anyio
import asyncpg
import structlog

from worker import checkpoint, engine, lanes
from worker.app import App
from worker.context import RunHandle, Suspended, TaskContext
from worker.db import Connection, Database
from worker.errors import (
    FatalRunError,
    LaneMismatchError,
    LeaseLostError,
    RunCancelledError,
    UnknownBoundaryError,
    UnknownPlayError,
)
from worker.metrics import Metrics
from worker.reconcile import cancelled_fact, reconcile_queue
from worker.store import Store

log = structlog.get_logger("lane_worker.runtime")

PLAY_RUN_TASK = "play-run"
# Always a delay > 0, so every retry is a `sleeping` run that passes the
# continuation fence (and is deferred there, never adopted).
HAND_BACK_TIMEOUT_S = 10.0
RETRY_STRATEGY: dict[str, Any] = {
    "kind": "exponential",
    "base_seconds": 1,
    "factor": 2,
    "max_seconds": 300,
}
T = TypeVar("T")


def notify_channel(queue: str) -> str:
    """Return the NOTIFY channel a queue's workers listen on."""
    return f"lane_worker_{queue}"


async def notify(conn: Connection, queue: str, run_id: uuid.UUID | str) -> None:
    """Wake the workers of ``queue`` (delivered when the transaction commits)."""
    await conn.execute("select pg_notify($1, $2)", notify_channel(queue), str(run_id))


def _reason(exc: BaseException) -> dict[str, Any]:
    return {"name": type(exc).__name__, "message": str(exc)}


@dataclass(frozen=True)
class Handled:
    """What one claim came to: the lane disposition and the attempt's outcome."""

    disposition: str
    outcome: str


class Runtime:
    """Executes claimed runs for one worker of one release."""

    def __init__(
        self,
        db: Database,
        store: Store,
        app: App,
        *,
        worker_base: str,
        release_id: str,
        lease_s: int,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.db = db
        self.store = store
        self.app = app
        self.worker_base = worker_base
        self.release_id = release_id
        self.queue = lanes.queue_name_for_release(release_id)
        self.lease_s = lease_s

    def worker_id_for(self, queue: str) -> str:
        """Return the engine worker id this worker claims ``queue`` with."""
        if queue == self.queue:
            return self.worker_base
        return lanes.continuation_worker_id(self.worker_base, queue)

    async def claim(self, queue: str, qty: int) -> engine.ClaimBatch:
        """Claim up to ``qty`` runs from ``queue``; settle what an expired-lease sweep ended."""
        worker_id = self.worker_id_for(queue)
        batch = await self.db.run(
            lambda conn: engine.claim(conn, queue, worker_id, lease_s=self.lease_s, qty=qty)
        )
        if batch.swept:
            # One batch inline, so the claimed runs start promptly; maintenance settles
            # the rest. A failure here must not abandon the runs just claimed.
            try:
                await reconcile_queue(
                    self.db, self.store, queue, worker_id=worker_id, max_batches=1
                )
            except Exception as exc:
                log.warning("reconcile.failed", queue=queue, worker_id=worker_id, error=repr(exc))
        return batch

    async def handle(
        self, claimed: engine.ClaimedRun, *, on_refuse: Callable[[], None] | None = None
    ) -> Handled:
        """Decide what to do with one claimed run and do it; return the disposition and outcome.

        Raises ``LaneMismatchError`` after handing the run back when this worker's
        own loop claimed a run of another lane (misconfiguration: stop that loop).
        ``on_refuse`` runs as soon as a refusal is decided, before the run is
        handed back, so the loop stops before it could claim the run again.
        """
        row = await self.db.run(lambda c: self.store.fetchrow(c, "lane_state", claimed.task_id))
        bound = log.bind(
            queue=claimed.queue, release_id=self.release_id, task_id=str(claimed.task_id)
        )
        if row is None:
            # An engine task without a launch row cannot be executed by anyone.
            await self.db.run(lambda c: engine.cancel(c, claimed.queue, claimed.task_id))
            bound.error("run.orphan_cancelled", task_name=claimed.task_name)
            return Handled("own", "cancelled")
        run_id: uuid.UUID = row["run_id"]
        effective = row["adopted_release_id"] or row["release_id"]
        bound = bound.bind(run_id=str(run_id), worker_id=self.worker_id_for(claimed.queue))
        own_loop = claimed.queue == self.queue
        disposition: lanes.LaneDisposition
        if own_loop:
            try:
                # The stamped release: this queue is that release's lane.
                lanes.assert_release_lane_matches(str(run_id), row["release_id"], self.release_id)
                disposition = lanes.Own()
            except LaneMismatchError:
                await self._put_back(claimed, run_id, "refuse", "refused", delay_s=0)
                bound.error("lane.guard_failed", run_release_id=row["release_id"])
                raise
        else:
            disposition = lanes.resolve_lane_disposition(
                run_id=str(run_id),
                run_release_id=effective,
                worker_release_id=self.release_id,
                lane_claiming=row["lane_claiming"],
                parked_in_adoptable_wait=row["status"] == "waiting"
                and (row["current_wait"] or {}).get("kind") in checkpoint.KNOWN_BOUNDARY_KINDS,
            )
        if isinstance(disposition, lanes.Defer):
            bound.info("run.deferred", delay_s=disposition.delay_seconds)
            outcome = await self._put_back(
                claimed, run_id, "defer", "deferred", delay_s=disposition.delay_seconds,
                note={"reason": disposition.reason},
            )  # fmt: skip
            return Handled("defer", outcome)
        if isinstance(disposition, lanes.Refuse):
            if on_refuse is not None:
                on_refuse()
            bound.error(
                "lane.refused",
                run_release_id=effective,
                remedy=f"this lane still claims; let a worker of {effective!r} take it, or run "
                f"`lane-worker lanes retire {effective}` if that release is gone",
            )
            return Handled(
                "refuse", await self._put_back(claimed, run_id, "refuse", "refused", delay_s=0)
            )
        adopted = disposition.adopted_release_id if isinstance(disposition, lanes.Adopt) else None
        begun = await self._begin(claimed, run_id, disposition.kind, self.release_id)
        attempt_id: int = begun["attempt_id"]
        if adopted is not None:
            bound.info("run.adopted", from_release_id=adopted)
        handle = RunHandle(
            run_id=run_id,
            queue=claimed.queue,
            task_id=claimed.task_id,
            engine_run_id=claimed.run_id,
            attempt=claimed.attempt,
            attempt_id=attempt_id,
            lease_s=self.lease_s,
        )
        if begun["checkpoint"] is None:
            # Cancelled between the claim and the fence move: nothing left to run.
            return Handled(disposition.kind, await self._observe_cancel(handle, bound))
        return Handled(disposition.kind, await self._execute(handle, claimed, row, begun, bound))

    async def _begin(
        self, claimed: engine.ClaimedRun, run_id: uuid.UUID, kind: str, adopter: str | None
    ) -> asyncpg.Record:
        """Record the claim; for own/adopt also move the fence and return the envelope."""
        begun: asyncpg.Record | None = await self.db.run(
            lambda c: self.store.fetchrow(
                c,
                "begin_attempt",
                run_id,
                claimed.run_id,
                claimed.attempt,
                self.worker_id_for(claimed.queue),
                self.release_id,
                kind,
                adopter,
            )
        )
        assert begun is not None  # the insert always returns its row
        return begun

    async def _put_back(
        self,
        claimed: engine.ClaimedRun,
        run_id: uuid.UUID,
        kind: str,
        outcome: str,
        *,
        delay_s: float,
        note: dict[str, Any] | None = None,
    ) -> str:
        """Record the claim and reschedule the engine run; no attempt is spent."""
        attempt_id = (await self._begin(claimed, run_id, kind, None))["attempt_id"]
        wake_at = datetime.now(UTC) + timedelta(seconds=delay_s)

        async def put_back(conn: Connection) -> None:
            await engine.schedule(conn, claimed.queue, claimed.run_id, wake_at)
            await self.store.execute(conn, "finish_attempt", attempt_id, outcome, note)
            if delay_s <= 0:  # due now: wake the lane's own workers
                await notify(conn, claimed.queue, run_id)

        await self.db.transaction(put_back)
        return outcome

    async def hand_back(self, handle: RunHandle) -> None:
        """Give an unfinished run back at once (shutdown): no attempt spent, fenced."""

        async def give_back(conn: Connection) -> None:
            await engine.schedule(conn, handle.queue, handle.engine_run_id, datetime.now(UTC))
            await self.store.fetchval(conn, "release_run", handle.run_id, handle.attempt_id)
            await self.store.execute(conn, "finish_attempt", handle.attempt_id, "handed_back", None)
            await notify(conn, handle.queue, handle.run_id)

        await self.db.transaction(give_back)

    async def _execute(
        self,
        h: RunHandle,
        claimed: engine.ClaimedRun,
        run: asyncpg.Record,
        begun: asyncpg.Record,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> str:
        """Run the play of ``run`` (``lane_state``) from the envelope ``begun`` returned."""
        play = self.app.plays.get(run["play"])
        try:
            if play is None:
                known = ", ".join(sorted(self.app.plays)) or "none"
                raise UnknownPlayError(
                    f"play {run['play']!r} is not registered in release {self.release_id} "
                    f"(it has: {known}); the run cannot be executed here."
                )
            wait_kind = (begun["current_wait"] or {}).get("kind")
            if wait_kind is not None and wait_kind not in checkpoint.KNOWN_BOUNDARY_KINDS:
                raise FatalRunError(
                    f"run {h.run_id} is parked in a {wait_kind!r} wait, which release "
                    f"{self.release_id} cannot resume."
                )
            checkpoints = await self.db.run(
                lambda c: engine.get_checkpoints(c, h.queue, h.task_id, h.engine_run_id)
            )
            ctx = TaskContext(
                db=self.db,
                store=self.store,
                handle=h,
                release_id=self.release_id,
                envelope=begun["checkpoint"],
                checkpoints=checkpoints,
                log=bound,
            )
            bound.info("run.started", attempt=h.attempt, play=run["play"])
            started = time.monotonic()
            output = await self._with_lease(h, play(ctx, run["input"]), bound)
        except Suspended:
            bound.info("run.parked", wait=ctx.envelope.get("armedWaits"))
            return "parked"
        except anyio.get_cancelled_exc_class():
            # Shutdown: the play is unwound; give the run back for another worker,
            # shielded so the hand-back itself is not cancelled.
            with anyio.move_on_after(HAND_BACK_TIMEOUT_S, shield=True) as scope:
                await self.hand_back(h)
                bound.info("run.handed_back", attempt=h.attempt)
            if scope.cancelled_caught:  # the database is away: the lease expiry takes over
                bound.warning("run.hand_back_timed_out", lease_s=h.lease_s)
            raise
        except RunCancelledError:
            return await self._observe_cancel(h, bound)
        except LeaseLostError as exc:
            bound.warning("run.lease_lost", detail=str(exc))
            await self._finish(h, "lease_lost", _reason(exc))
            return "lease_lost"
        except (FatalRunError, UnknownBoundaryError) as exc:
            return await self._fail_for_good(h, exc, bound)
        except Exception as exc:
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        try:
            await self._complete(h, output)
        except TypeError as exc:  # the output is not JSON
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        except LeaseLostError as exc:
            bound.warning("run.lease_lost", detail=str(exc))
            return "lease_lost"
        bound.info("run.completed", duration_s=round(time.monotonic() - started, 3))
        return "completed"

    async def _with_lease(
        self, h: RunHandle, work: Awaitable[T], bound: structlog.typing.FilteringBoundLogger
    ) -> T:
        """Run ``work`` while extending the lease; cancel it if the lease is lost."""
        host = asyncio.current_task()
        assert host is not None
        lost: list[LeaseLostError] = []

        async def keep() -> None:
            while True:
                await asyncio.sleep(max(1.0, h.lease_s / 3))
                try:
                    await self.db.run(
                        lambda c: engine.extend_claim(c, h.queue, h.engine_run_id, h.lease_s)
                    )
                    if self.metrics is not None:
                        self.metrics.lease_extensions.inc()
                except LeaseLostError as exc:
                    lost.append(exc)
                    host.cancel()
                    return
                except Exception as exc:  # the database is away: keep trying while the lease lasts
                    bound.warning("lease.extend_failed", error=repr(exc))

        keeper = asyncio.create_task(keep())
        try:
            return await work
        except asyncio.CancelledError:
            if lost:
                host.uncancel()
                raise lost[0] from None
            raise
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _finish(self, h: RunHandle, outcome: str, error: Any) -> None:
        await self.db.run(
            lambda c: self.store.execute(c, "finish_attempt", h.attempt_id, outcome, error)
        )

    async def _complete(self, h: RunHandle, output: Any) -> None:
        fact = checkpoint.terminal_ledger_event(
            {"status": "completed", "runId": str(h.run_id), "output": output, "error": None}
        )
        assert fact is not None

        async def complete(conn: Connection) -> None:
            await engine.complete(conn, h.queue, h.engine_run_id, output)
            if not await self.store.settle(
                conn, h.run_id, status="completed", fact=fact, attempt_id=h.attempt_id,
                output=output,
            ):  # fmt: skip
                raise LeaseLostError("run settled by a newer claim", engine_run_id=h.engine_run_id)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "completed", None)

        await self.db.transaction(complete)

    async def _fail_attempt(
        self,
        h: RunHandle,
        max_attempts: int | None,
        exc: Exception,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> str:
        reason = _reason(exc)
        final = max_attempts is not None and h.attempt >= max_attempts
        outcome = "failed" if final else "retrying"
        fact = checkpoint.terminal_ledger_event(
            {"status": "failed", "runId": str(h.run_id), "output": None, "error": reason}
        )
        assert fact is not None

        async def fail(conn: Connection) -> None:
            await engine.fail(conn, h.queue, h.engine_run_id, reason)
            if final:
                await self.store.settle(
                    conn, h.run_id, status="failed", fact=fact, attempt_id=h.attempt_id,
                    error=reason,
                )  # fmt: skip
            else:
                await self.store.fetchval(conn, "retrying_run", h.run_id, h.attempt_id, reason)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, outcome, reason)

        try:
            await self.db.transaction(fail)
        except LeaseLostError as lost:
            bound.warning("run.lease_lost", detail=str(lost))
            return "lease_lost"
        event = "run.failed" if final else "run.attempt_failed"
        bound.warning(event, attempt=h.attempt, max_attempts=max_attempts, error=reason)
        return outcome

    async def _fail_for_good(
        self, h: RunHandle, exc: Exception, bound: structlog.typing.FilteringBoundLogger
    ) -> str:
        reason = {**_reason(exc), "fatal": True}
        fact = checkpoint.terminal_ledger_event(
            {"status": "failed", "runId": str(h.run_id), "output": None, "error": reason}
        )
        assert fact is not None

        async def fail(conn: Connection) -> None:
            await engine.cancel(conn, h.queue, h.task_id)
            await self.store.settle(
                conn, h.run_id, status="failed", fact=fact, attempt_id=h.attempt_id, error=reason
            )
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "failed", reason)

        await self.db.transaction(fail)
        bound.error("run.failed_for_good", error=reason)
        return "failed"

    async def _observe_cancel(
        self, h: RunHandle, bound: structlog.typing.FilteringBoundLogger
    ) -> str:
        async def settle(conn: Connection) -> None:
            await self.store.settle(
                conn, h.run_id, status="cancelled", fact=cancelled_fact(h.run_id, "worker"),
                attempt_id=None,
            )  # fmt: skip
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "cancelled", None)

        await self.db.transaction(settle)
        bound.info("run.cancelled")
        return "cancelled"
