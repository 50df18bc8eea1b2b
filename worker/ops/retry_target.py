"""Where a retry goes, and what a bulk retry would do to each run (the page's preview).

A run of a dev lane (a worktree's: release ``dev`` or ``dev-<suffix>``) is retried
on its own dev lane unless the operator names another dev lane (``--to``): a
worktree's run never reaches a release (issue 31 of the new user's walk: a bulk
retry sent worktree runs to the newest release). A release run's retry goes to the
newest claiming release lane, or the release ``--to`` names, never to a dev lane: a
lane any of whose registered spellings is dev (``lane_kinds``), nor a mixed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker import lane_kinds, lanes
from worker.db.store import Store
from worker.db.store.rows import LaneRow, RunRow
from worker.errors import InvalidRequestError, LaneWorkerError, NoClaimingLaneError
from worker.states import TERMINAL_STATUSES

if TYPE_CHECKING:
    from worker.db.pool import Connection


async def cannot_run(
    store: Store,
    conn: Connection,
    lane: LaneRow | None,
    queue: str,
    play: str,
    run_release_id: str | None = None,
) -> str:
    """Say why runs of ``play`` (stamped ``run_release_id``) put on lane ``queue`` would
    not run there, or ''."""
    if lane is None or lane.status != "claiming":
        state = "not a registered lane" if lane is None else "retired"
        return f"lane {queue} is {state}; runs go only to a lane that claims new runs"
    if run_release_id is not None:
        # Never across the boundary: a release's run to a worktree, or back.
        crossing = lane_kinds.target_refused(run_release_id, queue, lane.release_ids)
        if crossing:
            return crossing
    plays = await store.lanes.live_plays(conn, queue=queue)
    if play not in plays:
        return (
            f"no live worker of lane {queue} registers play {play!r} (its live workers "
            f"register: {', '.join(sorted(plays)) or 'none'})"
        )
    return ""


async def retry_target(
    store: Store, conn: Connection, old: RunRow, to_release: str | None
) -> tuple[str, str]:
    """The release id (as deployed) and queue a retry of ``old`` goes to; raise if none.

    ``to_release`` named: that lane, if it claims and a live worker registers the play.
    Else a dev lane's run: its own lane only. Else the newest claiming release lane
    with a live worker that registers the play (never a dev lane).
    """
    play = old.play
    if to_release is not None:
        queue = lanes.queue_name_for_release(to_release)
        lane = await store.lanes.row(conn, queue=queue)
        why = await cannot_run(store, conn, lane, queue, play, old.release_id)
        if why:
            raise InvalidRequestError(f"cannot retry on {to_release.strip()!r}: {why}.")
        assert lane is not None
        return lane.release_id or to_release.strip(), queue
    if lane_kinds.is_dev(old.release_id):
        lane = await store.lanes.row(conn, queue=old.queue)
        why = await cannot_run(store, conn, lane, old.queue, play, old.release_id)
        if why:
            raise NoClaimingLaneError(
                f"a run of dev lane {old.release_id!r} is retried on that lane only (a "
                f"worktree's run never goes to a release), and {why}; start that "
                "worktree's worker, or name another dev lane to retry it on with --to."
            )
        assert lane is not None
        return lane.release_id or old.release_id, old.queue
    for claiming in await store.lanes.claiming_for_play(conn, play=play):
        # Every spelling (as the store's lane_is_dev): a queue a worktree shares is dev.
        if not lane_kinds.lane_is_dev([claiming.release_id, *claiming.release_ids]):
            return claiming.release_id, claiming.queue
    raise NoClaimingLaneError(
        f"no claiming release has a live worker that registers play {play!r}, so nothing "
        "would run the retry; start one, or name a release with --to."
    )


async def refuse_move_across(
    store: Store, conn: Connection, from_release: str, from_queue: str, to_release: str
) -> None:
    """Refuse (``InvalidRequestError``) `lanes move` from a dev lane to a release lane, or back.

    A mixed source lane (a release and a worktree both registered it) is judged run
    by run (``lane_kinds.target_refused`` for each run's stamp), as is a target that
    is no lane yet.
    """
    to_queue = lanes.queue_name_for_release(to_release)
    source = await store.lanes.row(conn, queue=from_queue)
    target = await store.lanes.row(conn, queue=to_queue)
    from_ids = source.release_ids if source is not None else [from_release.strip()]
    if target is None or not from_ids or lane_kinds.is_mixed(from_ids):
        return
    why = lane_kinds.target_refused(from_ids[0], to_queue, target.release_ids)
    if not why:
        return
    if lane_kinds.lane_is_dev(from_ids):
        instead = "restart that worktree's worker, or cancel its runs (lane-worker cancel RUN_ID)"
    else:
        instead = "move them to another release's lane"
    raise InvalidRequestError(
        f"cannot move lane {from_queue}'s runs to {to_release.strip()!r}: {why}; {instead}."
    )


@dataclass(frozen=True)
class RetryPlan:
    """What retrying one run would do now: go to ``queue`` (``release_id``), or nothing.

    ``retried``: it was retried already (a second retry submits nothing); ``refused``:
    why it cannot be retried now. At most one of queue / retried / refused is set.
    """

    release_id: str | None = None
    queue: str | None = None
    retried: bool = False
    refused: str | None = None

    @property
    def would_retry(self) -> bool:
        """Tell whether a retry would submit a new run."""
        return self.queue is not None


async def plan_retry(
    store: Store,
    conn: Connection,
    old: RunRow,
    to_release: str | None,
    targets: dict[tuple[str, str], RetryPlan] | None = None,
) -> RetryPlan:
    """What ``runs retry`` (with ``--to to_release``) would do to ``old`` now; writes nothing.

    Only the target and the already-retried case are judged here; a retry can still
    be refused at the time it is made (an attempt in flight, an unreadable payload).
    ``targets`` keeps the targets found, by play and (a dev lane's run) lane, for
    the next run of a preview (``to_release`` is one for all of them).
    """
    if old.retried_by is not None:
        return RetryPlan(retried=True)
    if old.status not in TERMINAL_STATUSES:
        return RetryPlan(refused=f"it is {old.status}: only a run that ended is retried")
    key = (old.play, old.queue if lane_kinds.is_dev(old.release_id) and to_release is None else "")
    if targets is not None and key in targets:
        return targets[key]
    try:
        release_id, queue = await retry_target(store, conn, old, to_release)
        plan = RetryPlan(release_id=release_id, queue=queue)
    except LaneWorkerError as exc:
        plan = RetryPlan(refused=str(exc))
    if targets is not None:
        targets[key] = plan
    return plan
