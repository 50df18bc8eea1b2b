"""The scaler records on the release's row when its machines cannot boot (store 0047).

Two machines of the deploy in a row exiting 78 (the judgement `releases deploy --wait`
uses) set ``deployments.boot_failed``, masked, with a one-line reason; a submit to the
lane then says served=false. A live worker of the lane clears it. Real Postgres; the
backend is a scripted list of machines, the clock the test's.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from support.runtime import SCHEMA, env_of, open_client
from support.scaler import Clock, worker_on
from worker.scaler import reconcile
from worker.scaler.backend import STARTED, STOPPED, Machine
from worker.scaler.reconcile import Reconciler

SECRET = "s3cret-token-value"


class Machines:
    """A backend whose machines the test scripts."""

    name = "test"
    store_id = "store-under-test"
    stop_deadline_s = 75.0

    def __init__(self) -> None:
        self.machines: dict[str, Machine] = {}
        self.made: list[str] = []

    async def list(self) -> list[Machine]:
        return list(self.machines.values())

    async def create(self, release_id: str, image: str) -> Machine:
        machine_id = f"new-{len(self.made)}"
        self.made.append(machine_id)
        self.machines[machine_id] = Machine(machine_id, release_id, image, STARTED, 0.0)
        return self.machines[machine_id]

    async def stop(self, machine: Machine) -> None:
        return None

    async def destroy(self, machine: Machine) -> None:
        self.machines.pop(machine.machine_id, None)

    def where_logs(self, machine_id: str) -> str:
        return f"/logs/{machine_id}.log"

    def refuse_at_boot(self, machine_id: str) -> None:
        line = f"config refused: LANE_WORKER_CONCURRENCY=0 (token {SECRET})"
        self.machines[machine_id] = replace(
            self.machines[machine_id], state=STOPPED, exit_code=78, last_line=line
        )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    at = Clock()
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=at.monotonic))
    return at


async def test_a_boot_that_keeps_failing_is_recorded_and_a_live_worker_clears_it(
    database_url: str, clock: Clock
) -> None:
    backend = Machines()
    async with open_client(database_url, env_of("rec-boot")) as client:

        async def recorded() -> Any:
            return await client.db.fetchval(
                f"select boot_failed from {SCHEMA}.deployments where release_id = 'rec-boot'"
            )

        async def served() -> dict[str, Any]:
            made: dict[str, Any] = await client.db.fetchval(
                f"select {SCHEMA}.submit_run('greet', '{{}}', 'rec-boot')"
            )
            return made

        await client.releases.deploy("rec-boot", image="img", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")  # type: ignore[arg-type]
        reconciler.secrets = (SECRET,)
        await reconciler.once()
        # The first machine refuses its configuration: once is bad luck, not recorded.
        [first] = backend.machines
        backend.refuse_at_boot(first)
        await reconciler.once()
        assert await recorded() is None
        assert (await served())["served"] is True
        for _ in range(20):  # past the backoff, a second machine is made, and refuses too
            clock.now += 60
            await reconciler.once()
            if len(backend.made) > 1:
                break
        second = backend.made[1]
        backend.refuse_at_boot(second)
        await reconciler.once()
        word = await recorded()
        assert word is not None
        assert (word["exitCode"], word["inARow"], word["machine"]) == (78, 2, second)
        assert SECRET not in str(word)
        assert word["reason"].startswith(
            "2 machines in a row exited 78: their worker refused its configuration; the last "
            "one's last line: config refused: LANE_WORKER_CONCURRENCY=0"
        ), word
        made = await served()
        assert made["served"] is False, made
        assert word["reason"] in made["warning"]
        [view] = [v for v in (await client.releases.list())[0] if v.release_id == "rec-boot"]
        assert view.boot_failed == word
        # A worker of the lane is live (it booted after all): the record goes.
        await worker_on(client, "rec-boot", "elsewhere", live=True)
        await reconciler.once()
        assert await recorded() is None
