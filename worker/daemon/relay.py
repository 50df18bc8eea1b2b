"""The ledger relay: every pending fact of a run that carries a runtime API, POSTed to it.

At least once, in order per run: a fact is leased from the store (a short
transaction; no pooled connection is held while a request is in flight), sent
as one ``POST`` of its JSON to the run's ``baseUrl`` + ``LANE_WORKER_LEDGER_PATH``
with a stable ``Idempotency-Key``, and marked delivered after a 2xx. A
connection error, a timeout, 408, 429 or a 5xx is tried again later (full-jitter
exponential backoff, from tenacity, capped at 10 minutes; a ``Retry-After`` is
honoured), and the endpoint is left alone until then; any other answer (4xx, a
redirect) gives the fact up with the reason, as does a fact still undelivered
after ``LANE_WORKER_LEDGER_RETRY_FOR``, and, without a request, a fact whose JSON
or whose run's context this process cannot read or use (written past the
store's checks). Each endpoint gets at most
``LANE_WORKER_LEDGER_PER_ENDPOINT`` requests at once, so a slow or dead one
delays no other. Any live worker delivers any fact (no play code is needed), so
a drained release's facts still go out after its machines stop; a worker killed
mid-request leaves its lease to expire, and the fact is sent again (the key
lets the endpoint drop the repeat). Tokens are sent, never logged or stored
elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import structlog

from worker.config.dburl import url_secrets
from worker.daemon.relay_request import (
    NO_ENDPOINT,
    backoff_s,
    endpoint_of,
    headers_for,
    host_of,
    retry_after_s,
    sent_secrets,
    unsendable,
    unusable,
)
from worker.db.pool import Database
from worker.db.store import Store
from worker.db.store.rows import PendingFact
from worker.masking import joined, mask_response
from worker.metrics import Metrics

IDLE_POLL_S = 5.0  # the safety net under the NOTIFY
_RETRYABLE = frozenset({408, 429})
_SHOWN_BODY = 200  # characters of a refusal's body kept as its reason


@dataclass(frozen=True)
class RelayConfig:
    """The relay's knobs (``LANE_WORKER_LEDGER_*``)."""

    path: str
    concurrency: int
    per_endpoint: int
    timeout_s: float
    retry_for_s: float

    @property
    def lease_s(self) -> float:
        # Outlives the request and the write that follows it; a killed relay's
        # facts are due again after it.
        return self.timeout_s + 10.0


