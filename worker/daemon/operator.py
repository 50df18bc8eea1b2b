"""The operator's pages on the health port: the run list, bulk actions, the deploy timeline.

Each read goes through the report's own 1-connection pool with its statement
timeout (``report_cache``), opened on the first view: a worker nobody looks at
does no work for these pages, and a viewer never takes the hot path's pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import asyncpg
from aiohttp import web

from worker.daemon import runs_page
from worker.errors import InvalidRequestError
from worker.ops.run_list import Cursor, RunFilter, page_size

if TYPE_CHECKING:
    from worker.daemon.report_cache import HealthReads

# The page waits this long for its read (the list's statement timeout is shorter).
PAGE_TIMEOUT_S = 5.0


def html(text: str, status: int = 200) -> web.Response:
    """An HTML answer that no frame may embed and no cache may keep."""
    return web.Response(
        text=text,
        status=status,
        content_type="text/html",
        headers={
            "X-Frame-Options": "DENY",
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
            "form-action 'self'; frame-ancestors 'none'",
            "Referrer-Policy": "same-origin",
        },
    )


def unavailable(exc: BaseException) -> tuple[int, str]:
    """The status and sentence for a read that failed: too slow, or the database away."""
    if isinstance(exc, asyncpg.QueryCanceledError):
        return 503, runs_page.TOO_SLOW
    return 503, f"the runs cannot be read right now ({type(exc).__name__}); try again shortly."


class OperatorPages:
    """The routes of the operator's pages, on one daemon's reads."""

    def __init__(self, reads: HealthReads) -> None:
        self._reads = reads

    def add_routes(self, app: web.Application) -> None:
        """Add the pages' routes to the health port's application."""
        app.router.add_get("/runs", self._runs)

    async def _runs(self, request: web.Request) -> web.Response:
        try:
            flt = RunFilter.from_query(request.query)
            before = Cursor.parse(request.query.get("before"))
            limit = page_size(request.query.get("limit"))
        except InvalidRequestError as exc:
            return html(runs_page.render_problem(400, str(exc)), 400)
        try:
            with anyio.fail_after(PAGE_TIMEOUT_S):
                page = await self._reads.run_list_view(flt, before, limit)
        except Exception as exc:  # the database is away, or the read too slow: say so
            status, said = unavailable(exc)
            return html(runs_page.render_problem(status, said, flt), status)
        return html(runs_page.render(flt, page, limit, first=before is None, actions=""))
