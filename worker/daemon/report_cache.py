"""What the health port reads from the database, shared by every client that asks.

Any number of people may keep the lanes page open, and any number of probes may
ask `/readyz`; neither may ever delay a run's lease extension or checkpoint.
So each read is **single flight**: at most one is in flight per process, every
caller that arrives meanwhile awaits that same read, and its result is reused
for a moment (``SharedRead``). A caller that gives up (the page's 5 s timeout,
a client that went away) does not cancel the read the others wait for.

The drain report is read through a pool of its own, one connection, opened on
the first view (``ReportReader``): the daemon's 2-connection pool is the hot
path's (claims, lease extensions, checkpoints), and a 0.25 s report on it
queued every lease extension behind the page's viewers.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

from worker.config.settings import Settings
from worker.db.pool import Connection, Database, PoolOptions
from worker.db.store import Store
from worker.errors import NotBootedError, ReportClosedError, SharedReadCancelledError
from worker.ops import run_list
from worker.ops.lane_view import LaneView
from worker.ops.report import read_report
from worker.ops.run_view import RunView, read_run

T = TypeVar("T")

# A report read is reused for this long after it finished; the page refreshes every 5 s.
REPORT_FRESH_S = 2.0
# The report pool's retry budget for connecting and for a read (the page waits 5 s).
REPORT_RETRY_FOR_S = 5.0
# A report statement running longer than this is cancelled by the server.
REPORT_STATEMENT_TIMEOUT_S = 10.0
# A run list page (or a bulk action's count) running longer than this is cancelled: the
# page says so within its own 5 s wait, and the report's one connection is free again.
LIST_STATEMENT_TIMEOUT_MS = 4000
# Closing the report pool waits this long for its connection, then terminates it.
REPORT_CLOSE_TIMEOUT_S = 2.0
# The lanes page lists at most this many open runs of each lane, newest first.
PAGE_OPEN_RUNS = 50
APPLICATION_NAME_BYTES = 63  # Postgres cuts application_name to NAMEDATALEN - 1 bytes


def application_name(prefix: str, release_id: str) -> str:
    """Return ``"<prefix> <release_id>"`` cut to the 63 bytes Postgres keeps (whole characters)."""
    name = f"{prefix} {release_id}".encode()[:APPLICATION_NAME_BYTES]
    return name.decode(errors="ignore")


class SharedRead(Generic[T]):
    """One read in flight at a time; its result is reused for ``fresh_s`` after it finished.

    A failed read is reused for ``failure_fresh_s`` (0: the next caller reads again),
    so an outage is retried on the next view, still one read at a time. Callers
    await the read through ``asyncio.shield``: one of them being cancelled leaves
    the read running for the others.
    """

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        *,
        fresh_s: float,
        failure_fresh_s: float = 0.0,
    ) -> None:
        self._read = read
        self._fresh_s = fresh_s
        self._failure_fresh_s = failure_fresh_s
        self._in_flight: asyncio.Task[T] | None = None
        self._last: asyncio.Task[T] | None = None
        self._fresh_until = 0.0
        #: How many reads were started (callers served from the last result start none).
        self.reads = 0

    async def get(self) -> T:
        """Return the last result while it is fresh, else the result of the read in flight."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and loop.time() < self._fresh_until:
            return last.result()  # raises a failed read's error
        task = self._in_flight
        if task is None:
            task = self._in_flight = loop.create_task(self._read_once())
            self.reads += 1
            task.add_done_callback(self._finished)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if task.cancelled() and caller is not None and not caller.cancelling():
                raise SharedReadCancelledError("the read was cancelled") from None
            raise

    async def _read_once(self) -> T:
        return await self._read()

    def _finished(self, task: asyncio.Task[T]) -> None:
        if self._in_flight is task:
            self._in_flight = None
        if task.cancelled():
            return
        failed = task.exception() is not None  # also marks a failure as retrieved
        self._last = task
        now = asyncio.get_running_loop().time()
        self._fresh_until = now + (self._failure_fresh_s if failed else self._fresh_s)

    async def close(self) -> None:
        """Cancel the read in flight, if any, and wait until it has stopped."""
        task, self._in_flight = self._in_flight, None
        self._last = None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])


