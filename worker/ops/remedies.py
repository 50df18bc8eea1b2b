"""What an operator does about stranded work: list runs, fail one, retry one, move a lane's.

``Remedies`` is what ``LaneClient`` delegates to (``client.remedies``): every
remedy is one transaction per run, fenced on the run's row, so a worker that
takes the run at the same moment either finishes first (and the remedy sees it)
or finds the run gone. The four share their row locks and target checks, which
read best side by side; ``lanes prune`` (lane-level, no run locks) is ``prune.py``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from worker import lanes
from worker.db import engine
from worker.db.store import Store
from worker.db.store.rows import RunRow
from worker.errors import (
    InvalidRequestError,
    RetryRefusedError,
    RunNotFoundError,
    RunStillOpenError,
    UnknownLaneError,
)
from worker.jsonvalue import unreadable_in
from worker.ops.remedy_results import MoveReport as MoveReport  # what the remedies return
from worker.ops.remedy_results import RetriedRun as RetriedRun
from worker.ops.remedy_results import RunSummary as RunSummary
from worker.ops.retry_target import (
    RetryPlan,
    cannot_run,
    plan_retry,
    refuse_move_across,
    retry_target,
)
from worker.states import TERMINAL_STATUSES

if TYPE_CHECKING:
    from worker.db.pool import Connection, Database

OPERATOR_FAILED = "FailedByOperator"
MAX_REASON_CHARS = 2000
MAX_LIST = 10_000
# A signal or a retry follows at most this many `runs retry` links (a retry of a retry ...).
MAX_RETRY_HOPS = 100
STATUSES = ("queued", "running", "waiting", "retrying", "completed", "failed", "cancelled")
# A status filter beside the statuses: every run not finished (what the lanes page lists).
OPEN = "open"
STATUS_FILTERS = (*STATUSES, OPEN)


async def spawn_run_task(
    conn: Connection, store: Store, queue: str, run_id: uuid.UUID, max_attempts: int
) -> uuid.UUID:
    """Spawn the engine task of a run row written in this transaction; wake its lane."""
    return await store.runs.spawn_task(conn, run_id=run_id, queue=queue, max_attempts=max_attempts)


def parse_run_id(run_id: str) -> uuid.UUID:
    """Return ``run_id`` as a UUID, or raise ``RunNotFoundError``."""
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFoundError(f"no run {run_id!r}: a run id is a UUID") from None


class Remedies:
    """Operator remedies on one store: runs fail/retry, lanes move, the runs list.

    ``check_schemas`` refuses (run ``lane-worker migrate``) before anything is
    read from a database whose schemas are missing or old.
    """

    def __init__(
        self, db: Database, store: Store, check_schemas: Callable[[], Awaitable[None]]
    ) -> None:
        self.db = db
        self.store = store
        self.check_schemas = check_schemas

    async def _locked_run(self, conn: Connection, run_id: str) -> RunRow:
        row = await self.store.runs.get(conn, parse_run_id(run_id), lock="engine_first")
        if row is None:
            raise RunNotFoundError(f"no run {run_id} in store {self.store.schema}")
        return row

    async def runs(
        self,
        *,
        status: str | None = None,
        lane: str | None = None,
        play: str | None = None,
        limit: int = 50,
    ) -> list[RunSummary]:
        """List runs, newest first, filtered by status, lane (a release id) and play."""
        if status is not None and status not in STATUS_FILTERS:
            raise InvalidRequestError(
                f"status {status!r} is not one of {', '.join(STATUS_FILTERS)}."
            )
        if not 1 <= limit <= MAX_LIST:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_LIST}.")
        queue = lanes.queue_name_for_release(lane) if lane is not None else None
        await self.check_schemas()
        rows = await self.db.run(
            lambda c: self.store.runs.listed(c, status=status, lane=queue, play=play, limit=limit)
        )
        return [
            RunSummary(
                run_id=str(r.run_id),
                play=r.play,
                status=r.status,
                release_id=r.release_id,
                queue=r.queue,
                adopted_release_id=r.adopted_release_id,
                attempts=r.attempts,
                created_at=r.created_at,
                retry_of=str(r.retry_of) if r.retry_of else None,
            )
            for r in rows
        ]

    async def fail_run(self, run_id: str, reason: str) -> bool:
        """Fail a run for good with ``reason`` (one run.failed fact); False if it had ended.

        Its engine task is cancelled: an attempt running it finds out at its next
        engine call and writes nothing more.
        """
        reason = (reason or "").strip()
        if not reason or len(reason) > MAX_REASON_CHARS or "\x00" in reason:
            raise InvalidRequestError(
                f"a reason is non-blank text of at most {MAX_REASON_CHARS} characters."
            )
        error = {"name": OPERATOR_FAILED, "message": reason, "fatal": True}

        async def fail(conn: Connection) -> bool:
            row = await self._locked_run(conn, run_id)
            if row.status in TERMINAL_STATUSES:
                return False
            if row.task_id is not None:
                await engine.cancel(conn, row.queue, row.task_id)
            return await self.store.runs.settle(
                conn, row.run_id, status="failed", source="operator", attempt_id=None, error=error
            )

        await self.check_schemas()
        return await self.db.transaction(fail)

    async def retry_run(
        self,
        run_id: str,
        *,
        to_release: str | None = None,
        completed: bool = False,
        drop_unreadable_signals: bool = False,
        expect_queue: str | None = None,
    ) -> RetriedRun:
        """Submit a new run with the ended run's play and input, on a lane that can run it.

        The target is ``to_release``'s lane; else, for a run of a dev lane, that
        dev lane alone; else the newest claiming release lane (never a dev lane)
        with a live worker that registers the play (``retry_target.py``). With
        ``expect_queue`` (the page's preview) a retry that would now go to another
        lane is refused (``RetryRefusedError``), never sent there. The new run's
        ``retryOf`` names the old one, and it receives the events the old one had
        received. A run is retried at most once: a second call returns the first
        retry (``created`` false), whoever made it.
        Refused (``RunStillOpenError``) while the run has not ended, or while an
        attempt of it may still be executing; a completed run only with
        ``completed=True`` (``RetryRefusedError``): its work would run again.
        Refused too (``RetryRefusedError``, nothing written) when an event's payload
        cannot be read back: the retry would fail on it as the run did. With
        ``drop_unreadable_signals`` such events are left out instead (the retry
        waits for them again).
        """
        await self.check_schemas()
        new_id = uuid.uuid4()

        async def retry(conn: Connection) -> RetriedRun:
            # The row lock serialises retries of one run: the second sees the first.
            old = await self._locked_run(conn, run_id)
            if old.retried_by is not None:
                return await self._newest_retry(conn, old)
            if old.status not in TERMINAL_STATUSES:
                raise RunStillOpenError(
                    f"run {old.run_id} is {old.status}: fail it (lane-worker runs fail "
                    f"{old.run_id} --reason ...) or cancel it first, so it never runs twice."
                )
            if old.status == "completed" and not completed:
                raise RetryRefusedError(
                    f"run {old.run_id} completed: a retry would run its work again; add "
                    "--completed if that is what you want."
                )
            if await self._attempt_in_flight(conn, old):
                raise RunStillOpenError(
                    f"run {old.run_id} ended, but an attempt of it may still be executing a "
                    "step (it stops once that step body returns; one that never returns stops "
                    "when its worker does); retry once `lane-worker status` shows no attempt "
                    "in progress."
                )
            unreadable = unreadable_in("its input", old.input)
            if unreadable is not None:
                # Copied as it is, it would fail the retry the same way.
                raise RetryRefusedError(
                    f"run {old.run_id} cannot be retried: {unreadable}; submit a new run "
                    "with an input lane-worker can read."
                )
            dropped = await self._unreadable_signals(conn, old, drop=drop_unreadable_signals)
            release_id, queue = await retry_target(self.store, conn, old, to_release)
            if expect_queue is not None and queue != expect_queue:
                # The page's preview said where this retry goes: never somewhere else.
                raise RetryRefusedError(
                    f"run {old.run_id} was not retried: its retry would now go to lane "
                    f"{queue} (release {release_id}), not {expect_queue} as the preview "
                    "said; preview the action again."
                )
            launch = {
                **(old.launch or {}),
                "absurdReleaseId": release_id,
                "runId": str(new_id),
                "retryOf": str(old.run_id),
            }
            await self.store.runs.insert(
                conn,
                run_id=new_id,
                play=old.play,
                input=old.input,
                launch=launch,
                release_id=release_id,
                queue=queue,
                idempotency_key=None,
                max_attempts=old.max_attempts,
                retry_of=old.run_id,
            )
            await self.store.runs.mark_retried(conn, run_id=old.run_id, retry_id=new_id)
            # Its play waits for the same events again: an app that signalled the
            # old run must not have to signal again.
            await self.store.runs.copy_signals(
                conn, from_run=old.run_id, to_run=new_id, leave_out=dropped
            )
            # And the app hears how the retried work ends, where it heard of the run.
            await self.store.runs.copy_runtime_api(conn, from_run=old.run_id, to_run=new_id)
            await spawn_run_task(conn, self.store, queue, new_id, old.max_attempts)
            return RetriedRun(
                run_id=str(new_id),
                release_id=release_id,
                queue=queue,
                retry_of=str(old.run_id),
                dropped_signals=dropped,
            )

        return await self.db.transaction(retry)

    async def _unreadable_signals(
        self, conn: Connection, old: RunRow, *, drop: bool
    ) -> tuple[str, ...]:
        """Name the events of ``old`` whose payload cannot be read; refuse unless ``drop``.

        Copied, such a payload fails the retry on its first attempt, as it failed
        the run, and leaves the operator the same choice again on the retry.
        """
        payloads = await self.store.runs.long_signal_payloads(conn, run_id=old.run_id)
        found = [
            (key, unreadable_in(f"the payload of its event {key!r}", payload))
            for key, payload in payloads
        ]
        bad = [(key, said) for key, said in found if said is not None]
        if bad and not drop:
            more = f" (and {len(bad) - 1} more event(s) like it)" if len(bad) > 1 else ""
            raise RetryRefusedError(
                f"run {old.run_id} cannot be retried: {bad[0][1]}{more}, so the retry would "
                "fail on it too; add --drop-unreadable-signals to retry without such events "
                f"(the retry waits for them again: signal run {old.run_id} anew), or submit a "
                "new run."
            )
        return tuple(key for key, _ in bad)

    async def _newest_retry(self, conn: Connection, old: RunRow) -> RetriedRun:
        """The newest run of a retried run's chain (its retry may have been retried)."""
        again = old
        for _ in range(MAX_RETRY_HOPS):
            if again.retried_by is None:
                break
            newer = await self.store.runs.get(conn, again.retried_by)
            assert newer is not None  # runs are never deleted
            again = newer
        return RetriedRun(
            run_id=str(again.run_id),
            release_id=again.release_id,
            queue=again.queue,
            retry_of=str(again.retry_of),
            created=False,
            status=again.status,
        )

    async def _attempt_in_flight(self, conn: Connection, run: RunRow) -> bool:
        """Tell whether an attempt of ``run`` may still be executing a step.

        An attempt that began and recorded no end, on a worker whose heartbeat is
        live: that worker stops it at its next engine call (the fail or cancel
        cancelled the engine task) and then records its end. A dead worker's
        attempt never will, and runs nothing.
        """
        return await self.store.attempts.on_live_worker(conn, run_id=run.run_id)

    async def plan_retries(
        self, run_ids: list[uuid.UUID], to_release: str | None
    ) -> dict[uuid.UUID, RetryPlan]:
        """What retrying each run would do now (the page's preview); writes nothing."""
        await self.check_schemas()

        async def plan(conn: Connection) -> dict[uuid.UUID, RetryPlan]:
            plans: dict[uuid.UUID, RetryPlan] = {}
            # A target depends on the play and, for a dev lane's run, its lane: asked
            # once each, not once for each of up to 10,000 runs.
            targets: dict[tuple[str, str], RetryPlan] = {}
            for run_id in run_ids:
                row = await self.store.runs.get(conn, run_id)
                if row is None:  # runs are never deleted; a wrong id is not retried
                    plans[run_id] = RetryPlan(refused=f"no run {run_id}")
                    continue
                plan = await plan_retry(self.store, conn, row, to_release, targets)
                plans[run_id] = plan
            return plans

        return await self.db.run(plan)

    async def cancel_run(
        self, run_id: str, *, reason: str | None = None, source: str = "client"
    ) -> bool:
        """Cancel a run (the store's ``cancel_run_by``); False if it had ended.

        ``source``: ``client`` for the app's client, ``operator`` for the CLI and the page.
        """
        await self.check_schemas()
        run_uuid = parse_run_id(run_id)
        said = await self.db.run(
            lambda c: self.store.api.cancel(c, run_id=run_uuid, reason=reason, source=source)
        )
        return bool(said["cancelled"])

    async def move_lane(self, from_release: str, to_release: str) -> MoveReport:
        """Move the runs of ``from_release``'s lane that never started to ``to_release``'s.

        One transaction per run: a run that ever started (an attempt, a committed
        step) is refused, because its steps ran on the old release's code; the
        rest get a new engine task on the target lane and the target's stamp.
        The target must be a claiming lane, or the runs would be stranded again.
        """
        from_queue = lanes.queue_name_for_release(from_release)
        to_queue = lanes.queue_name_for_release(to_release)
        if from_queue == to_queue:
            raise InvalidRequestError(f"{from_release!r} and {to_release!r} name one lane.")
        await self.check_schemas()
        if not await self.db.run(lambda c: self.store.lanes.known(c, queue=from_queue)):
            raise UnknownLaneError(
                f"no lane has ever had release {from_release.strip()!r} (queue {from_queue}); "
                "check the id against `lane-worker lanes`.",
                known=(),
            )
        await self.db.run(
            lambda c: refuse_move_across(self.store, c, from_release, from_queue, to_release)
        )
        ids = await self.db.run(lambda c: self.store.runs.open_on_lane(c, queue=from_queue))
        return await self._move(ids, from_queue, to_release)

    async def move_runs(self, run_ids: list[uuid.UUID], to_release: str) -> MoveReport:
        """Move these runs, each from its lane, to ``to_release``'s (the page's bulk move).

        As ``move_lane``: one transaction per run, a run that started refused; one
        already on the target lane, or ended, is left as it is.
        """
        await self.check_schemas()
        return await self._move(run_ids, None, to_release)

    async def _move(
        self, ids: list[uuid.UUID], from_queue: str | None, to_release: str
    ) -> MoveReport:
        to_queue = lanes.queue_name_for_release(to_release)
        target = await self.db.run(lambda c: self.store.lanes.row(c, queue=to_queue))
        if target is None or target.status != "claiming":
            state = "not a registered lane" if target is None else "retired"
            raise InvalidRequestError(
                f"lane {to_queue} (release {to_release.strip()!r}) is {state}: move runs only "
                "to a lane that claims new runs."
            )
        stamp = target.release_id or to_release.strip()  # the target's id as deployed
        moved: list[str] = []
        refused: list[tuple[str, str]] = []
        for run_id in ids:
            move = functools.partial(
                self._move_one, run_id=run_id, from_queue=from_queue, to_queue=to_queue, stamp=stamp
            )
            why = await self.db.transaction(move)
            if why is None:
                moved.append(str(run_id))
            elif why:
                refused.append((str(run_id), why))
        return MoveReport(from_queue or "", to_queue, stamp, tuple(moved), tuple(refused))

    async def _move_one(
        self,
        conn: Connection,
        run_id: uuid.UUID,
        from_queue: str | None,
        to_queue: str,
        stamp: str,
    ) -> str | None:
        """Move one run; return None when moved, '' when it ended meanwhile, else why not.

        ``from_queue`` None: from whichever lane the run is on (the page's bulk move).
        """
        run = await self._locked_run(conn, str(run_id))
        if run.status in TERMINAL_STATUSES:
            return ""
        if from_queue is None:
            if to_queue in (run.queue, run.adopted_queue):
                return ""  # on the target lane already: nothing to move
            from_queue = run.queue
        if run.queue != from_queue and run.adopted_queue != from_queue:
            return ""  # moved elsewhere meanwhile (another `lanes move`): not ours now
        if run.queue != from_queue:
            return (
                f"{from_queue}'s release adopted it from {run.queue}: its steps ran on "
                "that release's code; fail it and retry it (lane-worker runs fail / runs retry)"
            )
        if (
            run.status != "queued"
            or run.current_attempt_id is not None
            or run.attempts
            or run.checkpoint
            or run.adopted_queue is not None
        ):
            return (
                f"it started on {run.release_id} ({run.status}, {run.attempts} "
                "attempt(s)): its steps ran on that release's code; fail it and retry it "
                "(lane-worker runs fail / runs retry)"
            )
        lane = await self.store.lanes.row(conn, queue=to_queue)
        why = await cannot_run(self.store, conn, lane, to_queue, run.play, run.release_id)
        if why:
            return why
        if run.task_id is not None:
            # A worker that claimed the old task finds the run moved and stops.
            await engine.cancel(conn, from_queue, run.task_id)
        await self.store.runs.move(conn, run_id=run_id, queue=to_queue, release_id=stamp)
        await spawn_run_task(conn, self.store, to_queue, run_id, run.max_attempts)
        return None
