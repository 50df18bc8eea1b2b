"""The operator page's bulk actions: retry, cancel or move every run matching a filter.

Two POSTs. The first (``/actions/preview``) counts the runs matching the filter
among those created by now (``asOf``), at most ``MAX_BULK``, and asks to
confirm that count. A retry's preview says where each run's retry goes, per
target release ("3 runs -> rel-b, 2 runs -> dev-wt"), counts only the runs that
would get a new retry, and names those retried already (a second retry submits
nothing) or that cannot be retried now; the action then retries only the runs
the preview said it would, each on the lane it named, and refuses a run whose
target changed meanwhile rather than send it elsewhere. The second
(``/actions/run``) carries the filter, ``asOf``, the preview's id and the count
the operator saw: the runs are counted again, and the action is refused when
more match now than were confirmed (runs that entered the filter meanwhile,
such as runs that failed since, were not seen); fewer is fine (runs that
ended or moved meanwhile are simply no longer acted on). Runs created
after ``asOf`` are never touched. Then each run goes through the same remedy as
the CLI (``worker/ops/remedies.py``: one transaction per run, fenced on its
row), and the action is audited in ``page_actions`` (who, when, the filter, how
many were seen, acted on, left unchanged and refused, with the first reasons).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog

from worker.db.pool import Connection, Database
from worker.db.store import Store
from worker.db.store.page import Tally
from worker.errors import InvalidRequestError, LaneWorkerError
from worker.ops.remedies import Remedies
from worker.ops.retry_target import RetryPlan
from worker.ops.run_list import RunFilter

ACTIONS = ("retry", "cancel", "move")
# The first refusals kept in the audit row (each with its reason).
KEPT_REFUSALS = 20
REASON_CHARS = 300
# The audit row is brought up to date after this many runs.
PROGRESS_EVERY = 50

log = structlog.get_logger("lane_worker.page")


# How long a preview's runs are kept for its confirmation, and how many previews at most.
PREVIEW_TTL_S = 900.0
MAX_PREVIEWS = 200


# Each run a preview counted, with what it said a retry of the run would do.
Plans = Mapping[uuid.UUID, RetryPlan | None]


class Previews:
    """The runs each preview counted, under a random id: a confirmation acts on those alone.

    A count alone let a run that entered the filter after the preview be acted on when
    another left it (same count): the confirmation now names its preview, and only runs
    the preview counted that still match are acted on. Kept in this process (the health
    port's); a restart forgets them and the operator previews again.
    """

    def __init__(self) -> None:
        self._held: OrderedDict[str, tuple[float, str, Bulk, Plans]] = OrderedDict()

    def keep(self, sid: str, bulk: Bulk, plans: Plans) -> str:
        """Remember the runs a preview of ``bulk`` by session ``sid`` counted, each with
        what it said a retry of the run would do (None for other actions); return its id."""
        now = time.monotonic()
        self._expire(now)
        key = secrets.token_urlsafe(18)
        self._held[key] = (now, sid, bulk, dict(plans))
        while len(self._held) > MAX_PREVIEWS:
            self._held.popitem(last=False)
        return key

    def runs(self, key: str, sid: str, bulk: Bulk) -> Plans | None:
        """The runs preview ``key`` of session ``sid`` counted for ``bulk``; None when
        unknown, expired, or previewed for another action, filter or target release
        (a confirmation does what its preview showed, or nothing)."""
        self._expire(time.monotonic())
        held = self._held.get(key)
        if held is None or held[1] != sid or held[2] != bulk:
            return None
        return held[3]

    def _expire(self, now: float) -> None:
        while self._held and now - next(iter(self._held.values()))[0] > PREVIEW_TTL_S:
            self._held.popitem(last=False)


@dataclass(frozen=True)
class Bulk:
    """An action on every run a filter matches; ``to`` is the target release of a move,
    or the release a retry is asked to go to (``runs retry --to``; else each run's own
    target, as the CLI picks it)."""

    action: str
    filter: RunFilter
    to: str | None = None

    @classmethod
    def from_form(cls, form: Mapping[str, str]) -> Bulk:
        """Read the action from a form; one sentence when it cannot be done as asked."""
        action = (form.get("action") or "").strip()
        if action not in ACTIONS:
            raise InvalidRequestError(f"action is one of {', '.join(ACTIONS)}.")
        flt = RunFilter.from_query(form)
        to = (form.get("to") or "").strip() or None
        if action == "retry" and flt.status not in ("failed", "cancelled"):
            raise InvalidRequestError(
                "retry acts on runs that ended: filter by status failed or cancelled first."
            )
        if action == "move":
            if flt.status != "queued":
                raise InvalidRequestError(
                    "move acts on runs that never started: filter by status queued first."
                )
            if to is None:
                raise InvalidRequestError("move needs the release to move the runs to (to).")
        if (
            action in ("move", "retry")
            and to is not None
            and (len(to) > 200 or not to.isprintable())
        ):
            raise InvalidRequestError(
                "to is a release id: printable text of at most 200 characters."
            )
        return cls(action, flt, to if action in ("move", "retry") else None)

    def describe(self, count: int) -> str:
        """The action in words: ``cancel 12 runs matching status waiting``."""
        to = f" to release {self.to}" if self.to else ""
        return f"{self.action} {count} run(s){to} matching {self.filter.describe()}"


@dataclass(frozen=True)
class RetryGroups:
    """A retry preview in words: how many runs go to each target, and those that do not."""

    targets: tuple[tuple[str, str, int], ...]  # (release id, queue, runs), most runs first
    retried: int  # retried already: a second retry submits nothing
    refused: tuple[tuple[str, int], ...]  # (why not, runs)

    @classmethod
    def of(cls, plans: Plans) -> RetryGroups:
        """Group what a preview said about each run."""
        targets: Counter[tuple[str, str]] = Counter()
        refused: Counter[str] = Counter()
        retried = 0
        for plan in plans.values():
            if plan is None:
                continue
            if plan.queue is not None:
                targets[(plan.release_id or "", plan.queue)] += 1
            elif plan.retried:
                retried += 1
            else:
                refused[plan.refused or "it cannot be retried now"] += 1
        return cls(
            tuple((release, queue, n) for (release, queue), n in targets.most_common()),
            retried,
            tuple(refused.most_common()),
        )

    @property
    def count(self) -> int:
        """The runs that would get a new retry."""
        return sum(n for _, _, n in self.targets)

    def describe(self) -> str:
        """``3 run(s) -> rel-b, 2 run(s) -> dev-wt``."""
        return ", ".join(f"{n} run(s) -> {release}" for release, _, n in self.targets)


def to_retry(plans: Plans, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """The runs of ``ids`` a retry preview said would get a new retry (only those are)."""
    return [i for i in ids if (plan := plans.get(i)) is not None and plan.would_retry]


def parse_as_of(raw: str | None) -> datetime:
    """The moment the preview counted (runs created after it are never acted on)."""
    try:
        when = datetime.fromisoformat((raw or "").strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidRequestError("asOf is the preview's time: post the confirmation form again.")
    return when


def parse_count(raw: str | None) -> int:
    """The count the operator confirmed."""
    text = (raw or "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise InvalidRequestError("seen is the count the preview showed.")
    return int(text)


OneRun = Callable[[uuid.UUID], Awaitable[Tally]]


def _one_run(remedies: Remedies, bulk: Bulk, who: str, action_id: int, plans: Plans) -> OneRun:
    """What the action does to one run, through the CLI's remedy, as a tally of one."""
    if bulk.action == "cancel":
        reason = f"cancelled from the operator page by {who} (action {action_id})"

        async def cancel(run_id: uuid.UUID) -> Tally:
            done = await remedies.cancel_run(str(run_id), reason=reason, source="operator")
            return Tally(acted=1) if done else Tally(unchanged=1)

        return cancel
    if bulk.action == "retry":

        async def retry(run_id: uuid.UUID) -> Tally:
            plan = plans.get(run_id)
            if plan is None or plan.queue is None:  # the preview said no retry: none is made
                return Tally(unchanged=1)
            # Where the preview said, or refused (``expect_queue``): never elsewhere.
            said = await remedies.retry_run(
                str(run_id), to_release=bulk.to, expect_queue=plan.queue
            )
            return Tally(acted=1) if said.created else Tally(unchanged=1)

        return retry
    assert bulk.to is not None
    to = bulk.to

    async def move(run_id: uuid.UUID) -> Tally:
        said = await remedies.move_runs([run_id], to)
        if said.refused:
            return _refused(run_id, said.refused[0][1])
        return Tally(acted=1) if said.moved else Tally(unchanged=1)

    return move


def _refused(run_id: uuid.UUID | None, reason: str) -> Tally:
    said = {"runId": None if run_id is None else str(run_id), "reason": reason[:REASON_CHARS]}
    return Tally(refused=1, refusals=(said,))


async def _progress(store: Store, action_id: int, tally: Tally, conn: Connection) -> None:
    await store.page.record(conn, action_id, tally, finished=False)


def _add(total: Tally, one: Tally) -> Tally:
    kept = (total.refusals + one.refusals)[:KEPT_REFUSALS]
    return Tally(
        total.acted + one.acted, total.unchanged + one.unchanged, total.refused + one.refused, kept
    )


async def perform(
    db: Database,
    store: Store,
    remedies: Remedies,
    bulk: Bulk,
    run_ids: list[uuid.UUID],
    *,
    who: str,
    action_id: int,
    plans: Plans | None = None,
) -> Tally:
    """Act on each run through its remedy; keep the audit row up to date; return the tally.

    A remedy's refusal (a run still open for a retry, a target that cannot run
    it, a retry whose target is no longer the one ``plans`` (the preview) named)
    is counted with its reason and the action goes on. Anything else (the
    database away) ends it: the row is finished with that as its last refusal.
    """
    one_run = _one_run(remedies, bulk, who, action_id, plans or {})
    tally = Tally()
    try:
        for n, run_id in enumerate(run_ids, start=1):
            try:
                one = await one_run(run_id)
            except LaneWorkerError as exc:
                one = _refused(run_id, str(exc))
            tally = _add(tally, one)
            if n % PROGRESS_EVERY == 0:
                await db.run(functools.partial(_progress, store, action_id, tally))
    except Exception as exc:
        log.warning("page.action_stopped", action_id=action_id, error=type(exc).__name__)
        done = tally.acted + tally.unchanged + tally.refused
        stopped = {"runId": None, "reason": f"stopped after {done} run(s): {type(exc).__name__}"}
        tally = replace(tally, refusals=(*tally.refusals, stopped))
    try:
        await db.run(lambda c: store.page.record(c, action_id, tally, finished=True))
    except Exception as exc:  # the database is away: the row stays unfinished, as documented
        log.warning("page.action_unrecorded", action_id=action_id, error=type(exc).__name__)
    log.info(
        "page.action_done",
        action_id=action_id,
        action=bulk.action,
        who=who,
        acted=tally.acted,
        unchanged=tally.unchanged,
        refused=tally.refused,
    )
    return tally


class Running:
    """The bulk actions in progress in this process: stopped when the health port stops."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, work: Awaitable[Any]) -> None:
        """Run ``work`` in the background (a page's answer does not wait for it)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel the actions in progress (their audit rows stay unfinished)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
