"""HTTP: /healthz, /readyz, /metrics (Prometheus), /lanes (the drain report), / (its page),
/runs/<runId> (one run's page)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import anyio
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.log import server_logger
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker.daemon import page, run_page
from worker.daemon.operator import OperatorPages
from worker.errors import (
    HealthPortError,
)
from worker.metrics import Metrics, Registered
from worker.ops.lane_view import LaneView
from worker.ops.lanes_text import lanes_table
from worker.states import LaneState

LANES_TIMEOUT_S = 5.0
# A bad request's logged reason is cut to this many characters: it quotes the client's bytes.
BAD_REQUEST_REASON_CHARS = 100
# What one client may hold. aiohttp keeps an idle connection open for an hour by default.
KEEPALIVE_TIMEOUT_S = 5.0
# A connection must deliver a request's headers within this long of opening, or of the end of
# the previous request's handler, and read the response in that time; else it is dropped.
REQUEST_HEADERS_TIMEOUT_S = 5.0
# Open connections at most; one more is closed at once (logged at most every 10 s).
MAX_CONNECTIONS = 64
TOO_MANY_CONNECTIONS_LOG_S = 10.0
CLIENT_MAX_SIZE = 16 * 1024  # a GET, or one of the operator page's small forms
# On stop, requests in progress get this long to finish before they are cancelled.
SHUTDOWN_TIMEOUT_S = 1.0

ReadinessCheck = Callable[[], Awaitable[dict[str, Any]]]
LanesReport = Callable[[], Awaitable[list[LaneView]]]

log = structlog.get_logger("lane_worker.health")


class _RequestErrors(logging.Handler):
    """Turns aiohttp's report of a malformed request into one ``health.bad_request`` line.

    aiohttp answers a request it cannot parse (garbage, a bad request line, method
    or header, an over-long line) with 400, and logs the parser's exception with a
    traceback to stderr, or, for a bad method on a fresh connection, at debug (not
    at all). Every other record goes on to ``aiohttp.server`` unchanged.
    """

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
            log.warning(
                "health.bad_request",
                status=exc.code,
                error=type(exc).__name__,
                reason=_short_reason(exc.message),
                remote=None if remote is None else str(remote),
            )
        elif server_logger.isEnabledFor(record.levelno):
            record.name = server_logger.name
            server_logger.handle(record)


def _short_reason(message: str) -> str:
    """Return the parser's message on one line, without its caret line, cut short."""
    text = " ".join(p for p in (line.strip() for line in message.splitlines()) if p.strip("^ "))
    if len(text) <= BAD_REQUEST_REASON_CHARS:
        return text
    return text[: BAD_REQUEST_REASON_CHARS - 3] + "..."


# The request handlers' logger (aiohttp's ``logger`` argument, `aiohttp.server` by default).
# Level DEBUG: aiohttp reports a bad method on a fresh connection at debug.
_request_log = logging.getLogger("lane_worker.health.requests")
_request_log.setLevel(logging.DEBUG)
_request_log.propagate = False
if not _request_log.handlers:
    _request_log.addHandler(_RequestErrors())


class _Bounds:
    """The limits a server's connections share, and how many are open."""

    def __init__(self, max_connections: int, idle_s: float) -> None:
        self.max_connections = max_connections
        self.idle_s = idle_s
        self.open = 0
        self.handlers: set[_BoundedHandler] = set()
        self._refused = 0  # since the last log line
        self.pages_dropped = 0  # page requests cut short to admit a newcomer
        self._logged_at: float | None = None

    def make_room(self) -> bool:
        """At the cap, drop a connection for the newcomer; False if only probes are busy.

        First the connection idle the longest (no handler running): idle
        keep-alive connections are what a crowd of page viewers holds. Else the
        one serving a page request (``/``, ``/lanes``, ``/metrics``) the longest.
        Dropping either costs a viewer a retry, while refusing the newcomer could
        cost an orchestrator's health probe its machine (a probe is never dropped).
        """
        if self.open < self.max_connections:
            return True
        idle = [h for h in self.handlers if h.idle_since is not None]
        if idle:
            min(idle, key=lambda h: cast(float, h.idle_since)).drop()
            return self.open < self.max_connections
        pages = [h for h in self.handlers if h.page_since is not None]
        if not pages:
            return False
        min(pages, key=lambda h: cast(float, h.page_since)).drop()
        self.pages_dropped += 1
        return self.open < self.max_connections

    def refuse(self) -> None:
        """Count a connection closed for being one too many; log at most every 10 s."""
        self._refused += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= TOO_MANY_CONNECTIONS_LOG_S:
            log.warning(
                "health.too_many_connections", limit=self.max_connections, refused=self._refused
            )
            self._refused, self._logged_at = 0, now


