"""A rolling deploy driven by the scaler with the process backend: real machines, real daemons.

Release A runs on two machines with parked and waiting runs; B is deployed: the
scaler starts B's machine, retires A only once B is ready, B adopts A's parked runs,
and A's machines are stopped and removed once A is drained. Every run completes
once. A second scaler waits as a standby; a machine the scaler did not create is
never touched.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from support.daemon import base_env
from support.db import fetch
from support.machines import destroy_all, store_backend
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import events, start_scaler
from worker.client import LaneClient
from worker.ops.releases import RolloutState
from worker.scaler.backend import Machine

APP = "support.apps.basic:app"


async def roles(client: LaneClient) -> dict[str, tuple[str, int, int]]:
    views, _ = await client.releases.list()
    return {v.release_id: (v.role, v.live_workers, v.ready_workers) for v in views}


async def test_a_rolling_deploy_with_the_process_backend(database_url: str, tmp_path: Path) -> None:
    """Deploy A (2), runs parked on A, deploy B: retire after B is ready, A removed once drained."""
    state = tmp_path / "machines"
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, state, log)
    standby = start_scaler(database_url, state, tmp_path / "standby.log")
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "roll-a"}) as c:
            backend = await store_backend(database_url, state)
            await c.releases.deploy("roll-a", image=APP, machines=2)

            async def a_ready() -> bool:
                return (await roles(c)).get("roll-a", ("", 0, 0))[2] == 2

            await eventually(a_ready, timeout_s=60, what="A's two machines ready")
            sleepers = [(await c.submit("sleeper", {"seconds": 10})).run_id for _ in range(3)]
            waiter = (await c.submit("waiter", {})).run_id

            async def parked() -> bool:
                return all([(await c.status(r)).status == "waiting" for r in [*sleepers, waiter]])

            await eventually(parked, timeout_s=30, what="A's runs parked")

            await c.releases.deploy("roll-b", image=APP, machines=1)
            state_now = await c.releases.wait_rolled_out("roll-b", timeout_s=60)
            assert state_now.done, state_now.reason
            await c.signal(waiter, "go", {"by": "test"})
            for run_id in [*sleepers, waiter]:
                final = await c.wait(run_id, 60)
                assert final.status == "completed", (run_id, final)
            finals = [await c.status(r) for r in sleepers]

            async def a_removed() -> bool:
                return not [m for m in await backend.list() if m.release_id == "roll-a"]

            await eventually(a_removed, timeout_s=60, what="A's machines removed")
            assert [m.release_id for m in await backend.list()] == ["roll-b"]
        record = await fetch(
            database_url,
            f"select release_id, action from {SCHEMA}.deployment_events order by event_id",
        )
    finally:
        for process in (scaler, standby):
            process.send_signal(signal.SIGTERM)
        for process in (scaler, standby):
            process.wait(timeout=30)
        await destroy_all(state)
    steps = [(e["release_id"], e["action"]) for e in record]
    b_created = steps.index(("roll-b", "machine_created"))
    a_retired = steps.index(("roll-a", "retired"))
    assert b_created < a_retired  # retired only after B's machine was started (and ready)
    a_stops = [i for i, s in enumerate(steps) if s[0] == "roll-a" and s[1] == "machine_stopped"]
    assert len(a_stops) == 2
    assert min(a_stops) > a_retired
    assert [f.output["after"] for f in finals] == ["roll-b"] * 3, [
        (f.adopted_release_id, f.attempts) for f in finals
    ]  # B adopted A's parked runs
    assert all(f.output["before"] == "roll-a" for f in finals)
    # One of the two was active, the other waited as a standby.
    said = [[e.get("event") for e in events(p)] for p in (log, tmp_path / "standby.log")]
    assert sorted("scaler.standby" in s for s in said) == [False, True], said


async def test_a_release_whose_machines_cannot_boot_is_reported_and_not_recreated_every_pass(
    database_url: str, tmp_path: Path
) -> None:
    """An image (app) that does not load: deploy --wait says why; machines are retried slower."""
    state = tmp_path / "machines"
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, state, log)
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "bad"}) as c:
            await c.releases.deploy("roll-bad", image="support.apps.nowhere:app", machines=1)
            # The window the machine count below covers (12 s).
            await c.releases.wait_rolled_out("roll-bad", timeout_s=12)
            created = await fetch(
                database_url,
                f"select count(*) as n from {SCHEMA}.deployment_events"
                " where action = 'machine_created'",
            )
            # A busy machine may not have seen a refusal inside the window: wait for one.
            rolled = await eventually(
                lambda: refused_boot(c, "roll-bad"), what="the scaler to report a refused boot"
            )
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await destroy_all(state)
    assert not rolled.done
    assert rolled.reason is not None
    if rolled.final:  # two machines in a row exited 2: the wait ends (issue 31)
        assert "its machines cannot boot: 2 in a row exited 2" in rolled.reason, rolled.reason
        assert "could not load the app" in rolled.reason
        assert f"logs: {state}/m-" in rolled.reason  # where its log is
    else:
        assert "a machine refused to boot: machine m-" in rolled.reason, rolled.reason
        assert "exited 2 (its worker could not start" in rolled.reason
        assert f"see {state}/m-" in rolled.reason  # where its log is
    assert "support.apps.nowhere" in rolled.reason  # its last line says which module
    said = [e for e in events(log) if e.get("event") == "scaler.machine_destroyed"]
    assert said, log.read_text()[-2000:]
    assert all(e["exit_code"] == 2 for e in said)  # the app did not load: usage error
    # 12 s of passes every 2 s would be 6 machines; doubling waits (2, 4, 8 s) allow 4.
    assert 1 <= created[0]["n"] <= 4, created


async def refused_boot(client: LaneClient, release_id: str) -> RolloutState | None:
    """The rollout's state once it says a machine refused to boot (None before)."""
    state = await client.releases.rollout_state(release_id)
    said = state.reason or ""
    return state if "refused to boot" in said or "cannot boot" in said else None


