"""Scaling the current release to 0 machines (issue 31): no machine of it runs, and no
machine of an older release is booted for parked runs the current one adopts once it runs
again. Real scaler, real machines (the process backend)."""

from __future__ import annotations

from pathlib import Path

from support.machines import store_backend
from support.runtime import eventually, open_client
from support.scaler import machine_events, passes_seen, scaler_running
from worker.scaler.plan import PAUSED_WORD

APP = "support.apps.basic:app"


async def test_scaling_the_current_release_to_zero_boots_no_older_release(
    database_url: str, tmp_path: Path
) -> None:
    """A parked on A, B ready (A drained: B may adopt it, A's machine removed), B scaled to
    0: the run waits for B, A gets no machine; B scaled up again adopts and runs it."""
    state = tmp_path / "machines"
    async with (
        scaler_running(database_url, state, tmp_path / "scaler.log"),
        open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "zero-a"}) as c,
    ):
        backend = await store_backend(database_url, state)
        await c.releases.deploy("zero-a", image=APP, machines=1)
        assert (await c.releases.wait_rolled_out("zero-a", timeout_s=60)).done
        waiter = (await c.submit("waiter", {})).run_id

        async def parked() -> bool:
            return (await c.status(waiter)).status == "waiting"

        await eventually(parked, timeout_s=30, what="the run parked on A")
        await c.releases.deploy("zero-b", image=APP, machines=1)
        rolled = await c.releases.wait_rolled_out("zero-b", timeout_s=60)
        assert rolled.done, rolled.reason

        async def only_b() -> bool:
            return [m.release_id for m in await backend.list()] == ["zero-b"]

        await eventually(only_b, timeout_s=60, what="A's machine removed once drained")
        await c.releases.deploy("zero-b", image=APP, machines=0)

        async def none_running() -> bool:
            return not [m for m in await backend.list() if m.running]

        await eventually(none_running, timeout_s=60, what="B's machine stopped")
        await passes_seen(database_url, 5)
        paused = [m for m in await backend.list() if m.running]
        a_created = await machine_events(database_url, "zero-a", "machine_created")
        views, _ = await c.releases.list()
        a_word = next(v.scaler for v in views if v.release_id == "zero-a")
        assert (await c.status(waiter)).status == "waiting"

        await c.releases.deploy("zero-b", image=APP, machines=1)
        again = await c.releases.wait_rolled_out("zero-b", timeout_s=60)
        assert again.done, again.reason
        await c.signal(waiter, "go", {"by": "test"})
        final = await c.wait(waiter, 60)
        a_created_after = await machine_events(database_url, "zero-a", "machine_created")
    assert not paused, paused
    assert len(a_created) == 1, a_created  # A's first machine only: none after the scale
    assert PAUSED_WORD in a_word["actions"], a_word
    assert final.status == "completed", final
    assert final.output["release"] == "zero-b"  # adopted by B once it ran again
    assert len(a_created_after) == 1, a_created_after
