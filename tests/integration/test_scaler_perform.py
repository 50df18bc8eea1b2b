"""How the reconcile pass performs its plan (worker/scaler/reconcile.py) on real Postgres.

The plan's rules are unit tested (tests/unit/test_scaler_plan.py); here, what
acting adds: a backend error ends that release's actions for the pass, and
nothing is retired on the word of a release whose actions ended before they
were counted.
"""

from __future__ import annotations

from dataclasses import replace

from support.runtime import env_of, open_client
from support.scaler import worker_on
from worker.scaler.backend import FAILED, STARTED, BackendError, Machine
from worker.scaler.reconcile import Reconciler


class RefusingDestroys:
    """A backend whose listing the test writes; destroys of ``refused`` machines fail."""

    name = "test"

    def __init__(self, *machines: Machine) -> None:
        self.store_id = "store-under-test"
        self.stop_deadline_s = 75.0
        self.machines = {m.machine_id: m for m in machines}
        self.refused: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    async def list(self) -> list[Machine]:
        return list(self.machines.values())

    async def create(self, release_id: str, image: str) -> Machine:
        raise AssertionError(f"nothing should be created ({release_id})")

    async def stop(self, machine: Machine) -> None:
        self.calls.append(("stop", machine.machine_id))

    async def destroy(self, machine: Machine) -> None:
        self.calls.append(("destroy", machine.machine_id))
        if machine.machine_id in self.refused:
            raise BackendError(f"HTTP 500 destroying {machine.machine_id}")
        self.machines.pop(machine.machine_id, None)

    def where_logs(self, machine_id: str) -> str:
        return f"the test's notes on {machine_id}"


async def test_a_release_whose_actions_failed_before_its_count_retires_nothing(
    database_url: str,
) -> None:
    """The current release has its one machine ready, and a machine that exited (listed
    first) whose destroy fails: the pass says the error, does nothing more for that
    release, and does not retire its predecessor; the next pass, the destroy done, does."""
    exited = Machine("b0", "rec-pb", "img", FAILED, 1000.0, exit_code=0)
    running = replace(exited, machine_id="b1", state=STARTED, exit_code=None)
    backend = RefusingDestroys(exited, running, replace(running, machine_id="a1",
                                                        release_id="rec-pa"))  # fmt: skip
    backend.refused.add("b0")
    async with open_client(database_url, env_of("rec-pa")) as client:
        await client.releases.deploy("rec-pa", image="img", machines=1)
        await client.releases.deploy("rec-pb", image="img", machines=1)
        await worker_on(client, "rec-pb", "b1", live=True)
        await worker_on(client, "rec-pa", "a1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")

        async def role_of_pa() -> str:
            rows = await client.db.run(client.store.registry.deployments)
            return next(d.role for d in rows if d.release_id == "rec-pa")

        seen = await reconciler.once()
        assert seen["rec-pb"].error == "HTTP 500 destroying b0", seen["rec-pb"]
        assert seen["rec-pb"].ready == 0  # not counted: its actions ended before
        assert await role_of_pa() == "previous"

        backend.refused.clear()
        seen = await reconciler.once()
        assert (seen["rec-pb"].error, seen["rec-pb"].ready) == (None, 1)
        assert await role_of_pa() == "retired"
    assert backend.calls == [("destroy", "b0"), ("destroy", "b0")]