async def test_a_new_image_of_the_current_release_replaces_its_machines_new_ones_first(
    database_url: str, tmp_path: Path
) -> None:
    """Deploy the current release again: a bad image leaves the old machine serving; a good
    one is started, and only once it is ready is the old machine stopped."""
    state = tmp_path / "machines"
    scaler = start_scaler(database_url, state, tmp_path / "scaler.log")
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "roll-img"}) as c:
            backend = await store_backend(database_url, state)
            await c.releases.deploy("roll-img", image=APP, machines=1)
            first = await c.releases.wait_rolled_out("roll-img", timeout_s=60)
            assert first.done, first.reason
            [old] = await backend.list()

            await c.releases.deploy("roll-img", image="support.apps.nowhere:app", machines=1)
            # Judged once the refusal is reported (not after 8 s, which a busy machine
            # can spend before the new machine has even failed).
            bad = await eventually(
                lambda: refused_boot(c, "roll-img"), what="the scaler to report a refused boot"
            )
            assert not bad.done
            assert bad.reason is not None
            assert "boot" in bad.reason, bad.reason
            still = {m.machine_id: m for m in await backend.list()}
            assert still[old.machine_id].running  # the old image keeps serving the lane
            done = (await c.submit("plain", {"n": 1})).run_id
            assert (await c.wait(done, 30)).status == "completed"

            renamed = "support.apps.renamed:app"
            await c.releases.deploy("roll-img", image=renamed, machines=1)
            good = await c.releases.wait_rolled_out("roll-img", timeout_s=90)
            assert good.done, good.reason
            machines = await backend.list()
            assert [m.image for m in machines] == [renamed], machines
            assert old.machine_id not in {m.machine_id for m in machines}
        steps = await fetch(
            database_url,
            f"select action, detail from {SCHEMA}.deployment_events"
            " where release_id = 'roll-img' order by event_id",
        )
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await destroy_all(state)
    made = [i for i, s in enumerate(steps) if s["action"] == "machine_created"
            and s["detail"]["image"] == renamed]  # fmt: skip
    old_stopped = [i for i, s in enumerate(steps) if s["action"] == "machine_stopped"
                   and s["detail"]["machine"] == old.machine_id]  # fmt: skip
    assert len(made) == 1, steps
    assert len(old_stopped) == 1, steps
    assert made[0] < old_stopped[0]
    assert "was replaced by support.apps.renamed:app" in steps[old_stopped[0]]["detail"]["reason"]


async def test_a_stopped_machine_is_tracked_while_its_worker_drains(
    database_url: str, tmp_path: Path
) -> None:
    """Stop reaches the worker once, through the machine's wrapper: the machine is listed as
    stopping while the worker finishes its step, then as stopped with exit 0; destroying a
    draining machine kills its worker."""
    state = tmp_path / "machines"
    env = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "30"}
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "wrap"}) as c:
            backend = await store_backend(database_url, state, env)

            async def draining(name: str) -> tuple[Machine, Path]:
                """A machine of release ``wrap`` stopped while a slow step of it runs."""
                machine = await backend.create("wrap", APP)
                steps = tmp_path / name
                steps.mkdir()
                await c.submit("slow", {"dir": str(steps), "seconds": 4})
                two = steps / "two.log"

                async def running() -> bool:
                    return two.exists()

                await eventually(running, timeout_s=60, what=f"{name}: step two running")
                await backend.stop(machine)
                [listed] = [m for m in await backend.list() if m.machine_id == machine.machine_id]
                assert listed.state == "stopping", listed  # its worker is still draining
                assert listed.stopping_s is not None
                return listed, two

            first, two = await draining("first")
            # The stop sent again, and to the wrapper's whole group (as a service
            # manager stopping the scaler would): the worker still gets one signal.
            await backend.stop(first)
            wrapper = json.loads((state / f"{first.machine_id}.pids").read_text())["wrapper"]
            os.killpg(os.getpgid(wrapper), signal.SIGTERM)

            async def stopped() -> Machine | None:
                found = {m.machine_id: m for m in await backend.list()}[first.machine_id]
                return found if found.state == "stopped" else None

            done = await eventually(stopped, timeout_s=40, what="the drained worker's exit")
            assert done.exit_code == 0
            assert len(two.read_text().splitlines()) == 1  # the step ran once, to its end
            said = [e for e in events(state / f"{first.machine_id}.log")
                    if e.get("event") == "worker.signal"]  # fmt: skip
            assert len(said) == 1, said
            await backend.destroy(done)

            second, _ = await draining("second")
            worker = json.loads((state / f"{second.machine_id}.pids").read_text())["worker"]
            await backend.destroy(second)
            assert not await backend.list()

            async def killed() -> bool:
                return _gone(worker)

            await eventually(killed, timeout_s=10, what="the draining worker killed")
    finally:
        await destroy_all(state)


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie awaiting its parent counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
