"""Group commit: the fenced writes of the runs in flight, coalesced into one round trip.

A step's engine checkpoint and a completion are the two writes every run sends.
With many runs in flight they queued on the pool's few connections, one
statement and one commit each. ``GroupCommit`` sends a write at once, as its
own statement in its caller's task, when no other write is in flight: then it
is exactly the write without this class (a cancel of the caller reaches its
statement). Writes that arrive while one is in flight queue, and go together
as one ``write_sets`` statement (one transaction, one commit; the writes as
typed arrays, each kind written set-based: store migration 0027) when it
returns, or after ``group_wait_s`` at most: a write that is slow to return (it waits for
a lock, say) holds up no other run. A caller returns only once its write is
committed, so a step is still durable before the next one starts.

What keeps one run's trouble its own:
- in a batch, a write that fails (a lost lease, a cancel) is undone alone
  (the set-based statement judges each write before it writes any), and a
  write that waits over ``lock_wait_ms`` for a lock fails the same way (the
  statement then writes the batch one write at a time, each in a
  subtransaction). A write that failed for a
  lock goes again in a later batch, after a backoff (``LOCK_RETRY_S`` doubling
  to ``LOCK_RETRY_MAX_S``), holding no connection meanwhile: a row an operator's
  open transaction keeps locked must not take the pool's few connections from
  every other run. A write that failed otherwise is sent again alone, in its
  caller's task, as a write without batching goes, which raises the error the
  caller acts on;
- at most one write waits for a lock in its own statement (the one sent with
  nothing else in flight): a lone queued write goes as a batch of one, whose
  lock wait is bounded, while another write is alone in flight;
- a write whose JSON is over ``ALONE_BYTES`` is never batched;
- a caller cancelled while its write is in a batch in flight returns only once
  that statement has ended (bounded by ``CANCEL_WAIT_S``): its write commits
  before the caller's claim is handed back, or not at all. A caller cancelled
  before its batch was sent sends nothing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from worker.db import engine
from worker.db.pool import Connection, Database, is_transient
from worker.db.store import Store
from worker.db.store.attempts import CheckpointWrite, CompletionWrite

log = structlog.get_logger("lane_worker.runtime")

# Writes per batch at most: each runs in a subtransaction, and a transaction
# with more than 64 of them makes every snapshot on the server slower.
MAX_BATCH = 32
# How long queued writes wait for the write in flight before they go anyway.
GROUP_WAIT_S = 0.01
# A write in a batch waits this long for a lock at most, then goes again in a later batch.
LOCK_WAIT_MS = 50
# A write that found its rows locked goes again after this, doubling up to the max.
LOCK_RETRY_S = 0.05
LOCK_RETRY_MAX_S = 1.0
# After waiting this long for a lock, a write says so in the log (once).
LOCK_WAIT_WARN_S = 10.0
# SQLSTATE lock_not_available: what lock_timeout raises.
_LOCK_NOT_AVAILABLE = "55P03"
# A write this large (its JSON, bytes) is sent alone: a batch must stay quick.
ALONE_BYTES = 64 * 1024
# How long a cancelled caller waits for the batch its write is in to end.
CANCEL_WAIT_S = 10.0

# A write is one typed value, encoded once by its writer: sent alone or in a set.
BatchWrite = CheckpointWrite | CompletionWrite


def _size(write: BatchWrite) -> int:
    """Return the bytes of JSON ``write`` carries."""
    if isinstance(write, CheckpointWrite):
        return len(write.state or "")
    return len(write.output or "")


@dataclass(eq=False)
class _Pending:
    write: BatchWrite
    queued_at: float
    # True: committed in a batch; False: its caller sends it alone.
    done: asyncio.Future[bool] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    sent: asyncio.Future[Any] | None = None  # the batch statement it went in
    lock_waits: int = 0  # batches it failed in for a lock so far
    first_sent_at: float = 0.0
    warned: bool = False


class GroupCommit:
    """Coalesces the fenced writes of one worker's runs in flight."""

    def __init__(
        self,
        db: Database,
        store: Store,
        *,
        max_batch: int = MAX_BATCH,
        group_wait_s: float = GROUP_WAIT_S,
        lock_wait_ms: int = LOCK_WAIT_MS,
    ) -> None:
        self.db = db
        self.store = store
        self.max_batch = max_batch
        self.group_wait_s = group_wait_s
        self.lock_wait_ms = lock_wait_ms
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._alone = 0  # writes in flight as their own statements
        self._returned = asyncio.Event()  # one of those returned
        self._returned_at = 0.0  # when one last did (monotonic)
        # What it did, for tests and the bench: statements sent, the most writes in one.
        self.flushes = 0
        self.largest = 0

    @property
    def waiting(self) -> int:
        """Return how many writes are queued for the next batch."""
        return len(self._pending)

    @property
    def busy(self) -> bool:
        """Tell whether a write is in flight (a new one then queues for a batch)."""
        return self._alone > 0 or self._flusher is not None

    async def write(self, write: BatchWrite) -> None:
        """Commit one write, grouped with others when some are in flight.

        Raises what the write raises sent alone (``_write_alone``): the error its
        caller acts on (a lost lease, a cancel).
        """
        if not self.busy or _size(write) > ALONE_BYTES:
            await self._send_alone(write)
            return
        pending = _Pending(write, time.monotonic())
        self._enqueue(pending)
        try:
            committed = await pending.done
        except asyncio.CancelledError:
            pending.done.cancel()  # never sent again (it may wait to retry a lock)
            sent = pending.sent
            if sent is not None and not sent.done():
                # Its write is in a statement in flight: let that end first, so it
                # cannot commit after this caller's claim was handed back.
                with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
                    await asyncio.wait({sent})
            raise
        if not committed:
            # Alone after all (the only one of its batch), or failed in a batch
            # and undone: its own statement commits it or says why not.
            await self._send_alone(write)

    def _enqueue(self, pending: _Pending) -> None:
        if pending.done.done():
            return  # its caller was cancelled while it waited for a lock
        pending.sent = None
        pending.queued_at = time.monotonic()
        self._pending.append(pending)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_all(), name="lane-worker group commit")

    def _retry_for_lock(self, pending: _Pending) -> None:
        """Send ``pending`` again in a later batch, after a backoff that holds no connection."""
        pending.lock_waits += 1
        waited_s = time.monotonic() - pending.first_sent_at
        if waited_s >= LOCK_WAIT_WARN_S and not pending.warned:
            pending.warned = True
            log.warning("group_commit.lock_wait", waited_s=round(waited_s, 1))
        delay = min(LOCK_RETRY_MAX_S, LOCK_RETRY_S * 2 ** (pending.lock_waits - 1))
        asyncio.get_running_loop().call_later(delay, self._enqueue, pending)

    async def _write_alone(self, conn: Connection, write: BatchWrite) -> None:
        """Send ``write`` as its own statement, translating a refusal into the error to act on."""
        w = write
        if isinstance(w, CheckpointWrite):
            await engine.set_checkpoint(
                conn,
                w.queue,
                w.task_id,
                w.name,
                w.state,
                w.engine_run_id,
                extend_lease_s=w.extend_s,
            )
            return
        # One statement (the engine's complete, the settle, the attempt's end):
        # the hot path's single round trip to end a run.
        with engine.fenced(w.engine_run_id):
            await self.store.attempts.complete(conn, w)

    async def _send_alone(self, write: BatchWrite) -> None:
        self._alone += 1
        self.flushes += 1
        self.largest = max(self.largest, 1)
        try:
            await self.db.run(lambda conn: self._write_alone(conn, write))
        finally:
            self._alone -= 1
            self._returned_at = time.monotonic()
            self._returned.set()

    async def _flush_all(self) -> None:
        try:
            while self._pending:
                await self._wait_for_alone()
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                # A caller cancelled before its write was sent: send nothing for it.
                batch = [p for p in batch if not p.done.done()]
                if len(batch) == 1 and not batch[0].lock_waits and not self._alone:
                    batch[0].done.set_result(False)  # its caller's own statement
                elif batch:
                    await self._flush(batch)
        finally:
            self._flusher = None
            # Only a cancelled flusher (the loop shutting down) leaves writes
            # behind: their callers must not wait for ever.
            for left in self._pending:
                left.done.cancel()
            self._pending.clear()

    async def _wait_for_alone(self) -> None:
        """Wait until a write in flight alone returns (after the oldest queued), or the group wait.

        The group goes as soon as one statement returns, as a batch would; a
        write that is slow to return holds the group up for the group wait only.
        """
        while self._pending and self._alone and self._returned_at < self._pending[0].queued_at:
            left_s = self._pending[0].queued_at + self.group_wait_s - time.monotonic()
            if left_s <= 0:
                return
            self._returned.clear()
            try:
                await asyncio.wait_for(self._returned.wait(), left_s)
            except TimeoutError:
                return

    async def _flush(self, batch: list[_Pending]) -> None:
        self.flushes += 1
        self.largest = max(self.largest, len(batch))
        checkpoints: list[CheckpointWrite] = []
        completions: list[CompletionWrite] = []
        at: list[tuple[int, int]] = []  # each pending's (kind, position in its list)
        for p in batch:
            if isinstance(p.write, CheckpointWrite):
                at.append((0, len(checkpoints)))
                checkpoints.append(p.write)
            else:
                at.append((1, len(completions)))
                completions.append(p.write)
        sent = asyncio.ensure_future(
            self.db.run(
                lambda c: self.store.attempts.write_sets(
                    c, checkpoints, completions, lock_wait_ms=self.lock_wait_ms
                )
            )
        )
        for p in batch:
            p.sent = sent
            p.first_sent_at = p.first_sent_at or time.monotonic()
        failed_sets: tuple[dict[int, str], dict[int, str]] | None
        try:
            failed_sets = await asyncio.shield(sent)
        except asyncio.CancelledError:
            sent.cancel()
            for p in batch:
                p.done.cancel()
            raise
        except Exception as exc:
            if is_transient(exc):
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                return
            # Not the server going away: something in the batch itself (one bad
            # value fails the whole statement). Each write goes again alone.
            log.warning("group_commit.batch_failed", error=type(exc).__name__, writes=len(batch))
            failed_sets = None
        for (kind, position), p in zip(at, batch, strict=True):
            if p.done.done():
                continue
            code = None if failed_sets is None else failed_sets[kind].get(position)
            if code == _LOCK_NOT_AVAILABLE:
                self._retry_for_lock(p)
            else:
                p.done.set_result(failed_sets is not None and code is None)
