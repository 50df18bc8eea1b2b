"""The scaler's creates are remembered in the store (migration 0026, attack34 A7): a new
scaler on the same database (a new process, a standby taking over) keeps the create bounds
of the one before it, mid-rollout, and a create cut off before the backend answered counts.

The registry and ``scaler_creates`` are real (Postgres); each new scaler is a new client
(its own pool) and a new ``Reconciler``, as a new process has; the backend is the test's.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import anyio
import pytest

from support.db import fetch
from support.runtime import SCHEMA, env_of, open_client
from support.scaler import Clock, worker_on
from worker.scaler import reconcile
from worker.scaler.backend import STARTED, Machine
from worker.scaler.plan import MADE_SURPLUS, UNLISTED_AFTER_S
from worker.scaler.reconcile import Reconciler

OLD, NEW = "mem-old", "mem-new"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    at = Clock()
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=at.monotonic))
    return at


class Misreporting:
    """A backend that makes machines and lists what it made wrongly: not at all
    (``listed_as`` None: their metadata dropped) or with ``listed_as`` changed. The
    superseded release's machine (``old``) is listed as it is."""

    name = "test"

    def __init__(self, listed_as: dict[str, str] | None) -> None:
        self.store_id = "store-under-test"
        self.stop_deadline_s = 75.0
        self.listed_as = listed_as
        self.machines = {"old": Machine("old", OLD, "img:1", STARTED, 1000.0)}
        self.creates: list[str] = []
        self.hang = False  # create makes its machine and never answers
        self.entered = anyio.Event()

    async def list(self) -> list[Machine]:
        made = [m for i, m in self.machines.items() if i != "old"]
        shown = [] if self.listed_as is None else [replace(m, **self.listed_as) for m in made]  # type: ignore[arg-type]
        return [self.machines["old"], *shown]

    async def create(self, release_id: str, image: str) -> Machine:
        self.creates.append(release_id)
        machine = Machine(f"new-{len(self.creates)}", release_id, image, STARTED, 0.0)
        self.machines[machine.machine_id] = machine
        if self.hang:
            self.entered.set()
            await anyio.sleep_forever()
        return machine

    async def stop(self, machine: Machine) -> None:
        raise AssertionError(f"nothing is stopped here: {machine}")

    async def destroy(self, machine: Machine) -> None:
        raise AssertionError(f"nothing is destroyed here: {machine}")

    def where_logs(self, machine_id: str) -> str:
        return f"the test's notes on {machine_id}"


async def _rollout(database_url: str) -> None:
    """Release OLD of one runs (its worker beats); NEW, of two, is deployed over it."""
    async with open_client(database_url, env_of(OLD)) as client:
        await client.releases.deploy(OLD, image="img:1", machines=1)
        await worker_on(client, OLD, "old", live=True)
        await client.releases.deploy(NEW, image="img:2", machines=2)


async def _new_scaler_passes(database_url: str, backend: Misreporting, clock: Clock,
                             passes: int) -> None:  # fmt: skip
    async with open_client(database_url, env_of(NEW)) as client:
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(passes):
            await reconciler.once()
            clock.now += 2


@pytest.mark.parametrize(
    ("listed_as", "bound", "listed"),
    [(None, 2, False), ({"release_id": "mem-elsewhere"}, 2 + MADE_SURPLUS, True)],
    ids=["unlisted", "listed-as-another-release"],
)
async def test_scalers_restarted_mid_rollout_do_not_create_past_the_bound(
    database_url: str, clock: Clock, listed_as: dict[str, str] | None, bound: int,
    listed: bool,
) -> None:  # fmt: skip
    """Mid-rollout, with a listing that never shows what the scaler made as the release's,
    four scalers in turn on the same store (each one new, as after a restart) make what one
    would: the release's count while the machines are unlisted, its count plus MADE_SURPLUS
    while they are listed as another release's. Each pass is shorter than the unlisted
    timeout (UNLISTED_AFTER_S), so only the remembered creates bound them."""
    await _rollout(database_url)
    backend = Misreporting(listed_as)
    for _ in range(4):
        await _new_scaler_passes(database_url, backend, clock, passes=int(UNLISTED_AFTER_S / 4))
    assert backend.creates == [NEW] * bound, backend.creates
    rows = await fetch(
        database_url,
        f"select release_id, image, machine_id, listed from {SCHEMA}.scaler_creates"
        " order by machine_id",
    )  # fmt: skip
    assert [dict(r) for r in rows] == [
        {"release_id": NEW, "image": "img:2", "machine_id": f"new-{n}", "listed": listed}
        for n in range(1, bound + 1)
    ]


async def test_a_create_cut_off_before_its_answer_counts_for_the_next_scaler(
    database_url: str, clock: Clock
) -> None:
    """A scaler cut off while its create was sent (lock lost, killed), the machine made: the
    create was remembered before it was sent, so the next scaler counts it and makes
    nothing more for the release of two while it is young. Its machine id unknown, it is
    never matched to the listing, and is forgotten after UNLISTED_AFTER_S: then the
    missing machine is made, and no more."""
    await _rollout(database_url)
    backend = Misreporting(None)
    backend.hang = True
    async with open_client(database_url, env_of(NEW)) as client:
        cut_off = Reconciler(client.db, client.store, backend, actor="test")
        async with anyio.create_task_group() as tg:
            tg.start_soon(cut_off.once)
            await backend.entered.wait()
            tg.cancel_scope.cancel()
    assert backend.creates == [NEW], backend.creates  # the first of two, never answered
    rows = await fetch(database_url, f"select machine_id from {SCHEMA}.scaler_creates")
    assert [r["machine_id"] for r in rows] == [None]
    backend.hang, backend.listed_as = False, {}  # its machine is listed, as the release's
    await _new_scaler_passes(database_url, backend, clock, passes=int(UNLISTED_AFTER_S / 4))
    assert backend.creates == [NEW], backend.creates
    await _new_scaler_passes(database_url, backend, clock, passes=int(UNLISTED_AFTER_S))
    assert backend.creates == [NEW, NEW], backend.creates