class ReportReader:
    """The drain report for the health port: single flight, reused briefly, on its own pool.

    The pool (``options``, one connection) opens on the first read, not at boot,
    so a worker nobody looks at holds no extra connection (asyncpg also closes the
    connection after 5 idle minutes). Each read sets a ``statement_timeout`` in
    its transaction, so a stuck report cannot hold that connection for ever.
    """

    def __init__(
        self,
        options: PoolOptions,
        store: Store,
        *,
        fresh_s: float = REPORT_FRESH_S,
        statement_timeout_s: float = REPORT_STATEMENT_TIMEOUT_S,
    ) -> None:
        self.options = options
        self._store = store
        self._statement_timeout_ms = max(1, round(statement_timeout_s * 1000))
        self._db: Database | None = None
        self._opening: asyncio.Future[Database] | None = None
        self._closed = False
        self._shared = SharedRead(self._read, fresh_s=fresh_s)

    @property
    def reads(self) -> int:
        """How many report reads were started."""
        return self._shared.reads

    async def report(self) -> list[LaneView]:
        """Return the drain report (shared with every caller that asks meanwhile)."""
        if self._closed:
            raise ReportClosedError("the worker is stopping")
        return await self._shared.get()

    async def run(self, run_id: uuid.UUID) -> RunView | None:
        """Return one run as the run page shows it (None: no such run), on the report's pool.

        Not shared between callers (each asks for its own run), but bounded like
        the report: one connection, a statement timeout, no parallel workers.
        """
        if self._closed:
            raise ReportClosedError("the worker is stopping")
        db = await self._pool()
        return await db.run(
            lambda conn: self._bounded(conn, lambda: read_run(conn, self._store, run_id))
        )

    async def run_list(
        self, flt: run_list.RunFilter, before: run_list.Cursor | None, limit: int
    ) -> run_list.RunPage:
        """Return one page of the run list, bounded as the run page's read is."""
        if self._closed:
            raise ReportClosedError("the worker is stopping")
        db = await self._pool()
        schema = self._store.schema_sql
        return await db.run(
            lambda conn: self._bounded(
                conn,
                lambda: run_list.read_page(conn, schema, flt, before, limit),
                LIST_STATEMENT_TIMEOUT_MS,
            )
        )

    async def read(self, read: Callable[[Connection], Awaitable[T]]) -> T:
        """Any other read of the operator's pages, bounded as the run list's."""
        db = await self.database()
        return await db.run(
            lambda conn: self._bounded(conn, lambda: read(conn), LIST_STATEMENT_TIMEOUT_MS)
        )

    async def database(self) -> Database:
        """The report's pool (opened now if need be): the page's bulk actions write on it."""
        if self._closed:
            raise ReportClosedError("the worker is stopping")
        return await self._pool()

    async def _read(self) -> list[LaneView]:
        if self._closed:
            raise ReportClosedError("the worker is stopping")
        db = await self._pool()
        return await db.run(self._read_bounded)

    async def _pool(self) -> Database:
        """Open the pool once: a read cancelled while it opens leaves the open going on.

        Cancelled half-way, an open would leave its connection behind, and the
        next read would open another pool beside it (two and three report
        connections were seen under page load).
        """
        if self._db is None:
            if self._opening is None:
                self._opening = asyncio.ensure_future(Database.open(self.options))
            try:
                self._db = await asyncio.shield(self._opening)
            except asyncio.CancelledError:
                raise
            except BaseException:
                self._opening = None  # it failed: the next read tries again
                raise
        return self._db

    async def _read_bounded(self, conn: Connection) -> list[LaneView]:
        return await self._bounded(
            conn, lambda: read_report(conn, self._store, open_runs=PAGE_OPEN_RUNS)
        )

    async def _bounded(
        self, conn: Connection, read: Callable[[], Awaitable[T]], timeout_ms: int | None = None
    ) -> T:
        # The read's own transaction nests in this one (a savepoint, same snapshot rules);
        # A local setting (`set local`) ends with it, so nothing stays on the connection
        # (or a PgBouncer's).
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            # No parallel workers either: a page viewer's read must not take the
            # server's shared worker slots (nor look like extra connections).
            await conn.execute(
                "select set_config('statement_timeout', $1, true),"
                " set_config('max_parallel_workers_per_gather', '0', true)",
                str(timeout_ms or self._statement_timeout_ms),
            )
            return await read()

    async def close(self) -> None:
        """Stop the read in flight and close the pool (idempotent); later reads are refused."""
        self._closed = True
        await self._shared.close()
        db, self._db = self._db, None
        opening, self._opening = self._opening, None
        if db is None and opening is not None:
            if not opening.done():
                opening.cancel()
            with contextlib.suppress(BaseException):
                db = await opening  # an open that finished after its read was cancelled
        if db is None:
            return
        with anyio.move_on_after(REPORT_CLOSE_TIMEOUT_S) as scope:
            await db.close()
        if scope.cancelled_caught:
            db.pool.terminate()


