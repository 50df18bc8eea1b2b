"""The lanes page through a rolling deploy driven by the scaler (process backend).

At each step of the roll (A current; B deployed, not yet ready; B ready and A
draining with a parked and a retrying run; A drained) headless Chromium loads
the page from a live machine's worker, and the page must mark the current
release, show desired and live machines, never tell anyone to retire the
current release, say when it was read, and list the open runs.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from support.daemon import queue_of
from support.machines import destroy_all, store_backend
from support.page import LaneRows, dump_dom, open_runs, parse_fields
from support.runtime import eventually, open_client
from support.scaler import machine_health_port, start_scaler
from worker.client import LaneClient
from worker.scaler.backend import Machine
from worker.scaler.process import ProcessBackend

APP = "support.apps.basic:app"
A, B = "roll-page-a", "roll-page-b"


class Roll:
    """The scaler, its machines, and the page as one of their workers serves it."""

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.database_url = database_url
        self.state = tmp_path / "machines"
        self.log = tmp_path / "scaler.log"
        self._backend: ProcessBackend | None = None
        self.scaler: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the scaler (again)."""
        self.scaler = start_scaler(self.database_url, self.state, self.log)

    def stop(self) -> None:
        """Stop the scaler; its machines keep running."""
        if self.scaler is not None:
            self.scaler.send_signal(signal.SIGTERM)
            self.scaler.wait(timeout=30)
            self.scaler = None

    async def machines(self) -> list[Machine]:
        """The machines the scaler made (listed as its store's)."""
        if self._backend is None:
            self._backend = await store_backend(self.database_url, self.state)
        return await self._backend.list()

    async def port_of(self, release_id: str) -> int:
        """The health port of a running machine of ``release_id`` (once its worker is ready)."""

        async def port() -> int | None:
            for m in await self.machines():
                if m.release_id == release_id and m.running:
                    found = machine_health_port(self.state, m.machine_id)
                    if found is not None:
                        return found
            return None

        found: int = await eventually(port, timeout_s=60, what=f"a ready machine of {release_id}")
        return found

    async def page(
        self, release_id: str, until: Callable[[LaneRows], bool]
    ) -> tuple[LaneRows, dict[str, dict[str, Any]], str]:
        """The page from a machine of ``release_id`` once ``until`` holds for its lane rows
        (the report is reused for 2 s): its rows, open runs, and all its text."""
        port = await self.port_of(release_id)

        async def load() -> tuple[LaneRows, dict[str, dict[str, Any]], str] | None:
            dom = dump_dom(f"http://127.0.0.1:{port}/")
            rows = LaneRows()
            rows.feed(dom)
            return (rows, open_runs(dom), dom) if until(rows) else None

        loaded: tuple[LaneRows, dict[str, dict[str, Any]], str] = await eventually(
            load, timeout_s=30, what=f"the page from {release_id} to show the step"
        )
        return loaded

    async def close(self) -> None:
        """Stop the scaler and remove every machine."""
        self.stop()
        await destroy_all(self.state)


def machines(row: dict[str, Any]) -> tuple[int, int]:
    """(live, desired) from a lane row's machines cell (the scaler's word is apart)."""
    found = re.fullmatch(r"(\d+)/(\d+)", row["text"]["machines"])
    assert found, row["text"]
    return int(found[1]), int(found[2])


def assert_fresh_as_of(dom: str) -> None:
    """The page says when its report was read: a moment ago."""
    said = parse_fields(dom).first("asOf")
    as_of = datetime.strptime(said, "%Y-%m-%d %H:%M:%S %Z").replace(tzinfo=UTC)
    assert abs(datetime.now(UTC) - as_of) < timedelta(seconds=60), said


def assert_current_not_told_to_retire(dom: str, current: str) -> None:
    """No lane's remedy tells the operator to retire the current release."""
    assert f"lanes retire {current}" not in dom


async def roles(client: LaneClient) -> dict[str, tuple[str, int, int]]:
    """Each deployed release: (role, live workers, ready workers)."""
    views, _ = await client.releases.list()
    return {v.release_id: (v.role, v.live_workers, v.ready_workers) for v in views}


