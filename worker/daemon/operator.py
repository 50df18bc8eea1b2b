"""The operator's pages on the health port: the run list, bulk actions, the deploy timeline.

Each read goes through the report's own 1-connection pool with its statement
timeout (``report_cache``), opened on the first view: a worker nobody looks at
does no work for these pages, and a viewer never takes the hot path's pool.
Actions need ``LANE_WORKER_PAGE_TOKEN`` (``page_auth``); no GET changes anything.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import anyio
import asyncpg
import structlog
from aiohttp import web

from worker.config.env import PAGE_URL_ENV
from worker.daemon import deploys_page, page_forms, runs_page
from worker.daemon.page_actions import (
    Bulk,
    Plans,
    Previews,
    RetryGroups,
    Running,
    parse_as_of,
    parse_count,
    perform,
    to_retry,
)
from worker.daemon.page_auth import COOKIE, PageAuth, Session, checked_who
from worker.db.pool import Connection
from worker.db.store import Store
from worker.errors import InvalidRequestError
from worker.ops import run_list
from worker.ops.lane_view import LaneView
from worker.ops.remedies import Remedies
from worker.ops.run_list import MAX_BULK, Cursor, RunFilter, page_size

if TYPE_CHECKING:
    from worker.daemon.report_cache import HealthReads

T = TypeVar("T")

# The page waits this long for its read (the list's statement timeout is shorter).
PAGE_TIMEOUT_S = 5.0
AUDIT_ROWS = 100

log = structlog.get_logger("lane_worker.page")


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


async def _form(request: web.Request) -> dict[str, str]:
    """The POSTed form's text fields; a form that cannot be read is a 400 with one sentence."""
    try:
        posted = await request.post()
    except (LookupError, ValueError) as exc:  # an unknown charset, bytes it cannot decode
        said = f"the form could not be read ({type(exc).__name__}): post it from the page."
        raise web.HTTPBadRequest(
            text=page_forms.refused_page(400, said), content_type="text/html"
        ) from None
    return {k: v for k, v in posted.items() if isinstance(v, str)}


async def _no_check() -> None:
    """Boot installed the schemas before the pages read anything (``schemas_ready``)."""