class _BoundedHandler(RequestHandler):
    """aiohttp's connection handler, counted against the cap and dropped when it dawdles.

    At the cap, a new connection takes the place of the one idle the longest
    (no handler running); when every one is busy it is aborted before aiohttp
    sees it. Otherwise a
    clock runs whenever no request handler is running on the connection (from
    the connect, and from the end of each handler): when it runs out, the
    connection is aborted, whether the client is silent, sends its headers
    slowly, or does not read its response (``abort``, not ``close``, which
    would wait for the client to read what is buffered). The handlers bound
    their own time (the report's 5 s, the readiness probe's 2 s).
    """

    def __init__(self, manager: Server, bounds: _Bounds, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._bounds = bounds
        self._counted = False
        self._own_transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        # When its clock started (no handler running), or None while one runs.
        self.idle_since: float | None = None
        # When the page request it serves began (None: idle, or a probe).
        self.page_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        real = cast(asyncio.Transport, transport)
        if not self._bounds.make_room():
            self._bounds.refuse()
            real.abort()
            return
        self._bounds.open += 1
        self._bounds.handlers.add(self)
        self._counted = True
        self._own_transport = real
        super().connection_made(real)
        self.start_clock()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.stop_clock()
        self._own_transport = None
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._bounds.open -= 1
            self._bounds.handlers.discard(self)

    def stop_clock(self) -> None:
        """A request's handler runs: its own time bound applies, not the connection's."""
        self.idle_since = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def start_clock(self) -> None:
        """Give the client ``idle_s`` to read the response and send the next request."""
        self.stop_clock()
        if self._own_transport is not None:
            loop = asyncio.get_running_loop()
            self.idle_since = loop.time()
            self._deadline = loop.call_later(self._bounds.idle_s, self._too_slow)

    def drop(self) -> None:
        """Abort the connection now; its place under the cap is free at once."""
        self.stop_clock()
        transport, self._own_transport = self._own_transport, None
        self._uncount()  # connection_lost comes later, from the event loop
        if transport is not None:
            transport.abort()

    def _too_slow(self) -> None:
        self._deadline = None
        self.drop()


class _BoundedServer(Server):
    """aiohttp's low-level server (the protocol factory) making bounded connection handlers."""

    def __init__(self, plain: Server, bounds: _Bounds) -> None:
        # The arguments aiohttp's Application gave the server it made, kept as they are.
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )
        self.bounds = bounds

    def __call__(self) -> RequestHandler:
        return _BoundedHandler(self, self.bounds, loop=self._loop, **self._kwargs)


