"""Database access: one small asyncpg pool, JSON in and out, retries of transient errors only.

Every unit of work is a coroutine function taking a connection; ``Database.run``
and ``Database.transaction`` retry the *whole* unit when the connection drops,
the server restarts, or Postgres reports a serialization failure or deadlock.
Nothing else is retried: a constraint violation or an engine exception is a
result, and retrying it would only repeat it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import asyncpg
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from worker.config.dburl import (
    DATABASE_URL_ENV,
    mask_secrets,
    redact_url,
    unreadable_files,
    url_secrets,
)
from worker.errors import LaneConfigError
from worker.jsonvalue import decode_json

log = structlog.get_logger("lane_worker.db")

T = TypeVar("T")
# asyncpg's prepared-statement cache per connection (it was 100, asyncpg's default).
STATEMENT_CACHE_SIZE = 250
# The largest statement asyncpg keeps prepared (its default is 15 KiB). The static
# claims (sql/engine/own_claim.sql, adopt_claim.sql) are about 15 KiB once a queue's
# table names are filled in, so with a release id of a dozen characters or more they
# were not cached: PostgreSQL parsed and planned each claim again, about 5.7 ms a call
# under bench/steady.py's load (pg_stat_statements: plans == calls), more than the
# claim's execution.
MAX_CACHED_STATEMENT_BYTES = 256 * 1024
# Units of work get a pooled proxy; tests and the LISTEN loop may pass a plain connection.
if TYPE_CHECKING:
    Connection: TypeAlias = (
        asyncpg.pool.PoolConnectionProxy[asyncpg.Record] | asyncpg.Connection[asyncpg.Record]
    )
else:  # the runtime classes are not generic
    Connection = asyncpg.pool.PoolConnectionProxy | asyncpg.Connection
Unit = Callable[[Connection], Awaitable[T]]

_TRANSIENT_POSTGRES = (
    asyncpg.PostgresConnectionError,  # class 08: the connection broke
    asyncpg.CannotConnectNowError,  # 57P03: server starting up or shutting down
    asyncpg.AdminShutdownError,  # 57P01
    asyncpg.CrashShutdownError,  # 57P02
    asyncpg.TooManyConnectionsError,  # 53300: a slot frees up soon
    asyncpg.SerializationError,  # 40001
    asyncpg.DeadlockDetectedError,  # 40P01
)


def _rejects_tls(exc: BaseException) -> bool:
    # asyncpg's wording when sslmode=require meets a server without TLS.
    return isinstance(exc, ConnectionError) and "rejected SSL upgrade" in str(exc)


def connect_refusal(exc: BaseException, url: str) -> LaneConfigError | None:
    """Return the configuration error behind a failed connect, or None if it was not one.

    Retrying cannot fix these: the URL's TLS settings or parameters must change.
    """
    if _rejects_tls(exc):
        said = (
            f"the database server does not accept TLS, but {DATABASE_URL_ENV} asks for it "
            "(sslmode=require or verify-*): enable TLS on the server, or set sslmode=prefer "
            "or disable in the URL."
        )
    elif isinstance(exc, asyncpg.ClientConfigurationError):
        detail = mask_secrets(str(exc), url_secrets(url))
        said = f"{DATABASE_URL_ENV} cannot be used as written ({detail}): fix the URL's parameters."
    elif isinstance(exc, OSError) and (missing := unreadable_files(url)):
        # A certificate or key file the URL names is missing or unreadable: no retry
        # brings it. (A missing Unix socket, while a server restarts, is retried.)
        said = (
            f"{DATABASE_URL_ENV} names {', '.join(missing)}, which cannot be read: fix the "
            "path or the file's permissions."
        )
    elif isinstance(exc, asyncpg.UndefinedObjectError | asyncpg.InvalidParameterValueError):
        # A query parameter the server takes as a setting it does not know (a typo:
        # sslmod=require), or a value it refuses.
        detail = mask_secrets(str(exc), url_secrets(url))
        said = (
            f"{DATABASE_URL_ENV} has a parameter the server refuses ({detail}): fix or remove it."
        )
    else:
        return None
    return LaneConfigError(said, variable=DATABASE_URL_ENV)


def is_transient(exc: BaseException) -> bool:
    """Tell whether retrying the same unit of work on a fresh connection can succeed."""
    if _rejects_tls(exc):
        return False
    if isinstance(exc, _TRANSIENT_POSTGRES):
        return True
    if isinstance(exc, asyncpg.InternalClientError):
        # asyncpg loses track of its protocol state when the server ends a backend
        # mid-transaction ("cannot switch to state ..."): that connection is gone,
        # a fresh one works (asyncpg issue 1069).
        return True
    if isinstance(exc, asyncpg.ObjectNotInPrerequisiteStateError):
        # 55000 at connect: `alter database ... allow_connections false` (an
        # operator's maintenance window), an outage like any other. The same code
        # from a statement is a result, not retried.
        return "not currently accepting connections" in str(exc)
    if isinstance(exc, asyncpg.InterfaceError):
        # The pool hands out a connection the server has since closed.
        return "connection is closed" in str(exc) or "connection was closed" in str(exc)
    # Refused, reset, DNS hiccup, connect timeout.
    return isinstance(exc, OSError | TimeoutError)


@dataclass(frozen=True)
class PoolOptions:
    """How to open the pool: size, identity, PgBouncer compatibility, retry budget."""

    url: str
    max_size: int = 2
    application_name: str = "lane-worker"
    pgbouncer: bool = False
    retry_for_s: float = 30.0
    connect_timeout_s: float = 10.0


async def _init_connection(conn: Connection) -> None:
    # JSON and JSONB as Python values both ways, so no call site encodes by hand.
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name, encoder=json.dumps, decoder=decode_json, schema="pg_catalog"
        )


async def _keep_session(_conn: Connection) -> None:
    """Reset nothing when a connection goes back to the pool.

    asyncpg's default reset sends `pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`, one more round trip and transaction per unit of work. lane-worker
    leaves no session state on pooled connections: its advisory locks are
    transaction-scoped, LISTEN has its own connection and nothing SETs a session
    value. asyncpg still rolls back a transaction left open before calling this.
    """


def _log_failed_try(attempt: int, exc: BaseException | None) -> None:
    log.warning(
        "db.retry",
        attempt=attempt,
        error=type(exc).__name__ if exc else None,
        detail=str(exc)[:200] if exc else None,
    )


def _log_retry(state: RetryCallState) -> None:
    _log_failed_try(state.attempt_number, state.outcome.exception() if state.outcome else None)


def _log_later_retry(state: RetryCallState) -> None:
    # Tenacity starts counting after the untracked first try.
    _log_failed_try(state.attempt_number + 1, state.outcome.exception() if state.outcome else None)


class Database:
    """A pool plus the retry policy; the one way lane-worker talks to Postgres."""

    def __init__(self, pool: asyncpg.Pool, options: PoolOptions) -> None:
        self.pool = pool
        self.options = options

    @classmethod
    async def open(cls, options: PoolOptions) -> Database:
        """Open the pool, retrying while the server is unreachable for ``retry_for_s``.

        Raises ``LaneConfigError`` when the URL's settings, not the network, stop it.
        """
        try:
            pool: asyncpg.Pool = await cls._retrying(options.retry_for_s)(cls._create_pool, options)
        except Exception as exc:
            refusal = connect_refusal(exc, options.url)
            if refusal is None:
                raise
            raise refusal from None
        return cls(pool, options)

    @staticmethod
    async def _create_pool(options: PoolOptions) -> asyncpg.Pool:
        pool = await asyncpg.create_pool(
            options.url,
            min_size=0,
            max_size=options.max_size,
            init=_init_connection,
            reset=_keep_session,
            timeout=options.connect_timeout_s,
            # Prepared statements do not survive PgBouncer transaction pooling. Room for
            # a maintenance pass's per-queue reconcile statements (RECONCILE_PER_PASS) on
            # top of the hot ones: at 100 a pass evicted them all, and each re-prepare
            # outside a transaction is a transaction of its own (issue 35's idle cost).
            statement_cache_size=0 if options.pgbouncer else STATEMENT_CACHE_SIZE,
            max_cacheable_statement_size=MAX_CACHED_STATEMENT_BYTES,
            server_settings={"application_name": options.application_name},
        )
        # min_size=0 opens nothing: prove the server answers before reporting success.
        try:
            async with pool.acquire() as conn:
                await conn.fetchval("select 1")
        except BaseException:
            # A retry makes a new pool: this one must not keep a connection open
            # (a slow server under load left two and three behind).
            pool.terminate()
            raise
        return pool

    @staticmethod
    def _retrying(
        retry_for_s: float, log_retry: Callable[[RetryCallState], None] = _log_retry
    ) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_delay(retry_for_s),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1),
            before_sleep=log_retry,
            reraise=True,
        )

    async def run(self, unit: Unit[T]) -> T:
        """Run ``unit`` on a pooled connection (autocommit), retrying transient errors."""

        async def once() -> T:
            async with self.pool.acquire() as conn:
                return await unit(conn)

        return await self._with_retries(once)

    async def transaction(self, unit: Unit[T]) -> T:
        """Run ``unit`` in one transaction, retrying the whole transaction on transient errors."""

        async def once() -> T:
            async with self.pool.acquire() as conn, conn.transaction():
                return await unit(conn)

        return await self._with_retries(once)

    async def _with_retries(self, once: Callable[[], Awaitable[T]]) -> T:
        # The first try goes without tenacity: building its retry state for every
        # unit of work cost about 20 us, several times per run, on the hot path.
        started = time.monotonic()
        try:
            return await once()
        except Exception as exc:
            left_s = self.options.retry_for_s - (time.monotonic() - started)
            if not is_transient(exc) or left_s <= 0:
                raise
            _log_failed_try(1, exc)
        # The budget counts the first try. A fresh connection is tried at once, then
        # with backoff.
        return await self._retrying(left_s, _log_later_retry)(once)

    async def execute(self, sql: str, *args: Any) -> str:
        """Execute one statement with retries."""
        return await self.run(lambda conn: conn.execute(sql, *args))

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """Fetch rows with retries."""
        return await self.run(lambda conn: conn.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        """Fetch one row (or None) with retries."""
        return await self.run(lambda conn: conn.fetchrow(sql, *args))

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """Fetch one value with retries."""
        return await self.run(lambda conn: conn.fetchval(sql, *args))

    async def close(self) -> None:
        """Close the pool, waiting for connections in use to be released."""
        await self.pool.close()

    def __repr__(self) -> str:
        return f"Database({redact_url(self.options.url)!r}, max_size={self.options.max_size})"
