"""The scaler's reconcile pass (worker/scaler/reconcile.py) on real Postgres.

The registry, the drain report and the workers' heartbeats are real; the backend
is an in-memory list of machines the test scripts (what Fly or the process
backend would list), and the clock the pass reads is the test's, so "60 s
without a live worker" is a step of the test, not a wait.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.daemon import base_env
from support.runtime import env_of, eventually, open_client
from support.scaler import Clock, worker_on
from worker.scaler import reconcile
from worker.scaler.backend import FAILED, STARTED, STOPPED, STOPPING, BackendError, Machine
from worker.scaler.process import ProcessBackend
from worker.scaler.reconcile import DEAD_AFTER_S, Reconciler


class ListedMachines:
    """A backend whose list the test writes; it records every call."""

    name = "test"

    def __init__(self) -> None:
        self.store_id = "store-under-test"
        self.stop_deadline_s = 75.0
        self.machines: dict[str, Machine] = {}
        self.calls: list[tuple[str, str]] = []
        self.refusal = ""  # set: list raises it, as a backend with a bad token does
        self.listed = 0
        self.twice: set[str] = set()  # machines listed twice (pages that overlap)
        self.hidden = False  # created machines are not listed (their metadata is missing)
        # Created machines are listed with these fields changed (metadata the API lost).
        self.made_listed_as: dict[str, object] = {}

    def add(self, machine_id: str, release_id: str, *, state: str = STARTED,
            age_s: float = 1000.0, image: str = "img") -> None:  # fmt: skip
        self.machines[machine_id] = Machine(machine_id, release_id, image, state, age_s)

    def set(self, machine_id: str, **changes: object) -> None:
        self.machines[machine_id] = replace(self.machines[machine_id], **changes)

    async def list(self) -> list[Machine]:
        self.listed += 1
        if self.refusal:
            raise BackendError(self.refusal)
        shown = [m for m in self.machines.values() if not (self.hidden and m.machine_id in
                                                            self.made)]  # fmt: skip
        if self.made_listed_as:
            shown = [replace(m, **self.made_listed_as) if m.machine_id in self.made else m  # type: ignore[arg-type]
                     for m in shown]  # fmt: skip
        return [*shown, *(self.machines[m] for m in self.twice if m in self.machines)]

    @property
    def made(self) -> list[str]:
        return [m for m in self.machines if m.startswith("new-")]

    async def create(self, release_id: str, image: str) -> Machine:
        machine_id = f"new-{len(self.calls)}"
        self.calls.append(("create", release_id))
        self.add(machine_id, release_id, image=image, age_s=0.0)
        return self.machines[machine_id]

    async def stop(self, machine: Machine) -> None:
        self.calls.append(("stop", machine.machine_id))

    async def destroy(self, machine: Machine) -> None:
        self.calls.append(("destroy", machine.machine_id))
        self.machines.pop(machine.machine_id, None)

    def where_logs(self, machine_id: str) -> str:
        return f"the test's notes on {machine_id}"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    at = Clock()
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=at.monotonic))
    return at


async def test_an_outage_that_stopped_every_heartbeat_replaces_no_machine_at_once(
    database_url: str, clock: Clock
) -> None:
    """Machines without a live worker are dead only after DEAD_AFTER_S of this scaler
    watching them: not the moment a database outage ends, nor the moment a scaler
    becomes active."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-a")) as client:
        await client.releases.deploy("rec-a", image="img", machines=1)
        backend.add("m1", "rec-a")
        await worker_on(client, "rec-a", "m1", live=False)  # its heartbeat stopped in the outage
        reconciler = Reconciler(client.db, client.store, backend, actor="test")

        await reconciler.once()
        assert backend.calls == [], "a machine was replaced the moment it was seen without worker"

        clock.now += DEAD_AFTER_S / 2
        await worker_on(client, "rec-a", "m1", live=True)  # the worker beats again
        await reconciler.once()
        await worker_on(client, "rec-a", "m1", live=False)
        clock.now += DEAD_AFTER_S / 2 + 1
        await reconciler.once()
        assert backend.calls == [], "the watch did not start over when the worker came back"

        clock.now += DEAD_AFTER_S
        reconciler.reset()  # this scaler became active again (a standby took over and back)
        await reconciler.once()
        assert backend.calls == []

        clock.now += DEAD_AFTER_S + 1
        seen = await reconciler.once()
    assert backend.calls[:2] == [("stop", "m1"), ("destroy", "m1")], backend.calls
    assert ("create", "rec-a") in backend.calls  # and replaced from the release's image
    assert seen["rec-a"].actions[0] == "replaced m1"


