"""The operator page's run list: a filter over the runs table, paged newest first by keyset.

A filter (status, play, release, queue, age, error text) becomes indexed
predicates on ``runs``: each page reads ``created_at desc, run_id desc`` from
where the last one stopped (``before``), never an offset, so page 1,000 of a
million runs costs what page 1 does. Only the predicates given are in the
statement (no ``$1 is null or ...``), so each shape plans on its own indexes;
``tests/integration/test_page_run_list.py`` holds the plan guard (no query of
it reads the whole runs table on a store of a million runs), and the reader
runs it under the report's statement timeout. Bulk actions read the same
filter: counted (at most ``MAX_BULK`` + 1), then the matching ids.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from worker import lanes
from worker.db.pool import Connection
from worker.errors import InvalidRequestError, LaneConfigError
from worker.ops.remedies import STATUS_FILTERS
from worker.states import TERMINAL_STATUSES

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
# A bulk action acts on at most this many runs; a filter matching more is refused.
MAX_BULK = 10_000
MAX_TEXT = 200
_AGE = re.compile(r"([0-9]{1,7})\s*(s|m|min|h|d)")
_AGE_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_COLUMNS = (
    "r.run_id, r.play, r.status, r.release_id, r.queue, r.adopted_release_id, r.attempts,"
    " r.created_at, r.updated_at, left(coalesce(r.error->>'name', ''), 200) as error_name,"
    " left(coalesce(r.error->>'message', ''), 300) as error_message"
)
# For a role that may not read runs' errors (the viewer's: issue 33).
_COLUMNS_NO_ERRORS = _COLUMNS.split(", left(", 1)[0] + ", '' as error_name, '' as error_message"
ERRORS_HIDDEN = (
    "the runs cannot be searched by error as this page's database role, which may not read "
    "runs' errors: search with `lane-worker runs` as the operator."
)


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = (query.get(name) or "").strip()
    if not value:
        return None
    if len(value) > MAX_TEXT or not value.isprintable():
        raise InvalidRequestError(f"{name} is printable text of at most {MAX_TEXT} characters.")
    return value


def parse_age(name: str, raw: str | None) -> int | None:
    """Return an age such as ``90s``, ``15m``, ``2h``, ``3d`` in seconds (None: not given)."""
    value = (raw or "").strip().lower()
    if not value:
        return None
    match = _AGE.fullmatch(value)
    if match is None:
        raise InvalidRequestError(f"{name} is an age such as 90s, 15m, 2h or 3d, not {value!r}.")
    return int(match[1]) * _AGE_UNITS[match[2]]


def _age_text(seconds: int | None) -> str | None:
    if seconds is None:
        return None
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class RunFilter:
    """Which runs the list shows and a bulk action acts on; every field optional."""

    status: str | None = None  # a status, or `open` (every run not finished)
    play: str | None = None
    release: str | None = None  # runs on its lane: its own and those it adopted
    queue: str | None = None  # runs on this queue: its own and those it adopted
    newer_s: int | None = None  # created within the last so many seconds
    older_s: int | None = None  # created more than so many seconds ago
    error: str | None = None  # text in the run's error (name, message, traceback)
    run: uuid.UUID | None = None  # one run (the run page links here to act on it)

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> RunFilter:
        """Read a filter from a page's query or form; one clear sentence when a field is bad."""
        status = _text(query, "status")
        if status is not None and status not in STATUS_FILTERS:
            raise InvalidRequestError(f"status is one of {', '.join(STATUS_FILTERS)}.")
        release = _text(query, "release")
        if release is not None:
            try:
                lanes.queue_name_for_release(release)
            except LaneConfigError as exc:
                raise InvalidRequestError(f"release: {exc}") from None
        raw_run = _text(query, "run")
        try:
            run = None if raw_run is None else uuid.UUID(raw_run)
        except ValueError:
            raise InvalidRequestError("run is a run id (a UUID).") from None
        return cls(
            run=run,
            status=status,
            play=_text(query, "play"),
            release=release,
            queue=_text(query, "queue"),
            newer_s=parse_age("newer", query.get("newer")),
            older_s=parse_age("older", query.get("older")),
            error=_text(query, "error"),
        )

    def as_query(self) -> dict[str, str]:
        """The filter as the page's query fields (only those given)."""
        said = {
            "status": self.status,
            "play": self.play,
            "release": self.release,
            "queue": self.queue,
            "newer": _age_text(self.newer_s),
            "older": _age_text(self.older_s),
            "error": self.error,
            "run": None if self.run is None else str(self.run),
        }
        return {k: v for k, v in said.items() if v is not None}

    def as_json(self) -> dict[str, Any]:
        """The filter as the audit trail stores it."""
        return {
            f.name: str(v) if isinstance(v, uuid.UUID) else v
            for f in fields(self)
            if (v := getattr(self, f.name))
        }

    def url(self, path: str = "/runs", **more: str) -> str:
        """A link to ``path`` with this filter (and ``more``) as its query."""
        query = {**self.as_query(), **more}
        return f"{path}?{urlencode(query)}" if query else path

    def describe(self) -> str:
        """The filter in words, for the confirmation and the audit trail."""
        parts = [f"{k} {v}" for k, v in self.as_query().items()]
        return ", ".join(parts) if parts else "every run"

    def where(self, args: list[Any]) -> list[str]:
        """The filter's predicates on ``runs r``, appending their parameters to ``args``."""
        preds: list[str] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if self.run is not None:
            preds.append(f"r.run_id = {arg(self.run)}")
        if self.status == "open":
            # The partial indexes of open runs (0001, 0014) hold exactly these rows.
            preds.append("r.status not in ('completed', 'failed', 'cancelled')")
        elif self.status is not None:
            preds.append(f"r.status = {arg(self.status)}")
        if self.play is not None:
            preds.append(f"r.play = {arg(self.play)}")
        # A release is its lane (as `lane-worker runs --lane` reads it): every spelling of
        # one release id names one queue, and the queue columns are indexed.
        for queue in (self.release_queue, self.queue):
            if queue is not None:
                p = arg(queue)
                preds.append(f"(r.queue = {p} or r.adopted_queue = {p})")
        if self.newer_s is not None:
            preds.append(f"r.created_at >= now() - make_interval(secs => {arg(self.newer_s)})")
        if self.older_s is not None:
            preds.append(f"r.created_at < now() - make_interval(secs => {arg(self.older_s)})")
        if self.error is not None:
            # A LIKE pattern of the text itself: its % and _ are literal.
            pattern = "%" + re.sub(r"([\\%_])", r"\\\1", self.error) + "%"
            preds.append(f"(r.error is not null and r.error::text ilike {arg(pattern)})")
        return preds

    @property
    def release_queue(self) -> str | None:
        """The queue of the release asked for (None: no release asked for)."""
        return None if self.release is None else lanes.queue_name_for_release(self.release)

    @property
    def only_ended(self) -> bool:
        """Whether the filter can match only runs that ended (what a retry needs)."""
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class Cursor:
    """Where a page of the list stops: the last run shown (the next page starts below it)."""

    created_at: datetime
    run_id: uuid.UUID

    def token(self) -> str:
        """The cursor as the ``before`` field of a link."""
        return f"{self.created_at.isoformat()}~{self.run_id}"

    @classmethod
    def parse(cls, raw: str | None) -> Cursor | None:
        """Read a ``before`` field (None: the first page)."""
        if not raw:
            return None
        try:
            when, _, run = raw.partition("~")
            created = datetime.fromisoformat(when)
            if created.tzinfo is None:
                raise ValueError("no time zone")
            return cls(created, uuid.UUID(run))
        except ValueError:
            raise InvalidRequestError(
                "before is the place a page stopped (its next link), not an edited value."
            ) from None


