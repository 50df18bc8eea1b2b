"""How the reconcile pass performs its plan (worker/scaler/reconcile.py) on real Postgres.

The plan's rules are unit tested (tests/unit/test_scaler_plan.py); here, what
acting adds: a refused removal of a machine the release no longer counts is
said and the release's actions go on, a backend error that ends a release's
actions (a rate limit) ends them for the pass, and nothing is retired on the
word of a release whose actions ended before they were counted.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from support.runtime import env_of, open_client
from support.scaler import Clock, worker_on
from worker.scaler import reconcile
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
        self.retry_after_s: float | None = None  # refused as rate limited (429), else a 500
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
            if self.retry_after_s is not None:
                limited = BackendError(f"HTTP 429 destroying {machine.machine_id}")
                limited.retry_after_s = self.retry_after_s  # type: ignore[attr-defined]
                raise limited
            raise BackendError(f"HTTP 500 destroying {machine.machine_id}")
        self.machines.pop(machine.machine_id, None)

    def where_logs(self, machine_id: str) -> str:
        return f"the test's notes on {machine_id}"


def _two_releases() -> RefusingDestroys:
    """``rec-pb`` (current, of one) with its machine ready and a machine that exited,
    listed first, whose destroy is refused; ``rec-pa`` (superseded) with its own."""
    exited = Machine("b0", "rec-pb", "img", FAILED, 1000.0, exit_code=0)
    running = replace(exited, machine_id="b1", state=STARTED, exit_code=None)
    backend = RefusingDestroys(exited, running, replace(running, machine_id="a1",
                                                        release_id="rec-pa"))  # fmt: skip
    backend.refused.add("b0")
    return backend


async def test_a_refused_removal_of_an_uncounted_machine_is_said_and_the_pass_goes_on(
    database_url: str,
) -> None:
    """A machine that exited, whose destroy the backend refuses, is no longer counted by
    its release: the refusal is said in the release's word and its actions go on (its
    count is taken, its predecessor retired), the destroy tried again next pass (attack34
    A1: a dead machine whose DELETE answered 404 pass after pass kept its replacement
    from being created)."""
    backend = _two_releases()
    async with open_client(database_url, env_of("rec-pa")) as client:
        await client.releases.deploy("rec-pa", image="img", machines=1)
        await client.releases.deploy("rec-pb", image="img", machines=1)
        await worker_on(client, "rec-pb", "b1", live=True)
        await worker_on(client, "rec-pa", "a1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        seen = await reconciler.once()
        assert seen["rec-pb"].error == "HTTP 500 destroying b0", seen["rec-pb"]
        assert (seen["rec-pb"].running, seen["rec-pb"].ready) == (1, 1), seen["rec-pb"]
        rows = await client.db.run(client.store.registry.deployments)
        assert next(d.role for d in rows if d.release_id == "rec-pa") == "retired"
        await reconciler.once()  # (rec-pa's machine stops: its lane is drained)
    assert [c for c in backend.calls if c[1] != "a1"] == [("destroy", "b0"), ("destroy", "b0")]


async def test_a_release_whose_actions_ended_before_its_count_retires_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, the destroy refused as rate limited: the release's actions end there (the
    backend is left alone a while), before its count, so its predecessor is not retired on
    its word; a pass after the wait, the destroy done, retires it."""
    clock = Clock()
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=clock.monotonic))
    backend = _two_releases()
    backend.retry_after_s = 30.0
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
        assert seen["rec-pb"].error == "HTTP 429 destroying b0", seen["rec-pb"]
        assert seen["rec-pb"].ready == 0  # not counted: its actions ended before
        assert await role_of_pa() == "previous"

        backend.refused.clear()
        clock.now += 31
        seen = await reconciler.once()
        assert (seen["rec-pb"].error, seen["rec-pb"].ready) == (None, 1)
        assert await role_of_pa() == "retired"
    assert backend.calls == [("destroy", "b0"), ("destroy", "b0")]