async def test_a_stop_is_sent_once_and_the_machine_drains_undisturbed(
    database_url: str, clock: Clock
) -> None:
    """A surplus machine is stopped once: while the backend still lists it running, while it
    is stopping, and once it stopped (destroyed, and not counted as a death)."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-s")) as client:
        await client.releases.deploy("rec-s", image="img", machines=1)
        for m in ("m1", "m2"):
            backend.add(m, "rec-s")
            await worker_on(client, "rec-s", m, live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await client.releases.deploy("rec-s", image="img", machines=0)  # scaled down

        await reconciler.once()
        stops = [c for c in backend.calls if c[0] == "stop"]
        assert len(stops) == 2, backend.calls
        clock.now += 2
        await reconciler.once()  # the backend lists them running for a moment (Fly)
        for m in ("m1", "m2"):
            backend.set(m, state=STOPPING)
        clock.now += 2
        seen = await reconciler.once()
        assert seen["rec-s"].stopping == 2
        backend.set("m2", stopping_s=backend.stop_deadline_s - 1)  # draining, within its bound
        await reconciler.once()
        assert backend.calls == stops, "a stop was sent again, or a draining machine destroyed"

        backend.set("m1", state=STOPPED, exit_code=143)
        backend.set("m2", state=STOPPING, stopping_s=backend.stop_deadline_s + 1)  # stuck stopping
        seen = await reconciler.once()
    assert backend.calls[2:] == [("destroy", "m1"), ("destroy", "m2")], backend.calls
    assert seen["rec-s"].boot_refused is None  # a machine it stopped did not die


async def test_a_stranded_retired_release_deployed_with_no_machines_gets_one(
    database_url: str, clock: Clock
) -> None:
    """Work only a retired release may run and no live worker of it: one machine is started
    even though the release was deployed with none; none once it has a live worker."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-old")) as client:
        await client.releases.deploy("rec-old", image="img:old", machines=0)
        await client.submit("plain", {"n": 1})  # a fresh run: only rec-old may run it
        await client.releases.deploy("rec-new", image="img:new", machines=1)
        await client.db.run(lambda c: client.store.registry.retire_superseded(c, actor="t"))
        reconciler = Reconciler(client.db, client.store, backend, actor="test")

        seen = await reconciler.once()
        assert ("create", "rec-old") in backend.calls, backend.calls
        assert seen["rec-old"].target == 1
        [made] = [m for m in backend.machines.values() if m.release_id == "rec-old"]
        assert made.image == "img:old"
        await worker_on(client, "rec-old", made.machine_id, live=True)
        backend.calls.clear()
        seen = await reconciler.once()
    assert [c for c in backend.calls if c[1] == "rec-old" or c[1] == made.machine_id] == []
    assert seen["rec-old"].target == 0