def page_size(raw: str | None) -> int:
    """Return the page size asked for (``PAGE_SIZE`` when none), at most ``MAX_PAGE_SIZE``."""
    if not raw:
        return PAGE_SIZE
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE_SIZE:
        raise InvalidRequestError(f"limit is a whole number from 1 to {MAX_PAGE_SIZE}.")
    return int(raw)


@dataclass(frozen=True)
class ListedRun:
    """One run as the page lists it."""

    run_id: uuid.UUID
    play: str
    status: str
    release_id: str
    queue: str
    adopted_release_id: str | None
    attempts: int
    created_at: datetime
    updated_at: datetime
    error_name: str
    error_message: str


def page_sql(
    flt: RunFilter, before: Cursor | None, limit: int, *, errors: bool = True
) -> tuple[str, list[Any]]:
    """The statement of one page of the list, and its parameters (without ``errors``: no
    run's error is read, and a filter by error is refused)."""
    if not errors and flt.error is not None:
        raise InvalidRequestError(ERRORS_HIDDEN)
    args: list[Any] = []
    preds = flt.where(args)
    if before is not None:
        args += [before.created_at, before.run_id]
        n = len(args)
        # The row comparison reads the index from the cursor on (keyset paging).
        preds.append(f"(r.created_at, r.run_id) < (${n - 1}, ${n})")
    args.append(limit + 1)  # one more than shown: whether a next page exists
    where = f" where {' and '.join(preds)}" if preds else ""
    return (
        f"select {_COLUMNS if errors else _COLUMNS_NO_ERRORS} from {{schema}}.runs r{where}"
        f" order by r.created_at desc, r.run_id desc limit ${len(args)}",
        args,
    )


def ids_sql(flt: RunFilter, as_of: datetime) -> tuple[str, list[Any]]:
    """The ids a bulk action acts on, oldest first, created by ``as_of`` (MAX_BULK + 1 at most)."""
    args: list[Any] = [as_of]
    preds = [*flt.where(args), "r.created_at <= $1"]
    args.append(MAX_BULK + 1)
    return (
        f"select r.run_id from {{schema}}.runs r where {' and '.join(preds)}"
        f" order by r.created_at, r.run_id limit ${len(args)}",
        args,
    )


@dataclass(frozen=True)
class RunPage:
    """One page of the list: its runs, where the next page starts, when it was read."""

    runs: list[ListedRun]
    next: Cursor | None
    as_of: datetime


async def read_page(
    conn: Connection, schema_sql: str, flt: RunFilter, before: Cursor | None, limit: int
) -> RunPage:
    """Read one page of the list on ``conn`` (the caller bounds its statement time)."""
    errors = await conn.fetchval(
        "select pg_catalog.has_column_privilege(current_user, $1, 'error', 'SELECT')",
        f"{schema_sql}.runs",
    )
    sql, args = page_sql(flt, before, limit, errors=bool(errors))
    rows = await conn.fetch(sql.replace("{schema}", schema_sql), *args)
    runs = [ListedRun(**dict(r)) for r in rows[:limit]]
    following = Cursor(runs[-1].created_at, runs[-1].run_id) if len(rows) > limit else None
    as_of = await conn.fetchval("select now()")
    return RunPage(runs, following, as_of)


async def matching_ids(
    conn: Connection, schema_sql: str, flt: RunFilter, as_of: datetime
) -> list[uuid.UUID]:
    """The ids of the runs matching ``flt`` created by ``as_of``, oldest first."""
    sql, args = ids_sql(flt, as_of)
    return [r["run_id"] for r in await conn.fetch(sql.replace("{schema}", schema_sql), *args)]
