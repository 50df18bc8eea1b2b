"""Adversarial review of the operator page's actions (wt-attack): defects, as failing tests.

Each test is marked ``xfail(strict=True)``: it fails on the code under review and
must pass once the defect is fixed (then the mark goes).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
from e2e.test_operator_actions import (
    STORE,
    Operator,
    confirm,
    finished_action,
    form,
    statuses,
    store_rows,
)

from support.daemon import Daemons
from support.runtime import eventually, open_client
from worker.ops.run_list import MAX_BULK

IDLE = "atk_page_idle"  # no worker serves it: its runs stay queued


async def test_a_name_holding_the_token_never_reaches_a_page_or_the_store(
    database_url: str, tmp_path: Path
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    release = "atk_page_who"
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release}) as client,
    ):
        daemon = pool.start(release, LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        op = Operator(daemon.health_port, tmp_path)
        waiting = [(await client.submit("waiter", {"n": n})).run_id for n in range(2)]
        for run_id in waiting:
            await daemon.wait_for("run.parked", run_id=run_id)
        # A careless operator pastes "name token" into the name field (and the token too).
        status, _, _ = await op.post("/signin", {"who": f"ana {token}", "token": token})
        if status != 303:
            return  # refused at sign-in: nothing kept (the fix may take this way)
        listed = await op.get(f"/runs?release={release}&status=waiting")
        bulk = form(listed, "/actions/preview")
        action_id, _ = await confirm(op, {**bulk, "action": "cancel"}, "cancel")
        await finished_action(database_url, action_id)
        anyone = Operator(daemon.health_port, tmp_path)  # not signed in
        trail = await anyone.get("/actions")
        rows = await store_rows(
            database_url,
            f"select who from {STORE}.page_actions union all "
            f"select fact::text from {STORE}.ledger where run_id = any($1::uuid[])",
            waiting,
        )
        assert token not in trail
        assert not [r for r in rows if token in str(r[0])]


async def test_the_sign_in_throttle_tells_no_guess_apart(database_url: str) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    async with Daemons(database_url) as pool:
        daemon = pool.start("atk_page_guess", LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        op = Operator(daemon.health_port, Path("."))
        for _ in range(20):
            assert (await op.post("/signin", {"who": "eve", "token": "y" * 20}))[0] == 403
        wrong = (await op.post("/signin", {"who": "z" * 36, "token": ""}))[0]
        right = (await op.post("/signin", {"who": token, "token": ""}))[0]
        assert wrong == 429
        assert right == wrong, "a guess of the token is answered apart while throttled"


async def test_a_confirmation_never_acts_on_a_run_the_preview_did_not_count(
    database_url: str, tmp_path: Path
) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    release = "atk_page_swap"
    async with (
        Daemons(database_url) as pool,
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}) as idle,
    ):
        daemon = pool.start(release, LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        op = Operator(daemon.health_port, tmp_path)
        assert (await op.post("/signin", {"who": "ana", "token": token}))[0] == 303
        seen = (await idle.submit("plain", {"n": 1})).run_id

        async def older_than(run_id: str, seconds: int) -> bool:
            rows = await store_rows(
                database_url,
                f"select now() - created_at > make_interval(secs => $2) from {STORE}.runs "
                "where run_id = $1::uuid",
                run_id,
                seconds,
            )
            return bool(rows[0][0])

        await eventually(lambda: older_than(seen, 3), what="the first run 3 s old")
        unseen = (await idle.submit("plain", {"n": 2})).run_id  # too young for the filter
        listed = await op.get(f"/runs?release={IDLE}&status=queued&older=3s")
        bulk = {**form(listed, "/actions/preview"), "action": "cancel"}
        status, body, _ = await op.post("/actions/preview", bulk)
        assert (status, 'data-count="1"' in body) == (200, True)  # the preview counts one
        confirmation = form(body, "/actions/run")
        await idle.cancel(seen)  # it leaves the filter
        await eventually(lambda: older_than(unseen, 3), what="the second run 3 s old")
        status, body, response = await op.post("/actions/run", confirmation)
        if status == 303:
            await finished_action(database_url, int(response.headers["Location"].rsplit("-", 1)[1]))
        assert (await statuses(database_url, [unseen]))[unseen] == "queued"


async def test_a_malformed_form_gets_one_sentence_and_no_traceback(database_url: str) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    async with Daemons(database_url) as pool:
        daemon = pool.start("atk_page_form", LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        base = f"http://127.0.0.1:{daemon.health_port}"
        headers = {
            "Origin": base,
            "Content-Type": "application/x-www-form-urlencoded; charset=bogus-charset",
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{base}/signin", data=b"who=a&token=b", headers=headers) as response,
        ):
            status, body = response.status, await response.text()
        assert status == 400, body
        raw = [r["raw"] for r in daemon.records if r.get("event") is None and "raw" in r]
        assert not [line for line in raw + daemon.stderr_lines if "Traceback" in line]


async def test_a_confirmation_over_the_bulk_limit_is_refused(database_url: str) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    release = "atk_page_many"
    idle = "atk_page_many_idle"
    async with Daemons(database_url) as pool:
        daemon = pool.start(release, LANE_WORKER_PAGE_TOKEN=token)
        await daemon.ready()
        await store_rows(
            database_url,
            f"select {STORE}.submit_runs((select jsonb_agg(jsonb_build_object("
            "'play', 'plain', 'releaseId', $1::text)) from generate_series(1, $2)))",
            idle,
            MAX_BULK + 2,
        )
        op = Operator(daemon.health_port, Path("."))
        assert (await op.post("/signin", {"who": "ana", "token": token}))[0] == 303
        listed = await op.get(f"/runs?release={idle}&status=queued")
        bulk = {**form(listed, "/actions/preview"), "action": "cancel"}
        status, body, _ = await op.post("/actions/preview", bulk)
        assert status == 400, body  # the preview refuses: too many
        # A confirmation form filled in by hand (or replayed from a narrower filter's).
        asof = (await store_rows(database_url, "select now()::text"))[0][0].replace(" ", "T")
        forged = {**bulk, "asOf": asof, "seen": str(10 * MAX_BULK)}
        status, body, _ = await op.post("/actions/run", forged)
        # No preview counted these runs: refused, nothing done (the preview is gone or
        # was never made), however many the form says were seen.
        assert status == 409, body
        assert "preview the action again" in body
        cancelled = await store_rows(
            database_url,
            f"select count(*) filter (where status = 'cancelled'), count(*) from {STORE}.runs"
            " where release_id = $1",
            idle,
        )
        assert tuple(cancelled[0]) == (0, MAX_BULK + 2)
