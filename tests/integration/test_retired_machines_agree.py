"""The lanes page and `releases` count a retired release's machines from one source (issue 31:
the page said 0/1, the deployed count, while `releases` said 0/0, the scaler's target)."""

from __future__ import annotations

import re

from support.cli import lane_worker
from support.runtime import open_client
from worker.daemon.page import render
from worker.db.pool import Connection
from worker.ops.report import read_report


async def test_a_retired_release_wants_the_same_machines_on_the_page_and_in_releases(
    database_url: str,
) -> None:
    async with open_client(database_url) as client:
        await client.releases.deploy("rel-old", image="i:1", machines=1)
        await client.releases.deploy("rel-new", image="i:2", machines=1)
        registry = client.store.registry

        async def retire_and_beat(conn: Connection) -> None:
            assert await registry.retire_superseded(conn, actor="test") == ["rel-old"]
            # An active scaler's word: the retired release's lane is drained, its target 0.
            await registry.scaler_beat(
                conn,
                holder="test-scaler",
                backend="process",
                releases={
                    "rel-old": {"running": 0, "target": 0, "ready": 0},
                    "rel-new": {"running": 1, "target": 1, "ready": 1},
                },
            )

        await client.db.run(retire_and_beat)
        views = await client.db.run(lambda c: read_report(c, client.store))
    html = render(views)
    row = re.search(r'<tr data-queue="runs_rel_old".*?</tr>', html, re.S)
    assert row is not None, html
    cell = re.search(r'data-field="machines">(\d+)/(\d+)', row.group(0))
    assert cell is not None, row.group(0)
    page_wanted = int(cell.group(2))

    said = await lane_worker(database_url, "releases")
    assert said.returncode == 0, said.stderr
    [line] = [ln for ln in said.stdout.splitlines() if ln.startswith("rel-old ")]
    releases_wanted = int(line.split()[2].split("/")[1])
    assert (page_wanted, releases_wanted) == (0, 0), (row.group(0), said.stdout)