async def test_a_process_backend_lists_only_its_own_stores_machines(
    database_url: str, tmp_path: Path
) -> None:
    """Two scalers of different databases sharing a folder never see each other's machines;
    a machine's worker gets neither the scaler's queue suffix nor the scaler's settings."""
    env = {**base_env(database_url, "unused"), "DEEPLINE_ABSURD_QUEUE_SUFFIX": "my-worktree",
           "LANE_WORKER_SCALER_STATE_DIR": str(tmp_path)}  # fmt: skip
    ours, theirs = ProcessBackend(tmp_path, env), ProcessBackend(tmp_path, env)
    ours.store_id, theirs.store_id = "store-1", "store-2"
    made = await ours.create("rec-env", "support.apps.basic:app")
    try:
        assert [m.machine_id for m in await ours.list()] == [made.machine_id]
        assert await theirs.list() == []

        async def worker_environ() -> list[bytes] | None:
            return _worker_environ(tmp_path, made.machine_id)

        environ = await eventually(worker_environ, timeout_s=20, what="the machine's worker")
        assert b"DEEPLINE_RUNTIME_DEPLOY_VERSION=rec-env" in environ
        assert not [v for v in environ if v.startswith(b"DEEPLINE_ABSURD_QUEUE_SUFFIX=")]
        assert not [v for v in environ if v.startswith(b"LANE_WORKER_SCALER_STATE_DIR=")]
    finally:
        for m in await ours.list():
            await ours.destroy(m)


async def test_the_store_id_is_made_once_and_kept(database_url: str) -> None:
    """The id the scaler marks machines with is the store's, the same after a migrate."""
    async with open_client(database_url, env_of("rec-id")) as client:
        first = await client.db.run(client.store.registry.store_id)
        await client.migrate()
        again = await client.db.run(client.store.registry.store_id)
    assert first == again
    assert len(first) == 36  # a uuid


