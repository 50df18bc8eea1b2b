"""SharedRead: one read in flight for every caller, its result reused briefly."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from worker.daemon.report_cache import SharedRead, application_name
from worker.errors import SharedReadCancelledError


class Source:
    """A read that counts its calls and finishes when the test says so."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def read(self) -> int:
        self.calls += 1
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return self.calls


async def test_concurrent_callers_share_one_read_and_reuse_it_while_fresh() -> None:
    """Fifty callers at once: one read; the next caller within fresh_s reads nothing."""
    source = Source()
    shared = SharedRead(source.read, fresh_s=0.3)
    callers = [asyncio.create_task(shared.get()) for _ in range(50)]
    await asyncio.sleep(0.01)
    source.release.set()
    assert await asyncio.gather(*callers) == [1] * 50
    assert await shared.get() == 1
    assert (source.calls, shared.reads) == (1, 1)
    await asyncio.sleep(0.35)
    assert await shared.get() == 2
    assert source.calls == 2


async def test_a_failed_read_is_shared_but_not_reused() -> None:
    """Callers waiting on a failing read all see its error; the next caller reads again."""
    source = Source()
    source.fail = ConnectionRefusedError("no database")
    shared = SharedRead(source.read, fresh_s=60)
    callers = [asyncio.create_task(shared.get()) for _ in range(5)]
    await asyncio.sleep(0.01)
    source.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(r, ConnectionRefusedError) for r in results)
    assert source.calls == 1
    source.fail = None
    assert await shared.get() == 2
    assert await shared.get() == 2  # a success is reused


async def test_a_failure_is_reused_for_failure_fresh_s() -> None:
    """With failure_fresh_s, a failure answers the callers of that window without a read."""
    source = Source()
    source.release.set()
    source.fail = TimeoutError()
    shared = SharedRead(source.read, fresh_s=60, failure_fresh_s=0.2)
    for _ in range(3):
        with pytest.raises(TimeoutError):
            await shared.get()
    assert source.calls == 1
    source.fail = None
    await asyncio.sleep(0.25)
    assert await shared.get() == 2


async def test_a_caller_that_gives_up_does_not_cancel_the_read() -> None:
    """One caller's timeout leaves the read running: the others, and later callers, get it."""
    source = Source()
    shared = SharedRead(source.read, fresh_s=60)
    patient = asyncio.create_task(shared.get())
    with pytest.raises(TimeoutError), anyio.fail_after(0.05):
        await shared.get()
    source.release.set()
    assert await patient == 1
    assert await shared.get() == 1
    assert source.calls == 1


async def test_close_cancels_the_read_in_flight() -> None:
    """close() stops the read; a caller still waiting hears so as an error, not a cancel."""
    source = Source()
    shared = SharedRead(source.read, fresh_s=60)
    waiting = asyncio.create_task(shared.get())
    await asyncio.sleep(0.01)
    await shared.close()
    with pytest.raises(SharedReadCancelledError):
        await waiting


def test_application_name_is_cut_to_63_bytes_at_a_whole_character() -> None:
    """Postgres keeps 63 bytes of application_name; a multi-byte character is not split."""
    assert application_name("lane-worker-report", "rel_a") == "lane-worker-report rel_a"
    long = application_name("lane-worker-report", "x" * 100)
    assert len(long.encode()) == 63
    assert long.startswith("lane-worker-report xxx")
    # "lane-worker-report " is 19 bytes; "é" is 2.
    assert application_name("lane-worker-report", "x" * 42 + "é" * 5).endswith("xé")
    split = application_name("lane-worker-report", "x" * 43 + "é" * 5)
    assert split == "lane-worker-report " + "x" * 43