class Relay:
    """Delivers the store's pending ledger facts until cancelled."""

    def __init__(
        self,
        db: Database,
        store: Store,
        *,
        worker_id: str,
        config: RelayConfig,
        metrics: Metrics,
        wakeup: asyncio.Event,
        idle_poll_s: Callable[[], float] = lambda: IDLE_POLL_S,
    ) -> None:
        self.db, self.store, self.worker_id = db, store, worker_id
        self.config, self.metrics, self.wakeup = config, metrics, wakeup
        # The safety net's period now: longer while LISTEN carries the ledger's NOTIFY.
        self.idle_poll_s = idle_poll_s
        self.log = structlog.get_logger("lane_worker.relay")
        self._in_flight: dict[int, str] = {}  # fact id -> its endpoint
        self._unsent: list[int] = []  # facts whose delivery was cancelled (a stop)
        self._backing_off: dict[str, float] = {}  # endpoint -> monotonic time it may be tried
        # Endpoints whose last answer was a failure: one request at a time (a probe)
        # until one succeeds, so endpoints that hang hold a slot each, not their share.
        self._failing: set[str] = set()
        self._slot_freed = asyncio.Event()
        self._next_due_s: float | None = None
        # A refusal's body may echo what was sent (an auth layer quoting the headers):
        # what is kept of it is masked with these and the fact's own tokens.
        self._db_secrets = url_secrets(db.options.url)

    def _share(self, endpoint: str) -> int:
        return 1 if endpoint in self._failing else self.config.per_endpoint

    def _skipped(self) -> list[str]:
        now = time.monotonic()
        self._backing_off = {e: t for e, t in self._backing_off.items() if t > now}
        busy = Tally(self._in_flight.values())
        full = [e for e, n in busy.items() if n >= self._share(e) and e != NO_ENDPOINT]
        return sorted(set(full) | set(self._backing_off))

    async def run(self) -> None:
        """Claim and deliver; wait for a NOTIFY, a free slot or the next due fact in between."""
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.config.concurrency)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, connector=connector) as http,
                anyio.create_task_group() as deliveries,
            ):
                while True:
                    claimed = await self._claim_some(http, deliveries)
                    if claimed:
                        continue  # more may be due
                    await self._wait()
        finally:
            await self._release_unsent()

    async def _claim_some(self, http: aiohttp.ClientSession, tg: anyio.abc.TaskGroup) -> int:
        # Cleared before the claim, not before the wait: a delivery that ends while
        # this pass still talks to the database must wake the next pass, not be lost
        # (the relay would then sleep the idle poll with a slot free).
        self.wakeup.clear()
        self._slot_freed.clear()
        free = self.config.concurrency - len(self._in_flight)
        if free <= 0:
            return 0
        skip = self._skipped()
        facts = await self.db.run(
            lambda c: self.store.ledger.claim(
                c,
                worker_id=self.worker_id,
                limit=free,
                lease_s=self.config.lease_s,
                skip_endpoints=skip,
            )
        )
        over: list[int] = []
        busy = Tally(self._in_flight.values())
        for fact in facts:
            endpoint = endpoint_of(fact)
            if endpoint != NO_ENDPOINT and busy[endpoint] >= self._share(endpoint):
                over.append(fact.fact_id)  # this batch brought more than its share
                continue
            busy[endpoint] += 1
            self._in_flight[fact.fact_id] = endpoint
            tg.start_soon(self._deliver_one, http, fact)
        if over:
            await self.db.run(
                lambda c: self.store.ledger.release(c, worker_id=self.worker_id, fact_ids=over)
            )
        if len(facts) < free:
            # Everything due was taken (or waits for an endpoint): read the backlog.
            await self._note_backlog()
            return 0
        return len(facts)

    async def _note_backlog(self) -> None:
        backlog = await self.db.run(self.store.ledger.backlog)
        self.metrics.ledger_pending.set(backlog.pending)
        self.metrics.ledger_oldest_undelivered.set(backlog.oldest_s or 0.0)
        self._next_due_s = backlog.next_due_s

    async def _wait(self) -> None:
        timeout = self.idle_poll_s()
        # A fact already due that this pass did not take waits for its endpoint (a
        # slot to free, a backoff to end, both woken below) or for another worker:
        # polling for it every few milliseconds would only load the database.
        if self._next_due_s is not None and self._next_due_s > 0:
            timeout = min(timeout, max(0.05, self._next_due_s))
        if self._backing_off:
            soonest = min(self._backing_off.values()) - time.monotonic()
            timeout = min(timeout, max(0.05, soonest))
        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as either:

                async def wake(event: asyncio.Event) -> None:
                    await event.wait()
                    either.cancel_scope.cancel()

                either.start_soon(wake, self.wakeup)
                either.start_soon(wake, self._slot_freed)

    async def _deliver_one(self, http: aiohttp.ClientSession, fact: PendingFact) -> None:
        endpoint = endpoint_of(fact)
        try:
            problem = unusable(fact)
            if problem is not None:
                label, said = problem
                why: dict[str, Any] = {**said, "tries": fact.delivery_attempts + 1}
                await self._give_up(fact, endpoint, why, label)
                return
            if self._backing_off.get(endpoint, 0.0) > time.monotonic():
                # Its endpoint failed since this was claimed: put it back unsent.
                wait = self._backing_off[endpoint] - time.monotonic()
                await self._record_retry(fact, wait, None, counts=False)
                return
            await self._deliver(http, fact, endpoint)
        except anyio.get_cancelled_exc_class():
            self._unsent.append(fact.fact_id)
            raise
        except Exception as exc:  # the store write failed: the lease expires, it goes again
            self.log.warning(
                "ledger.record_failed",
                run_id=str(fact.run_id),
                fact=fact.type,
                error=type(exc).__name__,
            )
        finally:
            self._in_flight.pop(fact.fact_id, None)
            self._slot_freed.set()

    async def _deliver(self, http: aiohttp.ClientSession, fact: PendingFact, endpoint: str) -> None:
        url = str(fact.api["baseUrl"]).rstrip("/") + self.config.path
        body = json.dumps(fact.fact, separators=(",", ":"), ensure_ascii=False).encode()
        status: int | None = None
        why: dict[str, Any]
        after: float | None = None
        try:
            async with http.post(
                url, data=body, headers=headers_for(fact), allow_redirects=False
            ) as response:
                status = response.status
                after = retry_after_s(response.headers.get("Retry-After"))
                text = (await response.content.read(_SHOWN_BODY * 4)).decode(errors="replace")
                # A body read in part may end in a cut secret: its beginning is masked too.
                cut = not response.content.at_eof()
            secrets = joined(sent_secrets(fact), self._db_secrets)
            why = {"status": status, "body": mask_response(text, secrets, _SHOWN_BODY, cut=cut)}
        except Exception as exc:
            if not unsendable(exc) and not isinstance(
                exc, aiohttp.ClientError | TimeoutError | OSError
            ):
                raise
            if unsendable(exc):
                # The context cannot make a request at all (a store that an older
                # build filled, say): no retry will change that.
                why = {
                    "error": type(exc).__name__,
                    "tries": fact.delivery_attempts + 1,
                    "reason": "the runtime API context cannot be sent",
                }
                await self._give_up(fact, endpoint, why, "refused")
                return
            # The class alone: an error's text may carry the URL.
            why = {"error": type(exc).__name__}
        tries = fact.delivery_attempts + 1
        if status is not None and 200 <= status < 300:
            self._failing.discard(endpoint)
            await self.db.run(lambda c: self.store.ledger.done(c, fact_id=fact.fact_id))
            self.metrics.ledger_delivered.inc()
            self.log.info(
                "ledger.delivered",
                run_id=str(fact.run_id),
                fact=fact.type,
                host=host_of(endpoint),
                status=status,
                tries=tries,
            )
            return
        why["tries"] = tries
        if status is None or status >= 500 or status in _RETRYABLE:
            age_s = time.time() - fact.created_at.timestamp()
            self._failing.add(endpoint)
            if age_s < self.config.retry_for_s:
                wait = backoff_s(tries, after)
                self._backing_off[endpoint] = time.monotonic() + wait
                await self._record_retry(fact, wait, why, counts=True)
                return
            why["reason"] = f"still undelivered after {self.config.retry_for_s:g} s"
            await self._give_up(fact, endpoint, why, "expired")
            return
        why["reason"] = "refused by the endpoint" if status < 300 or status >= 400 else "redirect"
        await self._give_up(fact, endpoint, why, "refused")

    async def _record_retry(
        self, fact: PendingFact, wait: float, why: dict[str, Any] | None, *, counts: bool
    ) -> None:
        await self.db.run(
            lambda c: self.store.ledger.retry(
                c,
                fact_id=fact.fact_id,
                worker_id=self.worker_id,
                in_s=wait,
                error=why,
                counts=counts,
            )
        )
        if counts:
            self.metrics.ledger_retries.inc()
            self.log.warning(
                "ledger.retry",
                run_id=str(fact.run_id),
                fact=fact.type,
                host=host_of(endpoint_of(fact)),
                retry_in_s=round(wait, 1),
                **{k: v for k, v in (why or {}).items() if k != "body"},
            )

    async def _give_up(
        self, fact: PendingFact, endpoint: str, why: dict[str, Any], reason: str
    ) -> None:
        await self.db.run(
            lambda c: self.store.ledger.failed(
                c, fact_id=fact.fact_id, worker_id=self.worker_id, error=why
            )
        )
        self.metrics.ledger_given_up.labels(reason).inc()
        self.log.error(
            "ledger.given_up",
            run_id=str(fact.run_id),
            fact=fact.type,
            host=host_of(endpoint),
            **{k: v for k, v in why.items() if k != "body"},
        )

    async def _release_unsent(self) -> None:
        """On the way out, make the facts still held due again at once (else: their lease)."""
        held = sorted({*self._unsent, *self._in_flight})
        self._unsent.clear()
        if not held:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            try:
                await self.db.run(
                    lambda c: self.store.ledger.release(c, worker_id=self.worker_id, fact_ids=held)
                )
            except Exception as exc:
                self.log.warning("ledger.release_failed", error=type(exc).__name__)
