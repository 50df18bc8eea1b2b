"""Group commit: the fenced writes of the runs in flight, coalesced into one round trip.

A step's engine checkpoint and a completion are the two writes every run sends.
With many runs in flight they queued on the pool's few connections, one
statement and one commit each. ``GroupCommit`` sends a write at once, as its
own statement in its caller's task, when nothing else is being written: then
it is exactly the write without this class (a cancel of the caller reaches its
statement). Writes that arrive while a statement is in flight wait for it and
go together as soon as it returns: two or more as one ``write_batch`` statement
(one transaction, one commit), where each write is undone alone if it fails.
A caller returns only once its write is committed, so a step is still durable
before the next one starts.

A write the batch reports failed is sent again alone, by its caller, through
the same code a write without batching takes: that statement raises the error
the caller acts on (a lost lease, a cancel), and a run's failure never fails
another's write. A batch is shared: a caller cancelled once its write was sent
in one does not stop it, so that write may commit (as a write whose reply a
cancel overtook always could); one cancelled before its batch was sent is
dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store

log = structlog.get_logger("lane_worker.runtime")

# Writes per batch at most: each runs in a subtransaction, and a transaction
# with more than 64 of them makes every snapshot on the server slower.
MAX_BATCH = 32

Write = Callable[[Connection], Awaitable[None]]


@dataclass(eq=False)
class _Pending:
    entry: dict[str, Any]  # its write_batch entry
    alone: Write  # the same write as its own statement
    # True: committed in a batch; False: its caller sends it alone.
    done: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit:
    """Coalesces the fenced writes of one worker's runs in flight."""

    def __init__(self, db: Database, store: Store, *, max_batch: int = MAX_BATCH) -> None:
        self.db = db
        self.store = store
        self.max_batch = max_batch
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._in_flight = 0  # statements being written: writes alone, and the flusher
        # What it did, for tests and the bench: statements sent, the most writes in one.
        self.flushes = 0
        self.largest = 0

    @property
    def waiting(self) -> int:
        """Return how many writes wait for a statement in flight to return."""
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """Tell whether a write is in flight (a new one then waits to be grouped)."""
        return self._in_flight > 0

    async def write(self, entry: dict[str, Any], alone: Write) -> None:
        """Commit one write, grouped with others when some are in flight; raise as ``alone``."""
        if not self._in_flight:
            await self._alone(alone)
            return
        pending = _Pending(entry, alone)
        self._pending.append(pending)
        if not await pending.done:
            # Alone after all (the only one of its flush), or failed in a batch
            # and undone: its own statement commits it or says why not.
            await self._alone(alone)

    async def _alone(self, alone: Write) -> None:
        self._in_flight += 1
        self.flushes += 1
        self.largest = max(self.largest, 1)
        try:
            await self.db.run(alone)
        finally:
            self._in_flight -= 1
            self._kick()

    def _kick(self) -> None:
        # Writes that waited for the statement that just returned go now.
        if self._pending and self._flusher is None:
            self._in_flight += 1
            self._flusher = asyncio.create_task(self._flush_all(), name="lane-worker group commit")

    async def _flush_all(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                # A caller cancelled before its write was sent: send nothing for it.
                batch = [p for p in batch if not p.done.done()]
                if len(batch) == 1:
                    batch[0].done.set_result(False)  # its caller's own statement
                elif batch:
                    await self._flush(batch)
        finally:
            self._flusher = None
            self._in_flight -= 1
            # Only a cancelled flusher (the loop shutting down) leaves writes
            # behind: their callers must not wait for ever.
            for left in self._pending:
                left.done.cancel()
            self._pending.clear()

    async def _flush(self, batch: list[_Pending]) -> None:
        self.flushes += 1
        self.largest = max(self.largest, len(batch))
        entries = [p.entry for p in batch]
        failed: dict[int, str] | None
        try:
            failed = await self.db.run(lambda c: self.store.attempts.write_batch(c, entries))
        except Exception as exc:
            if is_transient(exc):
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                return
            # Not the server going away: something in the batch itself (one bad
            # value fails the whole statement). Each write goes again alone.
            log.warning("group_commit.batch_failed", error=type(exc).__name__, writes=len(batch))
            failed = None
        except BaseException:
            for p in batch:
                p.done.cancel()
            raise
        for at, p in enumerate(batch):
            if not p.done.done():
                p.done.set_result(failed is not None and at not in failed)
