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
from typing import Any, TypeVar

import anyio
import asyncpg
import structlog

from worker import checkpoint, engine, lanes
from worker.app import App
from worker.config import Tuning
from worker.context import STEP_KEYS_CURRENT, DbClock, RunHandle, Suspended, TaskContext
from worker.db import Connection, Database, is_transient
from worker.dburl import mask_secrets, url_secrets
from worker.deferral import Streak, count_deferral
from worker.errors import (
    FatalRunError,
    LaneMismatchError,
    LeaseLostError,
    RunCancelledError,
    UnknownBoundaryError,
    UnknownPlayError,
)
from worker.jsonvalue import require_json
from worker.metrics import Metrics
from worker.reconcile import cancelled_fact, reconcile_queue
from worker.store import Store, quote_ident

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


# A stored error message is for people; a multi-megabyte one only bloats rows.
MAX_ERROR_MESSAGE_CHARS = 8000


def _reason(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop the failure being recorded
        message = f"<{type(exc).__name__} whose message could not be read>"
    # jsonb refuses NUL characters, and UTF-8 lone surrogates (a file name decoded
    # with surrogateescape, say): escape both, so the failure can be stored.
    message = message.replace("\x00", "\\u0000")[:MAX_ERROR_MESSAGE_CHARS]
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"name": type(exc).__name__, "message": message}


