"""Stored values the operator's views cannot read, or of an unexpected shape, shown as such.

Each value is written straight to its table (as an older store or a newer build
could): `status` (text and --json) and the run page still show the run,
naming the value that cannot be read and why (review F4, defect 3).
"""

from __future__ import annotations

import uuid
from typing import Any

from support.cli import lane_worker
from support.db import execute
from support.runtime import SCHEMA, open_client
from worker.daemon.run_page import render_run
from worker.ops.run_view import RunView, read_run

REL = "unreadable-display-1"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": REL}
DEEP = "[" * 3000 + "1" + "]" * 3000


async def write(database_url: str, column: str, run_id: str, text: str) -> None:
    await execute(
        database_url,
        f"update {SCHEMA}.runs set {column} = $2::text::jsonb where run_id = $1",
        uuid.UUID(run_id),
        text,
    )


async def page_of(database_url: str, run_id: str) -> str:
    async with open_client(database_url, ENV) as client:
        store = client.store

        async def read(conn: Any) -> RunView | None:
            return await read_run(conn, store, uuid.UUID(run_id))

        view = await client.db.run(read)
    assert view is not None
    return render_run(view)


async def test_status_and_the_run_page_show_a_run_whose_output_or_error_cannot_be_read(
    database_url: str,
) -> None:
    async with open_client(database_url, ENV) as client:
        run_id = (await client.submit("plain", {})).run_id
    for column, said in (("output", "the output"), ("error", "the error")):
        await write(database_url, column, run_id, DEEP)
        text = await lane_worker(database_url, "status", run_id)
        assert text.returncode == 0, text.stderr
        assert f"{said} cannot be read back" in text.stdout
        assert "nested too deeply" in text.stdout
        as_json = await lane_worker(database_url, "status", run_id, "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert "unreadable JSON" in as_json.stdout
        assert run_id in as_json.stdout
        page = await page_of(database_url, run_id)
        assert f"{said} cannot be read back" in page
        assert run_id in page
        await execute(
            database_url, f"update {SCHEMA}.runs set {column} = null where run_id = $1",
            uuid.UUID(run_id),
        )  # fmt: skip


async def test_the_run_page_shows_a_wait_it_cannot_read_or_that_is_not_an_object(
    database_url: str,
) -> None:
    async with open_client(database_url, ENV) as client:
        run_id = (await client.submit("plain", {})).run_id
    for stored, said in (
        (DEEP, "the stored wait cannot be read back"),
        ('"x"', "the stored wait is not an object"),
        ('{"kind": "sleep", "wakeAtMs": 1e30}', "an impossible time"),
    ):
        await write(database_url, "current_wait", run_id, stored)
        page = await page_of(database_url, run_id)
        assert said in page, stored[:40]
