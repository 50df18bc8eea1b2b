"""Stop signals to a lone daemon that the other e2e tests leave out (issue 30 item 5 review).

SIGHUP mid-step drains as a first SIGTERM does (the run handed back, no attempt
spent); a second SIGHUP during that drain is ignored; SIGINT then exits at once
with 1. Ctrl-C twice exits at once too; and a stop during boot, before the
receiver runs, ends the process by the signal's default action, claiming nothing.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from support.daemon import Daemons
from support.runtime import eventually, open_client

RELEASE = "sig-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}


def _lines_in(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def _started(path: Path) -> None:
    async def started() -> bool:
        return _lines_in(path) >= 1

    await eventually(started, what=f"{path.name} to be written")


@pytest.mark.timeout(180)
async def test_sighup_drains_a_second_sighup_is_ignored_and_sigint_then_exits_now(
    database_url: str, tmp_path: Path
) -> None:
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="3600")
        await d.ready()
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 3600})
        await _started(tmp_path / "two.log")
        d.proc.send_signal(signal.SIGHUP)
        await d.wait_for("worker.stopping", timeout_s=60)
        d.proc.send_signal(signal.SIGHUP)
        await d.wait_for("worker.signal", signal="SIGHUP", already_stopping=True, timeout_s=60)
        assert d.running, "a SIGHUP during the drain ended it"
        d.interrupt()
        assert await d.wait_exit(timeout_s=60) == 1
        assert d.events("worker.exit_now")
        assert not d.events("run.handed_back")
        status = await client.status(run.run_id)
        assert [a.outcome for a in status.attempts] == [None]


@pytest.mark.timeout(180)
async def test_sighup_mid_step_hands_the_run_back_on_attempt_1(
    database_url: str, tmp_path: Path
) -> None:
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="1")
        await d.ready()
        run = await client.submit("slow", {"dir": str(tmp_path), "seconds": 3600})
        await _started(tmp_path / "two.log")
        d.proc.send_signal(signal.SIGHUP)
        assert await d.wait_exit(timeout_s=60) == 0
        status = await client.status(run.run_id)
        assert [(a.attempt, a.outcome) for a in status.attempts] == [(1, "handed_back")]
        assert status.status == "queued"


@pytest.mark.timeout(180)
async def test_ctrl_c_twice_exits_at_once(database_url: str, tmp_path: Path) -> None:
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="3600")
        await d.ready()
        await client.submit("slow", {"dir": str(tmp_path), "seconds": 3600})
        await _started(tmp_path / "two.log")
        d.interrupt()
        await d.wait_for("worker.stopping", timeout_s=60)
        d.interrupt()
        assert await d.wait_exit(timeout_s=60) == 1
        assert d.events("worker.exit_now")
        assert not d.events("worker.stopped")


@pytest.mark.timeout(180)
async def test_sigterm_during_boot_ends_the_process_by_the_default_action(
    database_url: str,
) -> None:
    """Boot held in the connect (a server that accepts and never answers): SIGTERM there is
    the signal's default action, as before the stop rules were one table."""
    accepted: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # never answers: the daemon's connect waits

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with Daemons(database_url) as pool:
            d = pool.start(
                RELEASE, WORKFLOW_RUNTIME_POSTGRES=f"postgresql://u:hunter2@127.0.0.1:{port}/x"
            )

            async def connecting() -> bool:
                return bool(accepted)

            await eventually(connecting, timeout_s=60, what="the daemon to connect")
            d.terminate()
            assert await d.wait_exit(timeout_s=60) == -signal.SIGTERM
            assert not d.events("worker.ready")
            assert "hunter2" not in d.stderr + d.tail()
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