def _worker_environ(state_dir: Path, machine_id: str) -> list[bytes] | None:
    """The environment of a process-backend machine's worker, once it runs."""
    try:
        pids = json.loads((state_dir / f"{machine_id}.pids").read_text())
        return Path(f"/proc/{pids['worker']}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError, TypeError):
        return None


async def test_a_backend_that_refuses_is_asked_again_slower_not_every_pass(
    database_url: str, clock: Clock
) -> None:
    """A 401 (a bad token) is one error per retry, after 2, 4, 8 ... at most 60 s; the
    scaler's word on each release carries it meanwhile; a success resets the pace."""
    backend = ListedMachines()
    backend.refusal = "Fly Machines API GET /machines: HTTP 401 (unauthorized)"
    async with open_client(database_url, env_of("rec-401")) as client:
        await client.releases.deploy("rec-401", image="img", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        listed_at = []
        for _ in range(100):  # 100 passes of 2 s
            seen = await reconciler.once()
            assert seen["rec-401"].error == backend.refusal
            if backend.listed > len(listed_at):
                listed_at.append(clock.now)
            clock.now += 2
        backend.refusal = ""
        clock.now += 60
        await reconciler.once()
        calls = backend.listed
        await reconciler.once()
    gaps = [b - a for a, b in itertools.pairwise(listed_at)]
    assert gaps[:5] == [2, 4, 8, 16, 32], gaps
    assert max(gaps) == 60, gaps
    assert backend.listed == calls + 1  # listed again on the very next pass


async def test_a_fixed_image_starts_at_once_after_a_broken_one(
    database_url: str, clock: Clock
) -> None:
    """A broken image's machines back off; deploying the release again with a fixed image
    starts a machine on the next pass, and the broken image's exit is not this deploy's."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-fix")) as client:
        await client.releases.deploy("rec-fix", image="img:broken", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        [broken] = backend.machines
        backend.set(broken, state=STOPPED, exit_code=2)  # it dies at boot
        seen = await reconciler.once()
        assert seen["rec-fix"].boot_refused is not None
        assert seen["rec-fix"].actions[-1].startswith("waiting"), seen["rec-fix"].actions
        await client.releases.deploy("rec-fix", image="img:fixed", machines=1)
        seen = await reconciler.once()
    assert seen["rec-fix"].boot_refused is None
    assert [m.image for m in backend.machines.values()] == ["img:fixed"]


async def test_a_machine_listed_twice_is_one_machine_and_the_last_live_one_stays(
    database_url: str, clock: Clock
) -> None:
    """The only live, ready machine of the current release, listed twice, is neither stopped
    as "above the desired count" nor replaced, pass after pass."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-dup")) as client:
        await client.releases.deploy("rec-dup", image="img", machines=1)
        backend.add("m1", "rec-dup")
        backend.twice.add("m1")
        await worker_on(client, "rec-dup", "m1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(5):
            seen = await reconciler.once()
            clock.now += 2
    assert backend.calls == [], backend.calls
    assert (seen["rec-dup"].running, seen["rec-dup"].ready) == (1, 1)


async def test_a_superseded_release_s_twins_are_trimmed_never_its_live_machine(
    database_url: str, clock: Clock
) -> None:
    """A release that is no longer current but still claims, with three machines for its one
    (a create retried into twins), loses the two without a live worker; its live one stays."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-old")) as client:
        await client.releases.deploy("rec-old", image="img", machines=1)
        await client.releases.deploy("rec-cur", image="img", machines=1)
        for m in ("a1", "a2", "a3"):
            backend.add(m, "rec-old", age_s=5.0 if m != "a1" else 1000.0)
        backend.add("b1", "rec-cur", age_s=5.0)  # not ready yet: nothing is retired
        await worker_on(client, "rec-old", "a1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        seen = await reconciler.once()
    stopped = sorted(c[1] for c in backend.calls if c[0] == "stop")
    assert stopped == ["a2", "a3"], backend.calls
    assert seen["rec-old"].target == 1


async def test_machines_the_listing_never_shows_are_not_created_again_and_said_loudly(
    database_url: str, clock: Clock
) -> None:
    """Created machines listed without the scaler's metadata (so not at all): one create, not
    one per pass; after 30 s the pass says so and counts them; once listed, all is well."""
    backend = ListedMachines()
    backend.hidden = True
    async with open_client(database_url, env_of("rec-hid")) as client:
        await client.releases.deploy("rec-hid", image="img", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(30):  # a minute of passes
            seen = await reconciler.once()
            clock.now += 2
        creates = [c for c in backend.calls if c[0] == "create"]
        said = seen["rec-hid"]
        backend.hidden = False
        healed = (await reconciler.once())["rec-hid"]
    assert len(creates) == 1, backend.calls
    assert said.unlisted == 1
    assert "does not list" in (said.error or ""), said
    assert (healed.unlisted, healed.error, healed.running) == (0, None, 1)


async def test_a_big_count_is_created_a_few_per_pass(database_url: str, clock: Clock) -> None:
    """A release deployed with 10 machines gets at most three per pass."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-ten")) as client:
        await client.releases.deploy("rec-ten", image="img", machines=10)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        first = len(backend.calls)
        await reconciler.once()
    assert (first, len(backend.calls)) == (3, 6)


