"""The text listing of `runs` keeps each run on one line of bounded width (review F4, defect 10).

A play name is the app's text: `submit_run` accepts a line break in it, and a
direct write can make it 100,000 characters long.
"""

from __future__ import annotations

import uuid

from support.cli import lane_worker
from support.db import execute
from support.runtime import SCHEMA, open_client

REL = "runs-listing-text-1"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": REL}


async def test_runs_escapes_control_characters_and_cuts_long_play_names(
    database_url: str,
) -> None:
    async with open_client(database_url, ENV) as client:
        split = (await client.submit("plain", {})).run_id
        long = (await client.submit("plain", {})).run_id
    for run_id, play in ((split, "two\nlines"), (long, "p" * 100_000)):
        await execute(
            database_url, f"update {SCHEMA}.runs set play = $2 where run_id = $1",
            uuid.UUID(run_id), play,
        )  # fmt: skip
    listed = await lane_worker(database_url, "runs", "--lane", REL)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3, lines  # the header and one line per run
    assert "'two\\nlines'" in listed.stdout
    assert all(len(line) < 400 for line in lines), [len(line) for line in lines]
    assert "p" * 100 + "..." in listed.stdout
