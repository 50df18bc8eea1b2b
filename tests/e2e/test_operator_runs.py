"""The operator's run list (`/runs`) from a real daemon, as headless Chromium renders it.

Filters (status, play, release, queue, age, error text) select what the store
holds; keyset pages follow each other without a gap or a repeat; bad fields get
one sentence; without ``LANE_WORKER_PAGE_TOKEN`` the page shows no action form.
Screenshots go to the test's tmp dir (the path is printed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import asyncpg

from support.daemon import Daemons, queue_of
from support.page import dump_dom, parse_fields, screenshot
from support.runtime import eventually, open_client

A = "oppage_list_a"
IDLE = "oppage_list_idle"  # no worker: its runs stay queued
HOSTILE = '<b id="x">evil</b>&amp;"'
ENV_A = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "1"}


def listed(port: int, **query: str) -> tuple[list[str], Any]:
    """The run ids Chromium shows on ``/runs?query`` (in order) and the page's fields."""
    fields = parse_fields(dump_dom(f"http://127.0.0.1:{port}/runs?{urlencode(query)}"))
    runs = [str(attrs["data-run"]) for f, attrs, _ in fields.found if f == "data-run"]
    return runs, fields


async def statuses(database_url: str, run_ids: list[str]) -> dict[str, str]:
    """Each run's status in the store."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "select run_id::text, status from runtime_scheduler.runs"
            " where run_id = any($1::uuid[])",
            run_ids,
        )
    finally:
        await conn.close()
    return {r["run_id"]: r["status"] for r in rows}


async def test_run_list_filters_and_pages(database_url: str, tmp_path: Path) -> None:
    """5 failed, 3 completed and 4 waiting runs of one release: each filter lists exactly the
    runs the store says match, newest first; pages of 5 follow each other with no repeat."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV_A) as client:
        daemon = pool.start(A)
        await daemon.ready()
        port = daemon.health_port
        failed = [(await client.submit("flaky", {"n": n})).run_id for n in range(5)]
        done = [(await client.submit("plain", {"n": n})).run_id for n in range(3)]
        waiting = [(await client.submit("waiter", {"n": n})).run_id for n in range(4)]
        every = failed + done + waiting

        async def settled() -> bool:
            now = await statuses(database_url, every)
            return (
                [now[r] for r in failed] == ["failed"] * 5
                and [now[r] for r in done] == ["completed"] * 3
                and [now[r] for r in waiting] == ["waiting"] * 4
            )

        await eventually(settled, timeout_s=60, what="runs failed, completed and waiting")

        runs, fields = listed(port, release=A, limit="50")
        assert runs == every[::-1], "newest first, every run of the release"
        assert fields.text("nav")  # the top links
        assert "action" not in {f for f, _, _ in fields.found}, "no action form without a token"
        print("screenshot:", screenshot(f"http://127.0.0.1:{port}/runs?release={A}", tmp_path))

        assert listed(port, release=A, status="failed")[0] == failed[::-1]
        assert listed(port, release=A, status="open")[0] == waiting[::-1]
        assert listed(port, queue=queue_of(A), play="plain")[0] == done[::-1]
        errors, fields = listed(port, release=A, error="upstream is DOWN")
        assert errors == failed[::-1]
        assert all("upstream is down" in t for t in fields.text("error"))
        assert listed(port, release=A, error="100%_")[0] == []  # % and _ are literal
        assert listed(port, release=A, newer="1h")[0] == every[::-1]
        assert listed(port, release=A, older="1h")[0] == []
        assert listed(port, run=failed[2])[0] == [failed[2]]  # the run page's "act on it"

        # Keyset pages of 5: 5, 5, 2, no repeat, no gap, and no "older" link on the last.
        seen: list[str] = []
        query: dict[str, str] = {"release": A, "limit": "5"}
        for size in (5, 5, 2):
            page, fields = listed(port, **query)
            assert len(page) == size
            seen += page
            nexts = [a for f, a, _ in fields.found if f == "next"]
            if size < 5:
                assert nexts == []
            else:
                query = dict(parse_qsl(urlsplit(str(nexts[0]["href"])).query))
        assert seen == every[::-1]

        # A hostile play name stays text.
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": IDLE}) as idle:
            hostile = (await idle.submit(HOSTILE, {})).run_id
        runs, fields = listed(port, play=HOSTILE)
        assert runs == [hostile]
        assert fields.text("play") == [HOSTILE]
        assert "b" not in fields.tags

        # A bad field: one sentence, status 400, the form kept.
        bad, fields = listed(port, status="stuck")
        assert bad == []
        assert fields.first("problem").startswith("status is one of")
        assert listed(port, newer="soon")[1].first("problem").startswith("newer is an age")
        assert listed(port, before="x")[1].first("problem").startswith("before is the place")
