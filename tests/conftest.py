"""Fixtures for every test suite (unit, integration, e2e).

Real PostgreSQL: ``pg_server`` (session) is the server, ``database_url`` a fresh, migrated
database for one test, ``db`` an open asyncpg connection to it, ``empty_database_url`` a fresh
database without lane-worker's schemas. The server starts on first use, so a test
run that requests none of these never starts PostgreSQL. The machinery is in
``support/pgfixture.py`` next to this file: ``tests/`` has no ``__init__.py``, so pytest's
default ("prepend") import mode puts this directory on ``sys.path`` before importing this
conftest, which makes the package importable as the top-level ``support`` (from test
modules too: ``from support.cli import run_cli``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from support import pgfixture
from support.pgfixture import DatabaseFactory, PgServer

# A run's temporary folders, when pytest is not given --basetemp: one private base per
# run. pytest's shared default (/tmp/pytest-of-<user>) is set back to mode 700 by every
# pytest that starts, and as root embedded PostgreSQL runs as another user that must
# traverse it: another pytest starting on the machine broke a running test's server.
OWN_BASETEMP_PREFIX = "lane-worker-tests-"
OLD_BASETEMP_S = 2 * 86400  # a kept base (a failed run's) is removed two days later
_OWN_BASETEMP = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.option.basetemp:
        return  # an xdist worker gets its folder from the controller; a given one is kept
    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{OWN_BASETEMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > OLD_BASETEMP_S:
                shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = tempfile.mkdtemp(prefix=OWN_BASETEMP_PREFIX, dir=root)
    config.stash[_OWN_BASETEMP] = Path(config.option.basetemp)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is not None and exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)  # a failed run's folders are kept to read


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs PostgreSQL ``db``, so ``-m "not db"`` deselects them."""
    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL: ``$LANE_WORKER_TEST_DATABASE_URL``, else embedded PostgreSQL.

    A named server that does not answer ends the session with one message; there is no
    silent fallback to the embedded server.
    """
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(pgfixture.session_server())
        except pgfixture.DatabaseUnavailableError as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
        yield server


@pytest.fixture(scope="session")
def pg_databases(pg_server: PgServer) -> Iterator[DatabaseFactory]:
    """This session's template database (prepared once) and the factory of its clones."""
    with pgfixture.session_databases(pg_server) as databases:
        yield databases


@pytest.fixture
def database_url(pg_databases: DatabaseFactory) -> Iterator[str]:
    """URL of a fresh, migrated database for this test (a clone of the template, dropped after).

    It holds the engine schema and the store in its default schema, as ``lane-worker
    migrate`` leaves them, and nothing else: no queue, no lane, no row.
    """
    with pg_databases.fresh_database() as url:
        yield url


@pytest.fixture
def empty_database_url(pg_databases: DatabaseFactory) -> Iterator[str]:
    """URL of a fresh database with no schema of lane-worker's at all (dropped afterwards).

    For what must start from nothing: installing the schemas, and refusing to work
    without them.
    """
    with pg_databases.empty_database() as url:
        yield url


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    """An open asyncpg connection to this test's fresh database, closed after the test."""
    conn = await asyncpg.connect(database_url, timeout=pgfixture.CONNECT_TIMEOUT)
    try:
        yield conn
    finally:
        await conn.close()
