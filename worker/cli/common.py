"""What every command shares: failures and their exit codes, the client, output."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import IO, Any, TypeVar

import asyncpg
import click
import structlog

from worker.client import CONNECT_VARIABLES, LaneClient
from worker.config import dburl, settings
from worker.db.pool import is_transient
from worker.errors import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_USAGE,
    SHOWN_CHARS,
    EngineSchemaError,
    InvalidRequestError,
    LaneConfigError,
    LaneWorkerError,
    StoreSchemaError,
    printable,
)

T = TypeVar("T")
DEFAULT_APP = "worker.demo:app"
# The CLI answers within seconds when the database is away; the daemon waits longer.
CONNECT_RETRY_S = 10.0


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


def scrub(text: str, url: str) -> str:
    """Remove the database URL and its password from ``text`` (driver messages may echo them)."""
    text = text.replace(url, dburl.redact_url(url)) if url else text
    return dburl.mask_secrets(text, dburl.url_secrets(url))


def failure_for(exc: Exception, url: str) -> Failure:
    """Map an exception of a command to its exit code and one sentence."""
    where = dburl.redact_url(url) if url else "(not set)"
    said = scrub(str(exc), url)
    if isinstance(exc, LaneConfigError | EngineSchemaError | StoreSchemaError):
        return ConfigRefused(said)
    if isinstance(exc, InvalidRequestError):
        return UsageFailure(said)
    if isinstance(exc, LaneWorkerError):
        return Failure(said)
    if is_transient(exc):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return Failure(
            f"cannot reach the runtime database at {where} ({scrub(reason, url)}); "
            "check that it is running and that the URL is right."
        )
    if isinstance(exc, _MISSING_SCHEMA):
        return Failure(f"the runtime database at {where} lacks lane-worker's schemas ({said}); "
                       "run lane-worker migrate first.")  # fmt: skip
    if isinstance(exc, asyncpg.PostgresError):
        return Failure(f"the runtime database at {where} answered: {said}")
    return Failure(f"unexpected {type(exc).__name__}: {said}")


def with_client(action: Callable[[LaneClient], Awaitable[T]], *, check: tuple[str, ...] = ()) -> T:
    """Connect a client from the environment, run ``action`` with it, map failures to exits."""
    env = os.environ
    url = (env.get(settings.DATABASE_URL_ENV) or "").strip()
    diagnosis = settings.diagnose(env)  # the one parse of the environment
    for error in diagnosis.errors:
        if error.variable in CONNECT_VARIABLES + check:
            raise ConfigRefused(str(error))
    # Library logs (retry warnings) would break the one-sentence and --json contracts.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )

    async def main() -> T:
        try:
            client = await LaneClient.connect(
                env=env, retry_for_s=CONNECT_RETRY_S, diagnosis=diagnosis
            )
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            if isinstance(exc, LaneConfigError):
                raise
            # The driver could not parse the URL; nothing reached the server.
            raise ConfigRefused(
                f"{settings.DATABASE_URL_ENV} is not a usable database URL "
                f"({scrub(str(exc), url)}): set it to postgresql://user:password@host:5432/dbname."
            ) from None
        try:
            return await action(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except Failure:
        raise
    except Exception as exc:
        raise failure_for(exc, url) from None


def daemon_exit(run: Callable[[], int], env: os._Environ[str]) -> int:
    """Run a daemon; map what escapes it to an exit code and one sentence, never a traceback."""
    try:
        return run()
    except Exception as exc:
        # A task group wraps the one error that ended it.
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            inner = exc.exceptions[0]
            if not isinstance(inner, Exception):
                break
            exc = inner
        url = (env.get(settings.DATABASE_URL_ENV) or "").strip()
        raise failure_for(exc, url) from None


def one_line(value: Any, limit: int = 300) -> str:
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        value = value["message"]
    text = " ".join((value if isinstance(value, str) else json.dumps(value, default=str)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def emit(as_json: bool, report: Any, *lines: str) -> None:
    """Print ``report`` as one JSON object, or else ``lines`` as text."""
    click.echo(
        json.dumps(report, indent=2, default=str) if as_json else printable("\n".join(lines))
    )


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def columns(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(name) for name, _ in rows)
    # A value with a line break (from the environment, a release id) must not split its
    # row, and a pasted megabyte must not fill the terminal.
    return [f"{name.ljust(width)}  {cell(name, value)}" for name, value in rows]


def cell(name: str, value: str) -> str:
    limit = 3 * SHOWN_CHARS if name == "database" else SHOWN_CHARS  # URLs run long
    if len(value) > limit:
        value = value[:limit] + "..."
    return value if value.isprintable() else repr(value)
