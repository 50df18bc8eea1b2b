"""How the supervisor's side loops treat an error: an outage is retried, anything else crashes."""

from __future__ import annotations

import asyncpg
from structlog.testing import capture_logs

from worker.app import App
from worker.config.settings import Settings
from worker.daemon.supervisor import EXIT_FAILURE, Supervisor

ENV = {
    "WORKFLOW_RUNTIME_POSTGRES": "postgresql://lane@127.0.0.1:1/runtime",
    "DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-a",
}


def supervisor() -> Supervisor:
    """A supervisor that has not booted (no database)."""
    return Supervisor(Settings.from_env(ENV), App())


async def test_a_database_outage_is_retried_with_readiness_false_until_a_pass_succeeds() -> None:
    """A transient error keeps the loop going, shows on /readyz, and clears on the next success."""
    sup = supervisor()

    async def refused() -> None:
        raise ConnectionRefusedError("connection refused")

    async def fine() -> None:
        return None

    with capture_logs() as lines:
        assert await sup._side_pass("heartbeat", refused) is True
    assert [line["event"] for line in lines] == ["worker.heartbeat_failed"]
    report = await sup._readiness()
    assert report["ready"] is False
    assert report["sideLoopOutages"] == {"heartbeat": "ConnectionRefusedError"}
    assert not sup.stop_requested.is_set()

    assert await sup._side_pass("heartbeat", fine) is True
    assert (await sup._readiness())["sideLoopOutages"] == {}
    assert sup.exit_code == 0


async def test_an_unexpected_error_ends_the_loop_and_stops_the_worker_with_exit_1() -> None:
    """A non-transient error (here a schema error) logs one crash event and requests the drain."""
    sup = supervisor()

    async def broken() -> None:
        raise asyncpg.UndefinedColumnError('column "heartbeat_at" does not exist')

    with capture_logs() as lines:
        assert await sup._side_pass("lane_refresh", broken) is False
    [crash] = lines
    assert crash["event"] == "worker.side_loop_crashed"
    assert crash["log_level"] == "error"
    assert crash["loop"] == "lane_refresh"
    assert "heartbeat_at" in crash["error"]
    assert sup.stop_requested.is_set()
    assert sup.exit_code == EXIT_FAILURE