# /readyz's database probe: `select 1` through the daemon's pool, one at a time, reused briefly.
READY_PROBE_TIMEOUT_S = 2.0
READY_PROBE_FRESH_S = 1.0


class HealthReads:
    """One daemon's health-port reads: the pages' report on its own pool, /readyz's probe."""

    def __init__(self, settings: Settings, store: Store, pool: Callable[[], Database | None]):
        # The daemon's pool once it is open (None before): the probe's, never the pages'.
        self._pool = pool
        self.report_reader = ReportReader(
            PoolOptions(
                # The viewer's login when LANE_WORKER_PAGE_POSTGRES is set (issue 33).
                url=settings.page_database_url or settings.database_url,
                max_size=1,
                application_name=application_name("lane-worker-report", settings.release_id),
                pgbouncer=settings.tuning.pgbouncer,
                retry_for_s=REPORT_RETRY_FOR_S,
            ),
            store,
        )
        self.database_probe = SharedRead(
            self._probe_database, fresh_s=READY_PROBE_FRESH_S, failure_fresh_s=READY_PROBE_FRESH_S
        )
        # Set once boot has installed the schemas: a page view must never run a migration.
        self.schemas_ready = False

    async def lanes_view(self) -> list[LaneView]:
        """The /lanes page's report: NotBootedError (503) until boot installed the schemas.

        Read through the report's own 1-connection pool, one read at a time for
        every viewer, reused for 2 s: never through the hot path's pool.
        """
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.report()

    async def run_view(self, run_id: uuid.UUID) -> RunView | None:
        """The run page's read, on the report's pool: NotBootedError (503) until boot is done."""
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.run(run_id)

    async def run_list_view(
        self, flt: run_list.RunFilter, before: run_list.Cursor | None, limit: int
    ) -> run_list.RunPage:
        """The run list's page, on the report's pool: NotBootedError (503) until boot is done."""
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.run_list(flt, before, limit)

    async def page_read(self, read: Callable[[Connection], Awaitable[T]]) -> T:
        """A read of the operator's pages, on the report's pool, bounded; 503 until booted."""
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.read(read)

    async def page_database(self) -> Database:
        """The report's pool, where the page's bulk actions run: 503 until booted."""
        if not self.schemas_ready:
            raise NotBootedError("the worker has not finished booting")
        return await self.report_reader.database()

    async def database_answers(self) -> bool:
        """/readyz's database check: one probe in flight for every client, reused for 1 s.

        It holds at most one of the daemon pool's two connections.
        """
        return self._pool() is not None and await self.database_probe.get()

    async def _probe_database(self) -> bool:
        """Tell whether `select 1` through the daemon's pool answers within 2 s."""
        db = self._pool()
        if db is None:
            return False
        try:
            with anyio.fail_after(READY_PROBE_TIMEOUT_S):
                await db.fetchval("select 1")
        except Exception:
            return False
        return True

    async def close(self) -> None:
        """Stop the probe and close the report's pool (idempotent)."""
        await self.database_probe.close()
        await self.report_reader.close()
