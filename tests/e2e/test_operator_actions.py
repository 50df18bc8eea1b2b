"""Bulk actions from the operator page, on a real daemon and a real store.

The test posts the page's forms over HTTP as a browser would (the session
cookie, the form's CSRF token, an Origin) and has headless Chromium render what
the operator sees at each step (screenshots in the test's tmp dir, paths
printed). Outcomes are read from the store: runs cancelled, retried and moved
through the CLI's remedies, and one audit row per action.
"""

from __future__ import annotations

import json
import uuid
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from support.browser import browser_page
from support.daemon import Daemon, Daemons
from support.page import dump_dom, parse_fields, screenshot
from support.runtime import eventually, open_client
from worker.daemon.page_auth import SIGNIN_FAILURES

A = "oppage_act_a"
IDLE = "oppage_act_idle"  # no worker serves it: its runs stay queued until moved
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "1"}
STORE = "runtime_scheduler"


class Forms(HTMLParser):
    """Each form of a page: its action and its inputs' values (hidden ones included)."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.forms.append((str(a.get("action")), {}))
        elif tag == "input" and self.forms and a.get("name"):
            self.forms[-1][1][str(a["name"])] = str(a.get("value") or "")


def form(html: str, action: str) -> dict[str, str]:
    """The fields of the page's form posting to ``action``."""
    parser = Forms()
    parser.feed(html)
    found = [fields for to, fields in parser.forms if to == action]
    assert found, f"no form posting to {action}"
    return found[0]