async def test_the_page_through_a_rolling_deploy(database_url: str, tmp_path: Path) -> None:
    """A current; B deployed, not ready; B ready, A draining (parked, retrying); A drained."""
    roll = Roll(database_url, tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    roll.start()
    try:
        # Attempts enough for the gated run to keep retrying until the test opens its gate.
        env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": A, "LANE_WORKER_MAX_ATTEMPTS": "20"}
        async with open_client(database_url, env) as c:
            await c.releases.deploy(A, image=APP, machines=1)

            async def ready(release: str) -> bool:
                return (await roles(c)).get(release, ("", 0, 0))[2] == 1

            await eventually(lambda: ready(A), timeout_s=60, what="A's machine ready")
            waiter = (await c.submit("waiter", {})).run_id

            async def parked() -> bool:
                return (await c.status(waiter)).status == "waiting"

            await eventually(parked, timeout_s=30, what="A's run parked")

            # 1. A is the current release.
            rows, listed, dom = await roll.page(A, lambda p: queue_of(A) in p.rows)
            a = rows.rows[queue_of(A)]
            assert a["text"]["role"] == "current"
            assert a["status"] == "claiming"
            assert machines(a) == (1, 1)
            assert listed[queue_of(A)]["runs"] == [waiter]
            assert_fresh_as_of(dom)
            assert_current_not_told_to_retire(dom, A)

            # 2. B deployed; no scaler acts yet, so B has no machine and A still claims.
            roll.stop()
            await c.releases.deploy(B, image=APP, machines=1)
            rows, listed, dom = await roll.page(
                A,
                lambda p: (
                    p.rows[queue_of(A)]["text"]["role"] == "superseded" and queue_of(B) in p.rows
                ),
            )
            a = rows.rows[queue_of(A)]
            assert a["text"]["role"] == "superseded"
            assert a["status"] == "claiming"
            assert machines(a) == (1, 1)
            # B's lane has no worker yet: shown as the current release, with no machine.
            b = rows.rows[queue_of(B)]
            assert b["text"]["role"] == "current"
            assert b["status"] == "claiming"
            assert machines(b) == (0, 1)
            assert listed[queue_of(A)]["runs"] == [waiter]
            assert_fresh_as_of(dom)
            assert_current_not_told_to_retire(dom, B)
            # A run that fails until the test opens its gate: A's own worker retries it
            # (backoff 1, 2, 4, 8, 16 s), so A drains only once it has passed.
            retrying = (await c.submit("gated", {"dir": str(gate)})).run_id

            async def retrying_now() -> bool:
                return (await c.status(retrying)).status == "retrying"

            await eventually(retrying_now, timeout_s=30, what="the gated run retrying")

            # 3. The scaler starts B's machine, and retires A once B is ready.
            roll.start()

            async def a_retired() -> bool:
                return (await roles(c)).get(A, ("",))[0] == "retired" and await ready(B)

            await eventually(a_retired, timeout_s=90, what="B ready and A retired")
            # Read between two of the gated run's attempts: while one is in flight the
            # page rightly files that run under inFlight.
            rows, listed, dom = await roll.page(
                B,
                lambda p: (
                    p.rows[queue_of(A)]["status"] == "draining"
                    and p.rows[queue_of(A)]["reasons"] == ["retrying"]
                ),
            )
            a, b = rows.rows[queue_of(A)], rows.rows[queue_of(B)]
            assert b["text"]["role"] == "current"
            assert b["status"] == "claiming"
            assert machines(b) == (1, 1)
            assert a["text"]["role"] == "retired"
            assert a["status"] == "draining"  # the retrying run is A's own to finish
            assert machines(a)[0] == 1  # kept while it drains
            assert a["reasons"] == ["retrying"]
            on_a = dict(zip(listed[queue_of(A)]["runs"], listed[queue_of(A)]["buckets"],
                            strict=True))  # fmt: skip
            assert on_a == {waiter: "parkedEvent", retrying: "retrying"}
            assert_fresh_as_of(dom)
            assert_current_not_told_to_retire(dom, B)

            # 4. The retry passes, the parked run is adopted by B: A drains, its machine goes.
            (gate / "open").touch()
            await c.signal(waiter, "go", {"by": "test"})
            for run_id in (waiter, retrying):
                assert (await c.wait(run_id, 90)).status == "completed"

            async def a_removed() -> bool:
                return not [m for m in await roll.machines() if m.release_id == A]

            await eventually(a_removed, timeout_s=60, what="A's machine removed")
            rows, listed, dom = await roll.page(
                B, lambda p: p.rows[queue_of(A)]["status"] == "drained"
            )
            a, b = rows.rows[queue_of(A)], rows.rows[queue_of(B)]
            assert a["status"] == "drained"
            assert a["safe"] == "yes"
            assert machines(a)[0] == 0
            assert b["text"]["role"] == "current"
            assert machines(b) == (1, 1)
            assert queue_of(A) not in listed  # no open run left on A
            assert_fresh_as_of(dom)
            assert_current_not_told_to_retire(dom, B)
    finally:
        await roll.close()