class OperatorPages:
    """The routes of the operator's pages, on one daemon's reads."""

    def __init__(
        self, reads: HealthReads, store: Store, *, token: str | None, worker_id: str
    ) -> None:
        self._reads = reads
        self._store = store
        self._auth = PageAuth(token)
        self._worker_id = worker_id
        self._running = Running()
        self._previews = Previews()

    def add_routes(self, app: web.Application) -> None:
        """Add the pages' routes to the health port's application."""
        app.router.add_get("/runs", self._runs)
        app.router.add_get("/actions", self._audit)
        app.router.add_get("/deploys", self._deploys)
        app.router.add_post("/signin", self._signin)
        app.router.add_post("/signout", self._signout)
        app.router.add_post("/actions/preview", self._preview)
        app.router.add_post("/actions/run", self._act)

    async def close(self) -> None:
        """Stop the bulk actions in progress."""
        await self._running.close()

    async def _read(self, read: Callable[[Connection], Awaitable[T]]) -> T:
        with anyio.fail_after(PAGE_TIMEOUT_S):
            return await self._reads.page_read(read)

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
        except InvalidRequestError as exc:  # a search the page's role may not make
            return html(runs_page.render_problem(400, str(exc), flt), 400)
        except Exception as exc:  # the database is away, or the read too slow: say so
            status, said = unavailable(exc)
            return html(runs_page.render_problem(status, said, flt), status)
        actions = ""
        if self._auth.enabled:
            session = self._auth.session(request)
            actions = (
                page_forms.signin_form(flt)
                if session is None
                else page_forms.action_form(flt, self._auth.csrf(session), session.who)
            )
        return html(runs_page.render(flt, page, limit, first=before is None, actions=actions))

    async def _audit(self, _request: web.Request) -> web.Response:
        store = self._store
        try:
            actions = await self._read(lambda c: store.page.actions(c, limit=AUDIT_ROWS))
        except Exception as exc:
            return html(page_forms.refused_page(503, unavailable(exc)[1]), 503)
        return html(page_forms.audit_page(actions))

    async def _deploys(self, _request: web.Request) -> web.Response:
        store = self._store
        try:
            releases, events = await self._read(
                lambda c: store.page.timeline(
                    c, releases=deploys_page.RELEASES, events=deploys_page.EVENTS
                )
            )
        except Exception as exc:
            return html(page_forms.refused_page(503, unavailable(exc)[1]), 503)
        try:  # the lanes page's report: shared, reused for 2 s
            with anyio.fail_after(PAGE_TIMEOUT_S):
                views: list[LaneView] | None = await self._reads.lanes_view()
        except Exception:
            views = None
        return html(deploys_page.render(releases, events, views))

    async def _signin(self, request: web.Request) -> web.StreamResponse:
        form = await _form(request)
        why = self._auth.refusal(request, form, signing_in=True)
        if why:
            return html(page_forms.refused_page(403, why), 403)
        try:
            who = checked_who(form.get("who"))
        except ValueError as exc:
            return html(page_forms.refused_page(400, str(exc)), 400)
        # Throttled first: while sign-ins are refused no answer may tell a guess apart.
        if self._auth.throttled():
            said = "too many failed sign-ins in the last minute: try again in a minute."
            return html(page_forms.refused_page(429, said), 429)
        if self._auth.holds_token(who):  # pasted in the wrong field: never log or store it
            self._auth.failed()  # a guess through the name field counts as one
            said = "your name goes in the name field, the token in the token field."
            return html(page_forms.refused_page(400, said), 400)
        if not self._auth.token_matches(form.get("token", "")):
            self._auth.failed()
            log.warning("page.signin_refused", who=who, remote=request.remote)
            return html(page_forms.refused_page(403, "the page token does not match."), 403)
        log.info("page.signin", who=who, remote=request.remote)
        back = form.get("back", "")
        # Back to the list signed in from; only a path of this page (never another site).
        same_list = re.fullmatch(r"/runs(\?[A-Za-z0-9._~%&=+-]*)?", back)
        response = web.HTTPSeeOther(back if same_list else "/runs")
        self._auth.set_cookie(response, request, who)
        return response

    async def _signout(self, request: web.Request) -> web.StreamResponse:
        why = self._auth.refusal(request, await _form(request), signing_in=False)
        if why:
            return html(page_forms.refused_page(403, why), 403)
        response = web.HTTPSeeOther("/runs")
        response.del_cookie(COOKIE, path="/")
        return response

    async def _checked(
        self, request: web.Request
    ) -> tuple[dict[str, str], Session | None, web.Response | None]:
        """The form and the signed-in session, or the answer refusing the POST."""
        form = await _form(request)
        why = self._auth.refusal(request, form, signing_in=False)
        if why:
            status = 403
            return form, None, html(page_forms.refused_page(status, why), status)
        session = self._auth.session(request)
        assert session is not None  # refusal() said it is there
        refused = await self._read_only()
        if refused is not None:
            status, why = refused
            return form, None, html(page_forms.refused_page(status, why), status)
        return form, session, None

    async def _read_only(self) -> tuple[int, str] | None:
        """Why the page's database role may not act (a viewer's login: issue 33), else None."""
        table = f"{self._store.schema_sql}.page_actions"

        async def may_act(conn: Connection) -> tuple[str, bool]:
            row = await conn.fetchrow(
                "select current_user::text, has_table_privilege(current_user, $1, 'INSERT')", table
            )
            assert row is not None
            return row[0], row[1]

        try:
            role, may = await self._read(may_act)
        except Exception as exc:
            return unavailable(exc)
        if may:
            return None
        return 403, (
            f"this page reads the database as role {role}, which may only read (a viewer's "
            f"login, {PAGE_URL_ENV}): retry, cancel or move runs with `lane-worker runs`, "
            "`lane-worker cancel` or `lane-worker lanes move` as the operator, or serve the "
            "page with a role that may act."
        )

    async def _preview(self, request: web.Request) -> web.Response:
        form, session, refused = await self._checked(request)
        if refused is not None:
            return refused
        assert session is not None  # _checked refuses a POST without one
        try:
            bulk = Bulk.from_form(form)
        except InvalidRequestError as exc:
            return html(page_forms.refused_page(400, str(exc)), 400)
        schema = self._store.schema_sql

        async def matched(conn: Connection) -> tuple[datetime, list[uuid.UUID]]:
            as_of: datetime = await conn.fetchval("select now()")
            return as_of, await run_list.matching_ids(conn, schema, bulk.filter, as_of)

        try:
            as_of, ids = await self._read(matched)
        except Exception as exc:
            return html(page_forms.refused_page(503, unavailable(exc)[1]), 503)
        back = bulk.filter.url()
        if not ids:
            return html(page_forms.refused_page(200, "no run matches the filter.", back))
        if len(ids) > MAX_BULK:
            return html(page_forms.refused_page(400, runs_page.TOO_MANY, back), 400)
        return await self._ask(bulk, ids, as_of, session)

    async def _plans(self, bulk: Bulk, ids: list[uuid.UUID]) -> Plans:
        """What a retry of each run would do now (where it goes); None for other actions."""
        if bulk.action != "retry":
            return dict.fromkeys(ids)
        db = await self._reads.page_database()
        return await Remedies(db, self._store, _no_check).plan_retries(ids, bulk.to)

    async def _ask(
        self,
        bulk: Bulk,
        ids: list[uuid.UUID],
        as_of: datetime,
        session: Session,
        confirmed: int | None = None,
    ) -> web.Response:
        """The confirmation of ``ids`` (asked again, 409, when ``confirmed`` is given)."""
        try:
            plans = await self._plans(bulk, ids)
        except Exception as exc:
            return html(page_forms.refused_page(503, unavailable(exc)[1]), 503)
        groups = RetryGroups.of(plans) if bulk.action == "retry" else None
        count = groups.count if groups is not None else len(ids)
        if groups is not None and count == 0:
            said = page_forms.nothing_to_retry(groups)
            return html(page_forms.refused_page(200, said, bulk.filter.url()))
        preview = self._previews.keep(session.sid, bulk, plans)
        csrf = self._auth.csrf(session)
        page = page_forms.confirm_page(bulk, count, as_of, csrf, preview, confirmed, groups)
        return html(page, 409 if confirmed is not None else 200)

    async def _act(self, request: web.Request) -> web.StreamResponse:
        form, session, refused = await self._checked(request)
        if refused is not None:
            return refused
        assert session is not None  # _checked refuses a POST without one
        try:
            bulk = Bulk.from_form(form)
            as_of, seen = parse_as_of(form.get("asOf")), parse_count(form.get("seen"))
        except InvalidRequestError as exc:
            return html(page_forms.refused_page(400, str(exc)), 400)
        counted = self._previews.runs(form.get("preview", ""), session.sid, bulk)
        if counted is None:
            said = (
                "this confirmation's preview is gone (kept 15 minutes, and not across a "
                "restart of the worker), or was of another action, filter or target "
                "release: preview the action again."
            )
            return html(page_forms.refused_page(409, said, bulk.filter.url()), 409)
        schema = self._store.schema_sql
        try:
            ids = await self._read(lambda c: run_list.matching_ids(c, schema, bulk.filter, as_of))
        except Exception as exc:
            return html(page_forms.refused_page(503, unavailable(exc)[1]), 503)
        # A retry acts only on the runs its preview said would get a new retry (never
        # one it counted as retried already, or as not retriable then).
        acting = to_retry(counted, ids) if bulk.action == "retry" else ids
        if len(acting) > seen or any(run_id not in counted for run_id in ids):
            # More than confirmed, or a run the preview did not count entered the filter
            # since: ask again, with the runs that match now (only those a new
            # confirmation may act on).
            return await self._ask(bulk, ids, as_of, session, seen)
        if not acting:
            return html(page_forms.refused_page(200, "no run matches the filter any more."))
        store, remote = self._store, request.remote
        db = await self._reads.page_database()
        action_id = await db.run(
            lambda c: store.page.start_action(
                c,
                who=session.who,
                remote=remote,
                action=bulk.action,
                filter=bulk.filter.as_json(),
                target=bulk.to,
                count_seen=seen,
                matched=len(acting),
                worker_id=self._worker_id,
            )
        )
        log.info("page.action", action_id=action_id, action=bulk.action, who=session.who,
                 runs=len(acting), remote=remote)  # fmt: skip
        remedies = Remedies(db, store, _no_check)
        work = perform(
            db, store, remedies, bulk, acting, who=session.who, action_id=action_id, plans=counted
        )
        self._running.start(work)
        return web.HTTPSeeOther(f"/actions#action-{action_id}")