class _BoundedRunner(web.AppRunner):
    """An AppRunner whose server makes bounded connection handlers."""

    def __init__(self, app: web.Application, bounds: _Bounds, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._bounds = bounds

    async def _make_server(self) -> Server:
        return _BoundedServer(await super()._make_server(), self._bounds)


# The orchestrator's probes: never dropped to make room (a page request is).
_PROBES = frozenset({"/healthz", "/readyz"})


@web.middleware
async def _handler_clock(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Stop the connection's idle clock while a handler runs; restart it when it returns."""
    protocol = request.protocol
    bounded = protocol if isinstance(protocol, _BoundedHandler) else None
    if bounded is not None:
        bounded.stop_clock()
        if request.path not in _PROBES:
            bounded.page_since = asyncio.get_running_loop().time()
    try:
        return await handler(request)
    finally:
        if bounded is not None:
            bounded.page_since = None
            bounded.start_clock()


def lane_gauges(metrics: Metrics, views: list[LaneView]) -> None:
    """Set the lane gauges from a drain report (a lane gone, or drained and idle, is dropped).

    A drained lane with no live worker is only counted
    (``lane_worker_lanes{status="drained"}``): its own series would all be zero, and
    they would grow with every deploy until pruned. One with live workers keeps its
    series: machines still up that are safe to stop are what a dashboard looks for.
    """
    gauges = (
        metrics.lanes,
        metrics.lane_open_runs,
        metrics.lane_live_workers,
        metrics.lane_status,
        metrics.lane_stranded,
        metrics.lane_draining_seconds,
    )
    for gauge in gauges:
        gauge.clear()
    for status, count in Counter(v.status for v in views).items():
        metrics.lanes.labels(status).set(count)
    for v in views:
        if v.status == LaneState.DRAINED and not v.live_workers:
            continue
        for bucket, n in v.counts.items():
            metrics.lane_open_runs.labels(v.queue, v.release_id, bucket).set(n)
        metrics.lane_live_workers.labels(v.queue, v.release_id).set(v.live_workers)
        metrics.lane_status.labels(v.queue, v.release_id, v.status).set(1)
        metrics.lane_stranded.labels(v.queue, v.release_id).set(1 if v.stranded else 0)
        metrics.lane_draining_seconds.labels(v.queue, v.release_id).set(v.draining_s)


class HealthServer:
    """The daemon's HTTP endpoints on one port (0 picks a free one)."""

    def __init__(
        self,
        port: int,
        metrics: Registered,  # the worker's Metrics, or the scaler's own
        readiness: ReadinessCheck,
        lanes: LanesReport | None = None,
        *,
        run: run_page.RunReport | None = None,
        operator: OperatorPages | None = None,
        scrape: Callable[[], None] | None = None,
        host: str = "0.0.0.0",  # noqa: S104 (a container's health port)
    ) -> None:
        self._host = host
        self._port = port
        self._metrics = metrics
        self._readiness = readiness
        self._lanes = lanes
        self._run = run
        self._operator = operator  # the run list, bulk actions, the deploy timeline
        self._scrape = scrape  # sets the process's own gauges before a scrape
        self._runner: web.AppRunner | None = None
        self._bounds = _Bounds(MAX_CONNECTIONS, REQUEST_HEADERS_TIMEOUT_S)
        self.port: int | None = None

    @property
    def open_connections(self) -> int:
        """How many client connections are open now."""
        return self._bounds.open

    async def start(self) -> int:
        """Start listening; return the port actually bound."""
        app = web.Application(client_max_size=CLIENT_MAX_SIZE, middlewares=[_handler_clock])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_page)
        if self._lanes is not None:
            app.router.add_get("/lanes", self._lanes_page)
            app.router.add_get("/", self._html_page)
        if self._run is not None:
            app.router.add_get("/runs/{run_id}", self._run_page)
        if self._operator is not None:
            self._operator.add_routes(app)
        self._runner = _BoundedRunner(
            app,
            self._bounds,
            access_log=None,
            handle_signals=False,
            logger=_request_log,
            keepalive_timeout=KEEPALIVE_TIMEOUT_S,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self._host, port=self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            # Left as a bare OSError it would read as "the database is unreachable".
            raise HealthPortError(
                f"cannot listen on health port {self._port} of {self._host} "
                f"({exc.strerror or exc}); set LANE_WORKER_HEALTH_PORT to a free port (0 picks "
                "one), or LANE_WORKER_HEALTH_HOST to an address of this machine."
            ) from exc
        # aiohttp exposes the bound port only through the server: asyncio's Server, or
        # uvloop's, which is no subclass of it but has the same `sockets`.
        server = site._server
        assert server is not None
        sockets: Sequence[socket.socket] = server.sockets  # type: ignore[attr-defined]
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._operator is not None:
            await self._operator.close()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def _readyz(self, _request: web.Request) -> web.Response:
        report = await self._readiness()
        return web.json_response(report, status=200 if report.get("ready") else 503)

    async def _report(self) -> list[LaneView] | str:
        """The drain report, or the error's type when it cannot be read now."""
        assert self._lanes is not None
        try:
            # The pool retries an absent database for a minute; a page must answer sooner.
            with anyio.fail_after(LANES_TIMEOUT_S):
                return await self._lanes()
        except Exception as exc:  # the database is away: say so, do not crash the page
            return type(exc).__name__

    async def _html_page(self, request: web.Request) -> web.Response:
        number = page.page_number(request.query.get("page"))
        if number is None:
            return web.Response(text=page.BAD_PAGE, status=400)
        views = await self._report()
        if isinstance(views, str):
            return web.Response(text=page.render_error(views), content_type="text/html", status=503)
        return web.Response(text=page.render(views, number), content_type="text/html")

    async def _run_page(self, request: web.Request) -> web.Response:
        """One run's page: 404 for a run id that names no run, 503 while it cannot be read."""
        assert self._run is not None
        status, text = await run_page.answer(
            self._run, request.match_info["run_id"], timeout_s=LANES_TIMEOUT_S
        )
        return web.Response(text=text, content_type="text/html", status=status)

    async def _lanes_page(self, request: web.Request) -> web.Response:
        """The `lane-worker lanes` view: JSON, or the CLI's table with ``?format=text``."""
        number = page.page_number(request.query.get("page"))
        if number is None:
            return web.json_response({"error": page.BAD_PAGE}, status=400)
        views = await self._report()
        if isinstance(views, str):
            return web.json_response({"error": views}, status=503)
        # Past LANES_PER_PAGE lanes, paged (`lane-worker lanes --json` prints them all).
        shown, paging = page.lanes_page(views, number)
        if request.query.get("format") == "text":
            return web.Response(text="\n".join(lanes_table(shown)) + "\n")
        return web.json_response({"lanes": [v.as_json() for v in shown], **paging})

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        if self._lanes is not None and isinstance(self._metrics, Metrics):
            views = await self._report()  # single flight, reused briefly (report_cache)
            if not isinstance(views, str):  # a database that is away keeps the last values
                lane_gauges(self._metrics, views)
        if self._scrape is not None:
            self._scrape()
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