class Operator:
    """A browser's side of the page: its cookie jar, its Origin, everything it was shown."""

    def __init__(self, port: int, folder: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.folder = folder
        self.jar = aiohttp.CookieJar(unsafe=True)  # cookies of an IP address
        self.bodies: list[str] = []
        self.shots = 0

    async def post(
        self, path: str, fields: dict[str, str], *, origin: str | None = None
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        headers = {"Origin": origin if origin is not None else self.base}
        async with (
            aiohttp.ClientSession(cookie_jar=self.jar) as session,
            session.post(self.base + path, data=fields, headers=headers,
                         allow_redirects=False) as response,
        ):  # fmt: skip
            body = await response.text()
        self.bodies.append(body)
        return response.status, body, response

    async def get(self, path: str) -> str:
        async with (
            aiohttp.ClientSession(cookie_jar=self.jar) as session,
            session.get(self.base + path) as response,
        ):
            body = await response.text()
        assert response.status == 200, body
        self.bodies.append(body)
        return body

    def show(self, html: str, name: str) -> None:
        """Render a page an answer gave in Chromium (as the operator saw it); print its path."""
        self.shots += 1
        page = self.folder / f"{self.shots:02d}-{name}.html"
        page.write_text(html.replace("<head>", f'<head><base href="{self.base}/">', 1))
        print("screenshot:", screenshot(page.as_uri(), self.folder, f"{self.shots:02d}-{name}"))


async def store_rows(database_url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def statuses(database_url: str, run_ids: list[str]) -> dict[str, str]:
    rows = await store_rows(
        database_url,
        f"select run_id::text, status from {STORE}.runs where run_id = any($1::uuid[])",
        run_ids,
    )
    return {r["run_id"]: r["status"] for r in rows}


async def finished_action(database_url: str, action_id: int) -> asyncpg.Record:
    async def done() -> asyncpg.Record | None:
        rows = await store_rows(
            database_url,
            f"select * from {STORE}.page_actions where action_id = $1 and finished_at is not null",
            action_id,
        )
        return rows[0] if rows else None

    return await eventually(done, timeout_s=60, what=f"page action {action_id} finished")


async def confirm(op: Operator, fields: dict[str, str], name: str) -> tuple[int, dict[str, str]]:
    """Preview an action, render the confirmation, confirm it: (the audit row's id, form)."""
    status, body, _ = await op.post("/actions/preview", fields)
    assert status == 200, body
    op.show(body, f"confirm-{name}")
    confirmation = form(body, "/actions/run")
    status, body, response = await op.post("/actions/run", confirmation)
    assert status == 303, body
    location = response.headers["Location"]
    assert location.startswith("/actions#action-")
    return int(location.rsplit("-", 1)[1]), confirmation


def leaked(token: str, daemon: Daemon, op: Operator) -> bool:
    """Whether the token shows anywhere: a page, a log line, stderr."""
    logs = json.dumps(daemon.records) + daemon.stderr
    return any(token in text for text in (*op.bodies, logs))


async def test_cancel_retry_and_move_everything_matching(database_url: str, tmp_path: Path) -> None:
    """Signed in with the token: cancel 3 waiting runs, retry 4 failed ones, move 2 queued
    ones to a claiming release; each counted first and confirmed, each audited in the store;
    a confirmation carrying fewer runs than now match is asked again; CSRF refused."""
    token = f"tok-{uuid.uuid4().hex}"
    env_idle = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, ENV_A) as client,
        open_client(database_url, env_idle) as idle,
    ):
        daemon = pool.start(A, LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        op = Operator(daemon.health_port, tmp_path)
        failed = [(await client.submit("flaky", {"n": n})).run_id for n in range(4)]
        waiting = [(await client.submit("waiter", {"n": n})).run_id for n in range(3)]
        queued = [(await idle.submit("plain", {"n": n})).run_id for n in range(2)]

        async def settled() -> bool:
            now = await statuses(database_url, failed + waiting)
            return [now[r] for r in failed + waiting] == ["failed"] * 4 + ["waiting"] * 3

        await eventually(settled, timeout_s=60, what="4 failed and 3 waiting runs")

        # Not signed in: a sign-in form, no action form; a POST is refused.
        fields = parse_fields(dump_dom(f"{op.base}/runs?release={A}"))
        assert fields.text("signin")
        assert not fields.text("actions")
        print("screenshot:", screenshot(f"{op.base}/runs?release={A}", tmp_path, "00-signin"))
        status, body, _ = await op.post("/actions/preview", {"action": "cancel"})
        assert (status, "sign in first" in body) == (403, True)

        # Sign in: a wrong token is refused; the right one sets a strict, HttpOnly cookie.
        status, body, _ = await op.post("/signin", {"who": token, "token": token})
        assert (status, "your name goes in the name field" in body) == (400, True)
        status, body, _ = await op.post("/signin", {"who": "ana", "token": token[:-1] + "x"})
        assert (status, "does not match" in body) == (403, True)
        status, _, response = await op.post(
            "/signin", {"who": "ana", "token": token}, origin="http://evil.example"
        )
        assert status == 403
        status, _, response = await op.post("/signin", {"who": "ana", "token": token})
        assert status == 303
        cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        listed = await op.get(f"/runs?release={A}&status=waiting")
        op.show(listed, "signed-in")
        bulk = form(listed, "/actions/preview")
        assert bulk["status"] == "waiting"
        assert bulk["release"] == A
        assert bulk["csrf"]

        # CSRF: no token, another session's token, another origin: refused, nothing done.
        for fields_, origin in (
            ({**bulk, "action": "cancel", "csrf": ""}, None),
            ({**bulk, "action": "cancel", "csrf": "x" * 43}, None),
            ({**bulk, "action": "cancel"}, "http://evil.example"),
        ):
            status, body, _ = await op.post("/actions/preview", fields_, origin=origin)
            assert status == 403, body
        async with (  # no GET acts
            aiohttp.ClientSession() as session,
            session.get(f"{op.base}/actions/run") as response,
        ):
            assert response.status == 405

        # Cancel everything waiting on A: 3 counted, confirmed, cancelled, audited.
        action_id, _ = await confirm(op, {**bulk, "action": "cancel"}, "cancel")
        row = await finished_action(database_url, action_id)
        assert (row["who"], row["action"], row["count_seen"], row["acted"]) == (
            "ana",
            "cancel",
            3,
            3,
        )
        assert (row["unchanged"], row["refused"]) == (0, 0)
        assert json.loads(row["filter"]) == {"status": "waiting", "release": A}
        assert set((await statuses(database_url, waiting)).values()) == {"cancelled"}
        sources = await store_rows(
            database_url,
            f"select fact ->> 'source' as source from {STORE}.ledger"
            " where run_id = any($1::uuid[]) and fact ->> 'type' = 'run.cancelled'",
            waiting,
        )
        assert [r["source"] for r in sources] == ["operator"] * 3  # not the app's `client`

        # Retry everything failed on A: 4 new runs, each naming the one it retries.
        action_id, _ = await confirm(op, {**bulk, "status": "failed", "action": "retry"}, "retry")
        row = await finished_action(database_url, action_id)
        assert (row["action"], row["count_seen"], row["acted"]) == ("retry", 4, 4)
        retries = await store_rows(
            database_url,
            f"select retry_of::text from {STORE}.runs where retry_of = any($1::uuid[])",
            failed,
        )
        assert sorted(r["retry_of"] for r in retries) == sorted(failed)

        # Move: a confirmation of fewer runs than now match is asked again, nothing done.
        to_move = {**bulk, "release": IDLE, "status": "queued", "action": "move", "to": A}
        status, body, _ = await op.post("/actions/preview", to_move)
        assert parse_fields(body).found
        assert 'data-count="2"' in body
        stale = {**form(body, "/actions/run"), "seen": "1"}
        status, body, _ = await op.post("/actions/run", stale)
        assert status == 409
        assert 'data-count="2"' in body
        assert parse_fields(body).first("again").startswith("Nothing done: 2 runs match now")
        op.show(body, "asked-again")
        # A run submitted after the preview is not acted on, though it matches the filter.
        later = (await idle.submit("plain", {"n": 9})).run_id
        status, body, response = await op.post("/actions/run", {**stale, "seen": "2"})
        assert status == 303, body
        action_id = int(response.headers["Location"].rsplit("-", 1)[1])
        row = await finished_action(database_url, action_id)
        assert (row["action"], row["target"], row["acted"]) == ("move", A, 2)

        async def moved() -> bool:
            return set((await statuses(database_url, queued)).values()) == {"completed"}

        await eventually(moved, timeout_s=60, what="the moved runs completed on A")
        assert (await statuses(database_url, [later]))[later] == "queued"

        # The audit trail, as the operator reads it.
        trail = parse_fields(dump_dom(f"{op.base}/actions"))
        assert trail.text("who")[:3] == ["ana " + "127.0.0.1"] * 3
        assert trail.text("kind")[:3] == [f"move to {A}", "retry", "cancel"]
        print("screenshot:", screenshot(f"{op.base}/actions", tmp_path, "99-audit"))
        assert not leaked(token, daemon, op), "the page token was echoed"


async def test_without_a_token_the_page_is_read_only(database_url: str) -> None:
    """No LANE_WORKER_PAGE_TOKEN: no sign-in or action form, and every POST is refused."""
    async with Daemons(database_url) as pool:
        daemon = pool.start("oppage_readonly")
        await daemon.ready()
        op = Operator(daemon.health_port, Path("."))
        fields = parse_fields(dump_dom(f"{op.base}/runs"))
        assert not fields.text("signin")
        assert not fields.text("actions")
        for path in ("/signin", "/actions/preview", "/actions/run"):
            status, body, _ = await op.post(path, {"who": "x", "token": "y" * 20})
            assert status == 403
            assert "LANE_WORKER_PAGE_TOKEN" in body


async def test_a_weak_page_token_refuses_boot_naming_the_variable(database_url: str) -> None:
    """A token too short to be a secret: exit 78, one sentence naming the variable, not it."""
    weak = "hunter2-short"
    async with Daemons(database_url) as pool:
        daemon = pool.start("oppage_weak", LANE_WORKER_PAGE_TOKEN=weak)
        assert await daemon.wait_exit() == 78, daemon.tail()
        said = json.dumps(daemon.records) + daemon.stderr
        assert "LANE_WORKER_PAGE_TOKEN is not a usable page token" in said
        assert weak not in said


async def test_sign_in_guesses_are_throttled(database_url: str) -> None:
    """20 wrong tokens within a minute: every sign-in is refused (429), the right one too."""
    token = f"tok-{uuid.uuid4().hex}"
    async with Daemons(database_url) as pool:
        daemon = pool.start("oppage_guess", LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        op = Operator(daemon.health_port, Path("."))
        for _ in range(SIGNIN_FAILURES):
            assert (await op.post("/signin", {"who": "eve", "token": "y" * 20}))[0] == 403
        status, body, _ = await op.post("/signin", {"who": "ana", "token": token})
        assert status == 429
        assert "too many failed sign-ins" in body
        assert len(daemon.events("page.signin_refused")) == SIGNIN_FAILURES


async def test_an_operator_cancels_from_the_browser(database_url: str, tmp_path: Path) -> None:
    """In headless Chromium: sign in on the filtered list, pick cancel, count, confirm;
    the browser's own cookie, form token and Origin carry it; the store has the outcome."""
    token = f"tok-{uuid.uuid4().hex}"
    release = "oppage_click_a"
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release}) as client,
        browser_page() as page,
    ):
        daemon = pool.start(release, LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        base = f"http://127.0.0.1:{daemon.health_port}"
        waiting = [(await client.submit("waiter", {"n": n})).run_id for n in range(2)]
        for run_id in waiting:
            await daemon.wait_for("run.parked", run_id=run_id)

        await page.goto(f"{base}/runs?release={release}&status=waiting", "/runs")
        print("screenshot:", await page.screenshot(tmp_path / "1-list.png"))
        await page.fill('form[action="/signin"] input[name=who]', "bea")
        await page.fill('form[action="/signin"] input[name=token]', token)
        await page.click('form[action="/signin"] button', then="/runs")
        # Back on the list it was signed in from, with the action form.
        assert parse_fields(await page.html()).first("who") == "bea"
        assert await page.evaluate("location.search") == f"?status=waiting&release={release}"
        await page.fill("select[name=action]", "cancel")
        await page.click('form[action="/actions/preview"] button', then="/actions/preview")
        print("screenshot:", await page.screenshot(tmp_path / "2-confirm.png"))
        assert 'data-count="2"' in await page.html()
        await page.click('form[action="/actions/run"] button', then="/actions")
        print("screenshot:", await page.screenshot(tmp_path / "3-audit.png"))

        async def cancelled() -> bool:
            return set((await statuses(database_url, waiting)).values()) == {"cancelled"}

        await eventually(cancelled, what="both runs cancelled")
        (row,) = await store_rows(database_url, f"select * from {STORE}.page_actions")
        assert (row["who"], row["action"], row["acted"]) == ("bea", "cancel", 2)
        assert token not in await page.html()
