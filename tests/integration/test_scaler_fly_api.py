"""The scaler's pass through the real Fly client against a fake Machines API that misbehaves.

The registry and the workers' heartbeats are real (Postgres); the Machines API is
``support.fly.FakeFly`` without processes: its machines are records in whatever Fly
state the test sets, and it misbehaves on demand (a 500 after creating, a machine
listed twice, overlapping pages, no metadata, a 401 that echoes the token).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import anyio
import pytest

from support.fly import FLY_STATES, FakeFly
from support.runtime import env_of, eventually, open_client
from support.scaler import Clock, worker_on
from worker.client import LaneClient
from worker.scaler import reconcile
from worker.scaler.fly import FlyBackend
from worker.scaler.reconcile import Reconciler
from worker.scaler.run import Scaler

TOKEN = "fm2_fake0token0a7c1/x+Q"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    at = Clock()
    monkeypatch.setattr(reconcile, "time", SimpleNamespace(monotonic=at.monotonic))
    return at


@asynccontextmanager
async def fly_api(
    database_url: str, release: str, token: str = TOKEN
) -> AsyncIterator[tuple[FakeFly, FlyBackend, LaneClient]]:
    """A fake Machines API, a Fly client of it for this store, and a store client."""
    fly = FakeFly(None, {}, TOKEN, "lw-api")
    await fly.start()
    try:
        async with open_client(database_url, env_of(release)) as client:
            backend = FlyBackend(api_url=fly.api_url, token=token, app="lw-api", region=None)
            backend.store_id = await client.db.run(client.store.registry.store_id)
            yield fly, backend, client
    finally:
        await fly.stop()


async def test_a_create_answered_500_after_it_made_the_machine_makes_one(
    database_url: str, clock: Clock
) -> None:
    """Three creates in a row make their machine and answer 500: the release of one gets
    one machine, found again by its create's key, not one per try."""
    async with fly_api(database_url, "fly-500") as (fly, backend, client):
        await client.releases.deploy("fly-500", image="img:1", machines=1)
        fly.fail_after_create = 3
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(3):
            seen = await reconciler.once()
            clock.now += 2
    assert fly.creates() == 1, fly.calls
    assert seen["fly-500"].running == 1


async def test_a_listing_in_overlapping_pages_with_twins_is_each_machine_once(
    database_url: str, clock: Clock
) -> None:
    """Pages of two that overlap by one, every machine listed twice: five machines listed,
    each once; the release at its count is left alone."""
    async with fly_api(database_url, "fly-page") as (fly, backend, client):
        await client.releases.deploy("fly-page", image="img:1", machines=5)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        await reconciler.once()  # three, then two
        for machine_id in fly.records:
            fly.states[machine_id] = "started"
            await worker_on(client, "fly-page", machine_id, live=True)
        fly.page_size, fly.duplicate_listing = 2, True
        listed = await backend.list()
        fly.calls.clear()
        for _ in range(3):
            seen = await reconciler.once()
            clock.now += 2
    assert sorted(m.machine_id for m in listed) == sorted(fly.records)
    assert len(listed) == 5
    assert [c for c in fly.calls if c[0] != "GET"] == []
    assert any("cursor=" in path for _, path, _ in fly.calls)
    assert (seen["fly-page"].running, seen["fly-page"].ready) == (5, 5)


async def test_machines_listed_without_metadata_are_not_created_without_bound(
    database_url: str, clock: Clock
) -> None:
    """The API lists machines without their metadata: one create for a release of one over a
    minute of passes, and the pass says the listing is wrong."""
    async with fly_api(database_url, "fly-meta") as (fly, backend, client):
        await client.releases.deploy("fly-meta", image="img:1", machines=1)
        fly.without_metadata = True
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        for _ in range(30):
            seen = await reconciler.once()
            clock.now += 2
    assert fly.creates() == 1, fly.calls
    assert seen["fly-meta"].unlisted == 1
    assert "does not list" in (seen["fly-meta"].error or "")


