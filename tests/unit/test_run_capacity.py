"""The run slots every claim loop of a process shares."""

from __future__ import annotations

import asyncio

from worker.run.claim import Capacity


async def test_reserve_takes_every_free_slot_up_to_most() -> None:
    """With slots free and no batch asked for, reserve returns at once with what it may take."""
    capacity = Capacity(8)
    assert await capacity.reserve(5) == 5
    assert await capacity.reserve(5) == 3
    assert capacity.free == 0


async def test_reserve_waits_for_a_release_when_nothing_is_free() -> None:
    """No free slot: reserve waits until one is released, then takes it."""
    capacity = Capacity(2)
    assert await capacity.reserve(2) == 2
    waiting = asyncio.ensure_future(capacity.reserve(2))
    await asyncio.sleep(0)
    assert not waiting.done()
    capacity.release(1)
    assert await waiting == 1


async def test_a_batch_reserve_waits_for_the_batch_while_patient() -> None:
    """Asked for at least 3, one free slot is not enough: it waits until 3 are free."""
    capacity = Capacity(4)
    assert await capacity.reserve(4) == 4
    capacity.release(1)
    waiting = asyncio.ensure_future(capacity.reserve(4, at_least=3, patience_s=60))
    await asyncio.sleep(0)
    assert not waiting.done()
    capacity.release(1)
    await asyncio.sleep(0)
    assert not waiting.done()
    capacity.release(1)
    assert await waiting == 3
    assert capacity.free == 0


async def test_a_batch_reserve_takes_what_is_free_once_patience_runs_out() -> None:
    """When the batch does not free up within the patience, reserve takes the free slots."""
    capacity = Capacity(4)
    assert await capacity.reserve(3) == 3
    assert await capacity.reserve(4, at_least=4, patience_s=0.01) == 1


async def test_a_batch_larger_than_the_process_is_capped() -> None:
    """At least 16 of a capacity of 2 means all of it, not a wait that can never end."""
    capacity = Capacity(2)
    assert await capacity.reserve(16, at_least=16, patience_s=60) == 2


async def test_a_batch_reserve_stops_waiting_once_the_frees_stop() -> None:
    """Slots held by long runs: once none has freed for the gap, take the free ones.

    The patience is a minute here; only the gap can end the wait. Slots freed
    within the gap keep it waiting for the batch.
    """
    capacity = Capacity(8)
    assert await capacity.reserve(8) == 8
    capacity.release(2)
    waiting = asyncio.ensure_future(capacity.reserve(8, at_least=6, patience_s=60, gap_s=1.0))
    await asyncio.sleep(0.05)
    capacity.release(1)  # within the gap: it waits on
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert await asyncio.wait_for(waiting, 5) == 3  # the other 5 stay held


async def test_slots_another_loop_took_during_the_patience_are_waited_for_again() -> None:
    """Its patience ends with nothing free (a continuation loop took the slot): it waits on.

    It returned 0, which a claim loop reads as its stop: the own loop of a
    worker ended for good under a backlog, and its lane never drained (the
    chaos test, seed 368423 in CI).
    """
    capacity = Capacity(2)
    assert await capacity.reserve(2) == 2
    capacity.release(1)
    own = asyncio.ensure_future(capacity.reserve(16, at_least=2, patience_s=0.05))
    await asyncio.sleep(0)
    assert await capacity.reserve(1) == 1  # another loop takes the free slot
    await asyncio.sleep(0.2)  # the patience ran out meanwhile
    assert not own.done()
    capacity.release(1)
    assert await asyncio.wait_for(own, 5) == 1