def _really_cancelled() -> bool:
    """Tell whether this task is being cancelled (a drain), not handed a stray CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


# A claim given back after an unexpected error waits this long before it is due
# again: an error that repeats must not become a busy loop of claims.
ERROR_HAND_BACK_DELAY_S = 10.0


@dataclass
class _Claim:
    """What is known so far of one claim being handled; decides its give-back."""

    run_id: uuid.UUID | None = None
    attempt_id: int | None = None
    ended: bool = False


@dataclass(frozen=True)
class _Begun:
    """What ``begin_attempt`` returned."""

    attempt_id: int
    checkpoint: dict[str, Any] | None
    current_wait: dict[str, Any] | None
    step_keys: int | None
    clock: DbClock
    moved: bool = False  # `lanes move` gave the run another engine task: this claim is stale


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
        defer_alert_after_s: float = Tuning.defer_alert_after_s,
        defer_fail_after_s: float = 0.0,
    ) -> None:
        self.metrics = metrics
        self.defer_alert_after_s = defer_alert_after_s
        self.defer_fail_after_s = defer_fail_after_s
        self.db = db
        self.store = store
        self.app = app
        self.worker_base = worker_base
        self.release_id = release_id
        self.queue = lanes.queue_name_for_release(release_id)
        self.lease_s = lease_s
        # What the registry says, kept current by the supervisor: this release's
        # lane is retired (draining); other lanes that claim; and whether runs on
        # this lane's queue were adopted by another lane (the own loop skips them).
        self.draining = False
        self.claiming_queues: frozenset[str] = frozenset()
        self.foreign_adoptees = False
        self.plays = sorted(app.plays)
        # A play's error text may quote the database URL (a driver message):
        # stored errors are shown by `status`, so mask its passwords first.
        self.secrets = url_secrets(db.options.url)

    def worker_id_for(self, queue: str) -> str:
        """Return the engine worker id this worker claims ``queue`` with."""
        if lanes.loop_kind(queue, self.queue) == "own":
            return self.worker_base
        return lanes.continuation_worker_id(self.worker_base, queue)

    def claim_mode(self, queue: str) -> str | None:
        """Return how this worker claims ``queue`` now (None: the engine's own claim).

        A claiming release drains its own queue with the engine's claim (or,
        when another lane adopted runs there, one that skips those), adopts from
        retired queues and, on a lane that claims too, takes only its own
        adoptees; a retired (draining) one claims, on every queue, only what no
        other release may run.
        """
        if self.draining:
            return engine.CLAIM_DRAIN
        if lanes.loop_kind(queue, self.queue) == "own":
            return engine.CLAIM_OWN if self.foreign_adoptees else None
        return engine.CLAIM_MINE if queue in self.claiming_queues else engine.CLAIM_ADOPT

    async def claim(self, queue: str, qty: int) -> engine.ClaimBatch:
        """Claim up to ``qty`` runs from ``queue``; settle what an expired-lease sweep ended."""
        worker_id = self.worker_id_for(queue)
        mode = self.claim_mode(queue)
        batch = await self.db.run(
            lambda conn: engine.claim(
                conn,
                queue,
                worker_id,
                lease_s=self.lease_s,
                qty=qty,
                mode=mode,
                store_schema=self.store.schema,
                own_queue=self.queue,
                plays=self.plays,
            )
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

        Whatever ends this call early (a drain's cancel at any await, a database
        that stays away, a bug) the claim is given back without spending an
        attempt, unless it already ended (settled, parked or put back).

        Raises ``LaneMismatchError`` after handing the run back when this worker's
        own loop claimed a run of another lane (misconfiguration: stop that loop).
        ``on_refuse`` runs as soon as a refusal is decided, before the run is
        handed back, so the loop stops before it could claim the run again.
        """
        claim = _Claim()
        try:
            handled = await self._handle(claimed, claim, on_refuse)
        except BaseException as exc:
            if not claim.ended:
                await self._give_back_after(claimed, claim, exc)
            raise
        return handled

    async def _handle(
        self, claimed: engine.ClaimedRun, claim: _Claim, on_refuse: Callable[[], None] | None
    ) -> Handled:
        row = await self.db.run(lambda c: self.store.fetchrow(c, "lane_state", claimed.task_id))
        bound = log.bind(
            queue=claimed.queue, release_id=self.release_id, task_id=str(claimed.task_id)
        )
        if row is None:
            # An engine task without a launch row cannot be executed by anyone.
            await self.db.run(lambda c: engine.cancel(c, claimed.queue, claimed.task_id))
            claim.ended = True
            bound.error("run.orphan_cancelled", task_name=claimed.task_name)
            return Handled("own", "cancelled")
        run_id: uuid.UUID = row["run_id"]
        claim.run_id = run_id
        adopter: str | None = row["adopted_release_id"]
        effective = adopter or row["release_id"]
        bound = bound.bind(run_id=str(run_id), worker_id=self.worker_id_for(claimed.queue))
        own_loop = lanes.loop_kind(claimed.queue, self.queue) == "own"
        disposition: lanes.LaneDisposition
        if own_loop:
            try:
                # The stamped release: this queue is that release's lane.
                lanes.assert_release_lane_matches(str(run_id), row["release_id"], self.release_id)
                disposition = lanes.Own()
            except LaneMismatchError:
                await self._put_back(claimed, claim, "refuse", "refused", delay_s=0)
                bound.error("lane.guard_failed", run_release_id=row["release_id"])
                raise
        if (
            adopter is not None
            and row["adopted_queue"] != self.queue
            and (own_loop or row["adopter_claiming"])
        ):
            # Another lane adopted it and may still run it: newer code than the
            # stamped lane's ran it already, and a third release must not take it.
            # The claim statement skips such runs (an own loop that meets one
            # switches to the claim that does), so this is a race: give it back
            # to its adopter at once, quietly.
            if own_loop:
                self.foreign_adoptees = True
            bound.info("run.left_to_adopter", adopter_release_id=adopter)
            outcome = await self._put_back(
                claimed, claim, "defer", "deferred", delay_s=0,
                note={"reason": f"adopted by {adopter}"},
            )  # fmt: skip
            return Handled("defer", outcome)
        if not own_loop:
            disposition = lanes.resolve_lane_disposition(
                run_id=str(run_id),
                run_release_id=effective,
                worker_release_id=self.release_id,
                # The effective release's lane: an adopted run belongs to its adopter.
                lane_claiming=row["adopter_claiming"] if adopter else row["lane_claiming"],
                parked_in_adoptable_wait=row["status"] == "waiting"
                and (row["current_wait"] or {}).get("kind") in checkpoint.KNOWN_BOUNDARY_KINDS,
            )
        if (
            not own_loop
            and isinstance(disposition, lanes.Adopt | lanes.Own)
            and row["play"] not in self.app.plays
        ):
            # Running it would fail it for good here (UnknownPlayError), though its
            # own release, another machine of this one or a release that registers
            # the play can still run it. The claim skips such runs: this is a race.
            disposition = lanes.Defer(
                reason=f"play {row['play']!r} of run {run_id} (release {effective}) is not "
                f"registered in this app of release {self.release_id}, which cannot run it",
                delay_seconds=lanes.LANE_ADOPTION_DEFER_SECONDS,
            )
            if self.metrics is not None:
                self.metrics.incompatible_defers.inc()
        if isinstance(disposition, lanes.Defer):
            bound.info("run.deferred", delay_s=disposition.delay_seconds, reason=disposition.reason)
            outcome = await self._put_back(
                claimed, claim, "defer", "deferred", delay_s=disposition.delay_seconds,
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
            outcome = await self._put_back(claimed, claim, "refuse", "refused", delay_s=0)
            return Handled("refuse", outcome)
        adopted = disposition.adopted_release_id if isinstance(disposition, lanes.Adopt) else None
        begun = await self._begin(claimed, claim, run_id, disposition.kind)
        if adopted is not None:
            bound.info("run.adopted", from_release_id=adopted)
        handle = RunHandle(
            run_id=run_id,
            queue=claimed.queue,
            task_id=claimed.task_id,
            engine_run_id=claimed.run_id,
            attempt=claimed.attempt,
            attempt_id=begun.attempt_id,
            lease_s=self.lease_s,
            clock=begun.clock,
            step_keys=begun.step_keys,
        )
        if begun.moved:
            # Moved to another lane between the claim and the fence move: the old
            # engine task is cancelled and the run is the other lane's now.
            bound.info("run.moved_away")
            await self._finish(handle, "lease_lost", {"reason": "moved to another lane"})
            outcome = "lease_lost"
        elif begun.checkpoint is None:
            # Cancelled between the claim and the fence move: nothing left to run.
            outcome = await self._observe_cancel(handle, bound)
        else:
            outcome = await self._execute(handle, claimed, row, begun, bound)
        claim.ended = True
        return Handled(disposition.kind, outcome)

    async def _begin(
        self, claimed: engine.ClaimedRun, claim: _Claim, run_id: uuid.UUID, kind: str
    ) -> _Begun:
        """Record the claim; for own/adopt also move the fence and return the envelope."""

        async def begin(conn: Connection) -> tuple[asyncpg.Record | None, float]:
            # Read just before the statement is sent (a retry reads it again): the
            # database reads its clock later, so this clock runs at most a round
            # trip ahead, never behind.
            sent_s = time.monotonic()
            row = await self.store.fetchrow(
                conn,
                "begin_attempt",
                run_id,
                claimed.run_id,
                claimed.attempt,
                self.worker_id_for(claimed.queue),
                self.release_id,
                kind,
                self.release_id if kind == "adopt" else None,
                self.queue if kind == "adopt" else None,
                STEP_KEYS_CURRENT,
                claimed.task_id,
            )
            return row, sent_s

        row, sent_s = await self.db.run(begin)
        assert row is not None  # the insert always returns its row
        claim.attempt_id = row["attempt_id"]
        return _Begun(
            attempt_id=row["attempt_id"],
            checkpoint=row["checkpoint"],
            current_wait=row["current_wait"],
            step_keys=row["step_keys"],
            clock=DbClock(row["db_now_ms"], sent_s),
            moved=row["moved"],
        )

    async def _put_back(
        self,
        claimed: engine.ClaimedRun,
        claim: _Claim,
        kind: str,
        outcome: str,
        *,
        delay_s: float,
        note: dict[str, Any] | None = None,
    ) -> str:
        """Record the claim and reschedule the engine run; no attempt is spent.

        A deferral with a delay (not a race handed straight back) counts in the
        run's streak, which may fail it for good past LANE_WORKER_DEFER_FAIL_AFTER.
        """
        assert claim.run_id is not None
        run_id = claim.run_id
        attempt_id = (await self._begin(claimed, claim, run_id, kind)).attempt_id

        async def put_back(conn: Connection) -> Streak | None:
            streak = None
            if kind == "defer" and delay_s > 0:
                streak = await count_deferral(
                    conn, self.store, claimed, run_id,
                    alert_after_s=self.defer_alert_after_s, fail_after_s=self.defer_fail_after_s,
                )  # fmt: skip
                if streak.failed is not None:
                    await self.store.execute(
                        conn, "finish_attempt", attempt_id, "failed", streak.failed
                    )
                    return streak
            await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
            await self.store.execute(conn, "finish_attempt", attempt_id, outcome, note)
            if delay_s <= 0:  # due now: wake the lane's workers
                await notify(conn, claimed.queue, run_id)
            return streak

        streak = await self.db.transaction(put_back)
        claim.ended = True
        if streak is not None:
            self._report_streak(streak, claimed, run_id)
            if streak.failed is not None:
                return "failed"
        return outcome

    def _report_streak(self, streak: Streak, claimed: engine.ClaimedRun, run_id: uuid.UUID) -> None:
        queue = claimed.queue
        bound = log.bind(
            queue=queue, release_id=self.release_id, task_id=str(claimed.task_id),
            run_id=str(run_id), worker_id=self.worker_id_for(queue),
        )  # fmt: skip
        if streak.alert:
            bound.warning(
                "run.deferred_too_long", defer_count=streak.count, deferred_s=round(streak.age_s),
                remedy="no release that may run it takes it: see `lane-worker lanes show` for "
                "its lane's blockers",
            )  # fmt: skip
            if self.metrics is not None:
                self.metrics.long_deferrals.labels(queue=queue).inc()
        if streak.failed is not None:
            bound.error("run.failed_for_good", error=streak.failed)

    async def give_back(
        self, claimed: engine.ClaimedRun, attempt_id: int | None, *, delay_s: float = 0.0
    ) -> bool:
        """Give an unfinished claim back, due in ``delay_s``: no attempt spent; say if it was.

        Fenced by the claim's attempt row: when the attempt already ended (the
        run parked, completed, failed or was put back, and the caller did not
        hear of it), nothing changes. A claim with no attempt row yet (it ended
        before recording one) is given back by its engine lease alone.
        """
        worker_id = self.worker_id_for(claimed.queue)

        async def give(conn: Connection) -> bool:
            # The engine row first: the same lock order as every other final write.
            held = await engine.lock_if_held(conn, claimed.queue, claimed.run_id, worker_id)
            closed = await self.store.fetch(
                conn, "hand_back_claim", claimed.task_id, claimed.run_id, worker_id,
                "handed_back" if held else "lease_lost",
            )  # fmt: skip
            if attempt_id is not None and attempt_id not in {r["attempt_id"] for r in closed}:
                return False
            if held:
                await engine.schedule_in(conn, claimed.queue, claimed.run_id, delay_s)
                if delay_s <= 0:
                    await notify(conn, claimed.queue, claimed.task_id)
            return held

        given: bool = await self.db.transaction(give)
        return given

    async def give_back_leftovers(self, queues: list[str]) -> int:
        """Give back every engine run this worker still holds on ``queues``; return how many.

        Called once claiming and handling have stopped: a claim that committed
        while its loop was being cancelled never reached a handler, and would
        otherwise wait for its lease to expire (spending an attempt).
        """
        given = 0
        for queue in queues:
            worker_id = self.worker_id_for(queue)
            rows = await self.db.fetch(
                f"select run_id, task_id, attempt from absurd.{quote_ident('r_' + queue)}"
                " where state = 'running' and claimed_by = $1",
                worker_id,
            )
            for row in rows:
                claimed = engine.ClaimedRun(
                    queue=queue,
                    run_id=row["run_id"],
                    task_id=row["task_id"],
                    attempt=row["attempt"],
                    task_name=PLAY_RUN_TASK,
                    params=None,
                    max_attempts=None,
                    wake_event=None,
                    event_payload=None,
                )
                if await self.give_back(claimed, None):
                    given += 1
                    log.warning(
                        "run.handed_back",
                        queue=queue,
                        release_id=self.release_id,
                        task_id=str(row["task_id"]),
                        worker_id=worker_id,
                        attempt=row["attempt"],
                        cause="left over at shutdown",
                    )
        return given

    async def _give_back_after(
        self, claimed: engine.ClaimedRun, claim: _Claim, exc: BaseException
    ) -> None:
        """Give the claim back after ``exc`` cut its handling short (shielded, bounded)."""
        bound = log.bind(
            queue=claimed.queue,
            release_id=self.release_id,
            task_id=str(claimed.task_id),
            run_id=str(claim.run_id) if claim.run_id else None,
            worker_id=self.worker_id_for(claimed.queue),
        )
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class()) and _really_cancelled()
        delay_s = 0.0 if cancelled else ERROR_HAND_BACK_DELAY_S
        with anyio.move_on_after(HAND_BACK_TIMEOUT_S, shield=True) as scope:
            try:
                given = await self.give_back(claimed, claim.attempt_id, delay_s=delay_s)
            except Exception as failure:
                bound.warning("run.hand_back_failed", error=repr(failure), lease_s=self.lease_s)
                return
        if scope.cancelled_caught:  # the database is away: the lease expiry takes over
            bound.warning("run.hand_back_timed_out", lease_s=self.lease_s)
        elif given:
            bound.info(
                "run.handed_back",
                attempt=claimed.attempt,
                cause=type(exc).__name__,
                due_in_s=delay_s,
            )

    async def _execute(
        self,
        h: RunHandle,
        claimed: engine.ClaimedRun,
        run: asyncpg.Record,
        begun: _Begun,
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
            wait_kind = (begun.current_wait or {}).get("kind")
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
                envelope=begun.checkpoint or {},
                checkpoints=checkpoints,
                log=bound,
            )
            bound.info("run.started", attempt=h.attempt, play=run["play"])
            started = time.monotonic()
            output = await self._with_lease(h, play(ctx, run["input"]), bound)
            require_json(output, f"the output of play {run['play']!r}")
        except Suspended:
            bound.info("run.parked", wait=ctx.envelope.get("armedWaits"))
            return "parked"
        except BaseExceptionGroup as group:
            # A play that waits inside a task group: its park committed, whatever
            # else the group carries (a sibling step cannot write after it).
            if group.subgroup(Suspended) is not None:
                bound.info("run.parked", wait=ctx.envelope.get("armedWaits"))
                return "parked"
            if _really_cancelled():
                raise  # shutdown: `handle` gives the run back
            return await self._fail_attempt(h, claimed.max_attempts, group, bound)
        except anyio.get_cancelled_exc_class() as exc:
            if _really_cancelled():
                raise  # shutdown: `handle` gives the run back
            # The play raised CancelledError itself (it awaited a task it cancelled).
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        except RunCancelledError:
            return await self._observe_cancel(h, bound)
        except LeaseLostError as exc:
            bound.warning("run.lease_lost", detail=str(exc))
            await self._finish(h, "lease_lost", _reason(exc))
            return "lease_lost"
        except (FatalRunError, UnknownBoundaryError) as exc:
            return await self._fail_for_good(h, exc, bound)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the play's, not ours
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
        try:
            await self._complete(h, output)
        except LeaseLostError as exc:
            bound.warning("run.lease_lost", detail=str(exc))
            return "lease_lost"
        except (asyncpg.PostgresError, ValueError) as exc:  # jsonb refused the output
            if is_transient(exc):
                raise
            return await self._fail_attempt(h, claimed.max_attempts, exc, bound)
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

    def _reason(self, exc: BaseException) -> dict[str, Any]:
        reason = _reason(exc)
        reason["message"] = mask_secrets(reason["message"], self.secrets)
        return reason

    async def _fail_attempt(
        self,
        h: RunHandle,
        max_attempts: int | None,
        exc: BaseException,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> str:
        reason = self._reason(exc)
        final = max_attempts is not None and h.attempt >= max_attempts
        outcome = "failed" if final else "retrying"
        fact = checkpoint.terminal_ledger_event(
            {"status": "failed", "runId": str(h.run_id), "output": None, "error": reason}
        )
        assert fact is not None

        async def fail(conn: Connection) -> None:
            await engine.fail(conn, h.queue, h.engine_run_id, reason)
            if (
                await self.store.fetchval(conn, "lock_running_attempt", h.run_id, h.attempt_id)
                is None
            ):
                raise LeaseLostError(
                    "the run parked or was taken by a newer claim", engine_run_id=h.engine_run_id
                )
            if final:
                await self.store.settle(
                    conn, h.run_id, status="failed", fact=fact, attempt_id=h.attempt_id,
                    error=reason,
                )  # fmt: skip
            else:
                await self.store.fetchval(conn, "retrying_run", h.run_id, h.attempt_id, reason)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, outcome, reason)

        try:
            try:
                await self.db.transaction(fail)
            except (asyncpg.PostgresError, ValueError) as unstorable:
                if is_transient(unstorable):
                    raise
                # The error itself cannot be stored: record that instead, so the
                # attempt still fails rather than coming back for ever.
                reason = {
                    "name": type(exc).__name__,
                    "message": f"(the error's details could not be stored: {unstorable!r})"[
                        :MAX_ERROR_MESSAGE_CHARS
                    ],
                }
                fact["error"] = reason
                await self.db.transaction(fail)
        except LeaseLostError as lost:
            bound.warning("run.lease_lost", detail=str(lost))
            await self._finish(h, "lease_lost", _reason(lost))
            return "lease_lost"
        event = "run.failed" if final else "run.attempt_failed"
        bound.warning(event, attempt=h.attempt, max_attempts=max_attempts, error=reason)
        return outcome

    async def _fail_for_good(
        self, h: RunHandle, exc: Exception, bound: structlog.typing.FilteringBoundLogger
    ) -> str:
        reason = {**self._reason(exc), "fatal": True}
        fact = checkpoint.terminal_ledger_event(
            {"status": "failed", "runId": str(h.run_id), "output": None, "error": reason}
        )
        assert fact is not None

        async def fail(conn: Connection) -> None:
            # The fenced store write first: a stale attempt must not cancel the
            # task that a newer claim now owns.
            if not await self.store.settle(
                conn, h.run_id, status="failed", fact=fact, attempt_id=h.attempt_id, error=reason
            ):
                raise LeaseLostError(
                    "run settled or taken by a newer claim", engine_run_id=h.engine_run_id
                )
            await engine.cancel(conn, h.queue, h.task_id)
            await self.store.execute(conn, "finish_attempt", h.attempt_id, "failed", reason)

        try:
            await self.db.transaction(fail)
        except LeaseLostError as lost:
            bound.warning("run.lease_lost", detail=str(lost))
            await self._finish(h, "lease_lost", _reason(lost))
            return "lease_lost"
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
