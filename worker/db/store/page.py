"""Store queries of the operator page: its audit trail of bulk actions (migration 0031)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from worker.db.pool import Connection
from worker.db.store.base import Queries
from worker.db.store.rows import DeploymentEvent


@dataclass(frozen=True)
class PageAction:
    """One bulk action of the operator page: who, when, what, on how many runs."""

    action_id: int
    at: datetime
    who: str
    remote: str | None
    action: str
    filter: dict[str, Any]
    target: str | None
    count_seen: int
    matched: int | None
    acted: int
    unchanged: int
    refused: int
    refusals: list[dict[str, Any]]
    finished_at: datetime | None
    worker_id: str | None


@dataclass(frozen=True)
class Tally:
    """What a bulk action has done so far: runs acted on, left unchanged, refused."""

    acted: int = 0
    unchanged: int = 0
    refused: int = 0
    refusals: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class TimelineRelease:
    """A release as the deploy timeline shows it: its deploy record, its lane, its machines."""

    release_id: str
    queue: str
    role: str | None  # current, previous, retired; None: never deployed through the registry
    image: str | None
    desired: int | None
    deployed_at: datetime | None
    deployed_by: str | None
    retired_at: datetime | None
    retired_by: str | None
    lane_status: str | None  # claiming, retired; None: no worker registered it yet
    registered_at: datetime | None
    lane_retired_at: datetime | None
    pruned_at: datetime | None
    machines: list[str]
    boot_failed: dict[str, Any] | None = None  # the scaler's record (0047): it cannot boot


class PageQueries(Queries):
    """``page_actions``: the page's audit trail."""

    FILE = "page.sql"

    async def start_action(
        self,
        conn: Connection,
        *,
        who: str,
        remote: str | None,
        action: str,
        filter: dict[str, Any],
        target: str | None,
        count_seen: int,
        matched: int,
        worker_id: str,
    ) -> int:
        """Record an action as it starts; return its id."""
        said: int = await self._value(
            conn,
            "start_page_action",
            who,
            remote,
            action,
            filter,
            target,
            count_seen,
            matched,
            worker_id,
        )
        return said

    async def record(
        self, conn: Connection, action_id: int, tally: Tally, *, finished: bool
    ) -> None:
        """Record what the action has done so far (and, once ``finished``, that it ended)."""
        name = "finish_page_action" if finished else "progress_page_action"
        await self._run(
            conn,
            name,
            action_id,
            tally.acted,
            tally.unchanged,
            tally.refused,
            list(tally.refusals),
        )

    async def actions(self, conn: Connection, *, limit: int) -> list[PageAction]:
        """The newest ``limit`` actions, newest first."""
        return [PageAction(**dict(r)) for r in await self._records(conn, "page_actions", limit)]

    async def timeline(
        self, conn: Connection, *, releases: int, events: int
    ) -> tuple[list[TimelineRelease], list[DeploymentEvent]]:
        """The newest ``releases`` releases and the newest ``events`` registry events."""
        rows = [
            TimelineRelease(**dict(r))
            for r in await self._records(conn, "timeline_releases", releases)
        ]
        return rows, await self._rows(conn, DeploymentEvent, "timeline_events", events)