@pytest.mark.parametrize(
    ("state", "acted"),
    [
        ("created", []), ("starting", []), ("started", []), ("replacing", []),
        ("stopping", ["create"]),  # draining: left alone, and replaced
        ("stopped", ["destroy", "create"]), ("suspended", ["destroy", "create"]),
        ("destroying", ["create"]), ("destroyed", ["create"]),  # gone: never touched
    ],
)  # fmt: skip
async def test_every_state_a_fly_machine_passes_through(
    database_url: str, clock: Clock, state: str, acted: list[str]
) -> None:
    """One machine of a release of one, listed in each Fly state: what the pass does to it."""
    assert state in FLY_STATES
    async with fly_api(database_url, "fly-state") as (fly, backend, client):
        await client.releases.deploy("fly-state", image="img:1", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        # Listed once as Fly lists a new machine: the store remembers it listed, so the
        # fresh scaler counts it as the listing says (one never listed would count as
        # created and unlisted, whatever its state now: migration 0026).
        await reconciler.once()
        [machine_id] = fly.records
        fly.states[machine_id] = state
        await worker_on(client, "fly-state", machine_id, live=state == "started")
        reconciler = Reconciler(client.db, client.store, backend, actor="test")  # a fresh scaler
        fly.calls.clear()
        await reconciler.once()
    done = [("create" if m == "POST" and p.endswith("/machines") else
             "stop" if p.endswith("/stop") else "destroy" if m == "DELETE" else m)
            for m, p, _ in fly.calls if m != "GET"]  # fmt: skip
    assert done == acted, fly.calls


async def test_a_401_echoing_the_token_keeps_none_of_it(database_url: str, clock: Clock) -> None:
    """A refusal whose body echoes the Authorization header: the pass's error says 401, and
    neither it nor what the scaler writes for `releases` carries the token."""
    wrong = "fm2_revoked0token0b9e2/y+Z"
    async with fly_api(database_url, "fly-401", token=wrong) as (fly, backend, client):
        fly.echo_auth = True
        await client.releases.deploy("fly-401", image="img:1", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        seen = await reconciler.once()
    error = seen["fly-401"].error or ""
    assert "HTTP 401" in error
    assert wrong in "".join(fly.answers)  # the API did echo it
    kept = json.dumps({k: v.as_json() for k, v in seen.items()})
    for part in (wrong, "revoked0token", json.dumps(wrong)[1:-1]):
        assert part not in kept, kept


async def test_a_machine_stuck_stopping_is_removed_past_its_deadline(
    database_url: str, clock: Clock
) -> None:
    """Scaled to none, a machine that stays `stopping` (Fly says not since when) drains until
    the stop deadline, then is removed, forced (the API refuses an active one otherwise)."""
    async with fly_api(database_url, "fly-stuck") as (fly, backend, client):
        await client.releases.deploy("fly-stuck", image="img:1", machines=1)
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
        [machine_id] = fly.records
        fly.states[machine_id] = "started"
        fly.stuck_stopping.add(machine_id)
        await worker_on(client, "fly-stuck", machine_id, live=True)
        await client.releases.deploy("fly-stuck", image="img:1", machines=0)
        await reconciler.once()
        assert fly.records[machine_id]["state"] == "stopping"
        clock.now += backend.stop_deadline_s - 5
        await reconciler.once()
        assert fly.records[machine_id]["state"] == "stopping", "removed while it could drain"
        clock.now += 10
        await reconciler.once()
    deletes = [(p, status) for m, p, status in fly.calls if m == "DELETE"]
    assert deletes == [(f"/v1/apps/lw-api/machines/{machine_id}?force=true", 200)], fly.calls
    assert fly.records[machine_id]["state"] == "destroyed"


async def test_a_create_answered_500_is_searched_for_while_the_listing_lags(
    database_url: str, clock: Clock
) -> None:
    """An API that does not keep names unique and lists a new machine two listings late; the
    create makes its machine and answers 500: the listing is searched until it shows it, and
    the create is not sent again (each try made a twin: three machines for a release of one)."""
    async with fly_api(database_url, "fly-lag") as (fly, backend, client):
        await client.releases.deploy("fly-lag", image="img:1", machines=1)
        fly.unique_names, fly.listing_lag, fly.fail_after_create = False, 2, 3
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        await reconciler.once()
    assert fly.creates() == 1, fly.calls


async def test_a_huge_retry_after_ends_the_pass_says_so_and_leaves_the_api_alone(
    database_url: str, clock: Clock
) -> None:
    """A 429 asking to wait a day: the pass ends at once with an error that says the Machines
    API rate-limits and when the scaler calls it again; the next passes leave it alone (still
    saying so) until then, at most MAX_RETRY_AFTER_S; then it is listed again."""
    async with fly_api(database_url, "fly-429") as (fly, backend, client):
        await client.releases.deploy("fly-429", image="img:1", machines=1)
        fly.faults = [(429, {"Retry-After": "86400"})]
        reconciler = Reconciler(client.db, client.store, backend, actor="test")
        with anyio.fail_after(20):  # the client used to wait the day out within the pass
            seen = await reconciler.once()
        calls = len(fly.calls)
        clock.now += 30
        meanwhile = await reconciler.once()
        calls_meanwhile = len(fly.calls) - calls
        clock.now += 31
        await reconciler.once()
    said = seen["fly-429"].error or ""
    assert "rate limited by the Machines API (Retry-After: 86400 s)" in said, said
    assert "calls it again at" in said, said
    assert meanwhile["fly-429"].error == said
    assert calls_meanwhile == 0, fly.calls
    assert fly.creates() == 1, fly.calls


async def test_the_stop_signal_ends_a_pass_waiting_on_the_api(database_url: str) -> None:
    """A scaler whose pass waits out a rate limit between its tries stops as soon as it is
    told to (it used to finish the pass first: with a long Retry-After, never)."""
    async with fly_api(database_url, "fly-stop") as (fly, backend, client):
        await client.releases.deploy("fly-stop", image="img:1", machines=1)
        fly.faults = [(429, {"Retry-After": "10"})] * 50  # waited out, try after try
        scaler = Scaler(client, backend, health_port=0)
        done = anyio.Event()

        async def run() -> None:
            await scaler.run(database_url)
            done.set()

        async def waiting() -> bool:
            return any(c[2] == 429 for c in fly.calls)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await eventually(waiting, what="a pass waiting out a 429")
            scaler.stop.set()
            with anyio.fail_after(5):  # well within the 10 s it waits before its next try
                await done.wait()