async def test_a_machine_stuck_stopping_is_destroyed_once_past_its_deadline(
    database_url: str, clock: Clock
) -> None:
    """A backend that lists a machine as stopping without saying since when (Fly): the scaler
    watches it, leaves it to drain until the stop deadline, then destroys it, once."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-stk")) as client:
        await client.releases.deploy("rec-stk", image="img", machines=0)
        backend.add("m1", "rec-stk")
        await worker_on(client, "rec-stk", "m1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        assert backend.calls == [("stop", "m1")]
        backend.set("m1", state=STOPPING)
        for _ in range(int(backend.stop_deadline_s // 5)):
            clock.now += 5
            await reconciler.once()
        assert backend.calls == [("stop", "m1")], "destroyed while it could still be draining"
        clock.now += 10
        await reconciler.once()
        clock.now += 10
        await reconciler.once()
    assert backend.calls == [("stop", "m1"), ("destroy", "m1")], backend.calls


async def test_one_stale_listing_never_stops_a_machine_whose_worker_beats(
    database_url: str, clock: Clock
) -> None:
    """The only machine of a release, its worker live and ready, listed failed (or stopped)
    once: believed running (no destroy, no replacement); a second listing in a row that
    says failed is believed."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-flap")) as client:
        await client.releases.deploy("rec-flap", image="img", machines=1)
        backend.add("m1", "rec-flap")
        await worker_on(client, "rec-flap", "m1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for state in (FAILED, STARTED, STOPPED, STARTED, FAILED, STARTED):
            backend.set("m1", state=state)
            seen = await reconciler.once()
            clock.now += 2
            assert backend.calls == [], (state, backend.calls)
            assert (seen["rec-flap"].running, seen["rec-flap"].ready) == (1, 1)
        backend.set("m1", state=FAILED)
        await reconciler.once()
        clock.now += 2
        await reconciler.once()
    assert backend.calls[0] == ("destroy", "m1"), backend.calls


async def test_stopping_listings_nobody_asked_for_never_destroy_a_machine_whose_worker_beats(
    database_url: str, clock: Clock
) -> None:
    """A live, ready machine the scaler never stopped, listed stopping once, then running, then
    stopping once again past the stop deadline: the stopping clock started over when it was
    listed running, and it is not destroyed; listed stopping for good while its worker
    beats, it is not destroyed either, however long."""
    backend = ListedMachines()
    async with open_client(database_url, env_of("rec-stf")) as client:
        await client.releases.deploy("rec-stf", image="img", machines=1)
        backend.add("m1", "rec-stf")
        await worker_on(client, "rec-stf", "m1", live=True)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        for state in (STOPPING, STOPPING, STARTED):
            backend.set("m1", state=state)
            await reconciler.once()
            clock.now += 2
        clock.now += backend.stop_deadline_s + 20
        for state in (STOPPING, STOPPING, STARTED):
            backend.set("m1", state=state)
            await reconciler.once()
            clock.now += 2
        # (While it was believed stopping, a replacement was started, then trimmed.)
        acted_on_m1 = [c for c in backend.calls if c[1] == "m1"]
        backend.set("m1", state=STOPPING)
        for _ in range(int(backend.stop_deadline_s // 5) + 5):
            await worker_on(client, "rec-stf", "m1", live=True)
            await reconciler.once()
            clock.now += 5
    assert acted_on_m1 == [], backend.calls
    assert [c for c in backend.calls if c[1] == "m1"] == [], backend.calls


async def test_a_listing_that_misreports_the_image_of_what_was_created_makes_one_machine(
    database_url: str, clock: Clock
) -> None:
    """Created machines listed on another image (without ``lane_worker_image``, the image as
    the API resolved it): they count as on the image they were created with, so a release
    of one gets one machine over a minute of passes, and the pass says the listing is wrong."""
    backend = ListedMachines()
    backend.made_listed_as = {"image": "registry.example/img@sha256:0"}
    async with open_client(database_url, env_of("rec-img")) as client:
        await client.releases.deploy("rec-img", image="img", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(30):
            seen = await reconciler.once()
            clock.now += 2
    assert [c[0] for c in backend.calls] == ["create"], backend.calls
    assert "on another image" in (seen["rec-img"].error or ""), seen["rec-img"]
    assert seen["rec-img"].outdated == 0


async def test_machines_listed_as_another_release_s_bound_the_creates(
    database_url: str, clock: Clock
) -> None:
    """Created machines listed under another release (metadata the API got wrong): the release
    of one never gets more than its count plus MADE_SURPLUS running, and the pass says so."""
    backend = ListedMachines()
    backend.made_listed_as = {"release_id": "rec-elsewhere"}
    async with open_client(database_url, env_of("rec-bnd")) as client:
        await client.releases.deploy("rec-bnd", image="img", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(30):
            seen = await reconciler.once()
            clock.now += 2
    creates = [c for c in backend.calls if c[0] == "create"]
    assert len(creates) == 3, backend.calls  # its count, 1, plus MADE_SURPLUS, 2
    assert "no machine is created" in (seen["rec-bnd"].error or ""), seen["rec-bnd"]
