"""The operator's calls of ``LaneClient``: lanes, their report, and the remedies.

``lanes retire/activate``, the drain report (``lanes``, ``lanes show``) and what an
operator does about stranded work (``runs``, ``runs fail/retry``, ``lanes
move/prune``: ``worker/ops``). The app's calls (submit, signal, cancel, status)
are ``LaneClient``'s own.
"""

from __future__ import annotations

from worker import lane_kinds, lanes
from worker.config import settings
from worker.db import engine
from worker.db.pool import Connection, Database
from worker.db.store import Store
from worker.db.tasks import LANES_CHANNEL
from worker.errors import InvalidRequestError, UnknownLaneError
from worker.ops.lane_view import BUCKETS, LaneView
from worker.ops.prune import LanePruning
from worker.ops.remedies import Remedies
from worker.ops.remedy_results import MoveReport, RetriedRun, RunSummary
from worker.ops.report import read_report


class OperatorCalls:
    """The operator's half of ``LaneClient`` (a mixin: the client holds its state)."""

    db: Database
    store: Store
    remedies: Remedies
    pruning: LanePruning

    async def check_schemas(self) -> None:
        """Refuse when the schemas are missing or old (``LaneClient`` checks them)."""
        raise NotImplementedError

    async def retire_release(self, release_id: str, *, force: bool = False) -> str:
        """Mark a release's lane retired; its parked runs become adoptable. Return its queue.

        A release no lane has ever had raises ``UnknownLaneError`` (a typo, usually)
        unless ``force`` is true, which creates the lane and its queue.
        """
        return await self._set_lane(release_id, "retired", force=force)

    async def activate_release(self, release_id: str, *, force: bool = False) -> str:
        """Mark a retired lane claiming again (its workers may boot). Return its queue."""
        return await self._set_lane(release_id, "claiming", force=force)

    async def lane_known(self, release_id: str) -> bool:
        """Tell whether the release's lane was ever used: a worker booted or a run went there."""
        queue = _queue_for_operator(release_id)
        await self.check_schemas()
        return await self.db.run(lambda c: self.store.lanes.known(c, queue=queue))

    async def lane_release_id(self, release_id: str) -> str:
        """Return the release id as deployed of the lane any spelling of ``release_id`` names
        (the registry's, else what its workers registered); the id as given, trimmed, when
        no lane row names it."""
        queue = _queue_for_operator(release_id)
        await self.check_schemas()
        row = await self.db.run(lambda c: self.store.lanes.row(c, queue=queue))
        return (row.release_id if row is not None else None) or release_id.strip()

    async def _set_lane(self, release_id: str, status: str, *, force: bool) -> str:
        queue = _queue_for_operator(release_id)
        await self.check_schemas()

        async def set_status(conn: Connection) -> None:
            if not force and not await self.store.lanes.known(conn, queue=queue):
                names = tuple(await self.store.lanes.names(conn))
                listed = ", ".join(names[:_KNOWN_SHOWN]) or "none yet"
                more = f" and {len(names) - _KNOWN_SHOWN} more" if len(names) > _KNOWN_SHOWN else ""
                raise UnknownLaneError(
                    f"no lane has ever had release {release_id.strip()!r} (queue {queue}); known "
                    f"lanes: {listed}{more}. Check the id, or pass --force to create it anyway.",
                    known=names,
                )
            # The lane row first: every claim of the lane's workers share-locks it
            # before it touches an engine table (claim_v1.sql), so the status change
            # waits for the claims in flight and holds back the next ones. Creating
            # the queue first (its index checks share-lock the queue's tables, which
            # such a claim writes) would deadlock with a claim between the two.
            done = await self.store.lanes.set_status(
                conn, queue=queue, status=status, release_id=release_id.strip()
            )
            if done is None:
                # A release id and a worktree suffix name one queue: never mix the two.
                verb = "retire" if status == "retired" else "activate"
                rid = release_id.strip()
                held = await self.store.lanes.spellings(conn, queue=queue)
                raise InvalidRequestError(
                    f"cannot {verb} {rid!r}: {lane_kinds.crossing(queue, rid, held)}; "
                    f"{lane_kinds.remedy(rid)}."
                )
            # A lane row without its engine queue would break every maintenance pass
            # that reconciles it, so the registry only ever names queues that exist
            # (one transaction: never one without the other).
            await engine.ensure_queue(conn, queue, record=self.store.lanes.record_created_queue)
            # Running workers re-read the lane registry at once.
            await conn.execute("select pg_notify($1, $2)", LANES_CHANNEL, queue)

        await self.db.transaction(set_status)
        return queue

    # -- operator remedies (worker/ops/remedies.py, worker/ops/prune.py) ---------------

    async def runs(
        self,
        *,
        status: str | None = None,
        lane: str | None = None,
        play: str | None = None,
        limit: int = 50,
    ) -> list[RunSummary]:
        """List runs newest first (``lane-worker runs``); each filter applies when given."""
        return await self.remedies.runs(status=status, lane=lane, play=play, limit=limit)

    async def fail_run(self, run_id: str, reason: str) -> bool:
        """Fail an open run for good (``runs fail``); False when it had ended already."""
        return await self.remedies.fail_run(run_id, reason)

    async def retry_run(
        self,
        run_id: str,
        *,
        to_release: str | None = None,
        completed: bool = False,
        drop_unreadable_signals: bool = False,
    ) -> RetriedRun:
        """Retry an ended run as a new run (``runs retry``); at most one retry per run.

        ``drop_unreadable_signals``: leave out the events whose payload cannot be
        read back (else the retry is refused).
        """
        return await self.remedies.retry_run(
            run_id,
            to_release=to_release,
            completed=completed,
            drop_unreadable_signals=drop_unreadable_signals,
        )

    async def move_lane(self, from_release: str, to_release: str) -> MoveReport:
        """Move the never-started runs of a lane to a claiming one (``lanes move``)."""
        return await self.remedies.move_lane(from_release, to_release)

    async def prune_lanes(self, older_than_s: float, *, dry_run: bool = False) -> list[str]:
        """Drop the engine queues of long-drained lanes (``lanes prune``); return them."""
        return await self.pruning.prune_lanes(older_than_s, dry_run=dry_run)

    async def prune_kept_busy(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps because their queue holds an unfinished task."""
        return await self.pruning.prune_kept_busy(older_than_s)

    async def prune_kept_foreign(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps because their queue holds another system's task."""
        return await self.pruning.prune_kept_foreign(older_than_s)

    async def prune_kept_not_ours(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps: lane-worker has no record of their queue."""
        return await self.pruning.prune_kept_not_ours(older_than_s)

    async def prune_kept_live(self, older_than_s: float) -> list[str]:
        """Name the lanes ``prune_lanes`` keeps only because a worker of theirs is live."""
        return await self.pruning.prune_kept_live(older_than_s)

    async def lanes(self, *, include_pruned: bool = False) -> list[LaneView]:
        """Return the drain report: every lane, its workers, its open runs, its verdict.

        Pruned lanes no open run names are left out unless ``include_pruned``.
        """
        await self.check_schemas()
        return await self.db.run(
            lambda c: read_report(c, self.store, include_pruned=include_pruned)
        )

    async def lane(self, release_id: str) -> LaneView:
        """Return one lane's report, by any spelling of its release id (``UnknownLaneError``).

        A pruned lane is found too: retired, drained, safe to stop, ``pruned``.
        """
        queue = _queue_for_operator(release_id)
        views = await self.lanes(include_pruned=True)
        for view in views:
            if view.queue == queue:
                return view
        if await self.db.run(lambda c: self.store.lanes.known(c, queue=queue)):
            # Its engine queue exists (runs were submitted there) but no machine of
            # it ever registered and none of its runs is open: nothing is left for
            # it to run (`lanes move` took them, or they ended).
            return LaneView(
                release_id=release_id.strip(),
                queue=queue,
                status="drained",
                live_workers=0,
                queued=0,
                running=0,
                waiting=0,
                adoptable=0,
                counts={**dict.fromkeys(BUCKETS, 0), "deferred": 0},
            )
        names = ", ".join(v.release_id for v in views[:_KNOWN_SHOWN]) or "none yet"
        raise UnknownLaneError(
            f"no lane has release {release_id.strip()!r} (queue {queue}); known lanes: {names}.",
            known=tuple(v.release_id for v in views),
        )


_KNOWN_SHOWN = 20


def _queue_for_operator(release_id: str) -> str:
    """Return the queue of a release id an operator typed, refusing one that names no lane."""
    problem = settings.release_id_problem(release_id) if isinstance(release_id, str) else "no str"
    if problem is not None:
        raise InvalidRequestError(f"{problem}.")
    return lanes.queue_name_for_release(release_id)
