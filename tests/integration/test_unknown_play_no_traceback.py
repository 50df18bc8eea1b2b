"""A run naming a play its release does not register fails without a traceback (issue 31):
the frames would be only lane-worker's own, which tell a user nothing; the message says it."""

from __future__ import annotations

from test_run_tracebacks_shown import ENV, RELEASE, traced_app

from support.cli import lane_worker
from support.db import attempt_rows
from support.runtime import open_client, open_runtime, work_once


async def test_an_unknown_play_fails_with_its_message_and_no_traceback(database_url: str) -> None:
    async with (
        open_client(database_url, ENV) as client,
        open_runtime(database_url, traced_app(), RELEASE, unknown_play_grace_s=0) as rt,
    ):
        run_id = (await client.submit("no-such-play")).run_id
        assert await work_once(rt) == ["failed"]
        status = await client.status(run_id)
    [attempt] = await attempt_rows(database_url, run_id)
    for error in (status.error, attempt["error"]):
        assert error["name"] == "UnknownPlayError", error
        assert "'no-such-play' is not registered in release trace-a" in error["message"]
        assert "traceback" not in error, error
    shown = await lane_worker(database_url, "status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "is not registered in release trace-a" in shown.stdout
    assert "Traceback" not in shown.stdout
