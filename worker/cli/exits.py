"""How a command ends when something went wrong: one sentence on stderr, an exit code.

The exit code of an error is ``errors.exit_code_for``'s (the one map, which the
daemon's boot asks too); here it picks the ``Failure`` click exits with, and
the sentence is built with the database URL and its password scrubbed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO, Any

import asyncpg
import click

from worker.config import dburl
from worker.config.env import DATABASE_URL_ENV
from worker.db.pool import is_transient
from worker.errors import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_USAGE,
    LaneWorkerError,
    exit_code_for,
    printable,
    sole_error,
)

_MISSING_SCHEMA = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedFunctionError,
    asyncpg.InvalidSchemaNameError,
)


class Failure(click.ClickException):
    """A command failed: one sentence on stderr, prefixed ``lane-worker:``; exit 1."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(printable(f"lane-worker: {self.format_message()}"), err=True)


class UsageFailure(Failure):
    """The request itself is unusable (exit 2), found after the command line parsed."""

    exit_code = EXIT_USAGE


class ConfigRefused(Failure):
    """The configuration is refused (exit 78): the environment or the schemas must change."""

    exit_code = EXIT_CONFIG


_BY_CODE: dict[int, type[Failure]] = {EXIT_USAGE: UsageFailure, EXIT_CONFIG: ConfigRefused}


def failure_of(exc: LaneWorkerError, said: str | None = None) -> Failure:
    """Return the Failure that exits with ``exc``'s code, saying ``said`` (default: ``exc``)."""
    return _BY_CODE.get(exit_code_for(exc), Failure)(str(exc) if said is None else said)


def scrub(text: str, url: str) -> str:
    """Remove the database URL and its password from ``text`` (driver messages may echo them)."""
    text = text.replace(url, dburl.redact_url(url)) if url else text
    return dburl.mask_secrets(text, dburl.url_secrets(url))


def failure_for(exc: Exception, url: str) -> Failure:
    """Map an exception of a command to its exit code and one sentence."""
    where = dburl.redact_url(url) if url else "(not set)"
    said = scrub(str(exc), url)
    if isinstance(exc, LaneWorkerError):
        return failure_of(exc, said)
    if is_transient(exc):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return Failure(
            f"cannot reach the runtime database at {where} ({scrub(reason, url)}); "
            "check that it is running and that the URL is right."
        )
    if isinstance(exc, _MISSING_SCHEMA):
        return Failure(
            f"the runtime database at {where} lacks lane-worker's schemas ({said}); "
            "run lane-worker migrate first."
        )
    if isinstance(exc, asyncpg.InvalidCatalogNameError):  # 3D000: no such database
        return Failure(
            f"the runtime database at {where} answered: {said}; create it (createdb, or "
            "CREATE DATABASE) and run lane-worker migrate, or fix the URL's database name."
        )
    if isinstance(exc, asyncpg.PostgresError):
        return Failure(f"the runtime database at {where} answered: {said}")
    return Failure(f"unexpected {type(exc).__name__}: {said}")


def daemon_exit(run: Callable[[], int], env: os._Environ[str]) -> int:
    """Run a daemon; map what escapes it to an exit code and one sentence, never a traceback.

    The daemon says its own boot refusals (``worker.daemon.boot``); this is the rest.
    """
    try:
        return run()
    except Exception as exc:
        url = (env.get(DATABASE_URL_ENV) or "").strip()
        raise failure_for(sole_error(exc), url) from None
