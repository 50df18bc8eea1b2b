"""``with_client``: how a database command connects, runs and ends (one parse of the env)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import structlog

from worker.cli.exits import Failure, failure_for, failure_of, scrub
from worker.client import CONNECT_VARIABLES, LaneClient
from worker.config.env import DATABASE_URL_ENV
from worker.config.settings import diagnose
from worker.errors import LaneConfigError

T = TypeVar("T")
# The CLI answers within seconds when the database is away; the daemon waits longer.
CONNECT_RETRY_S = 10.0


def with_client(action: Callable[[LaneClient], Awaitable[T]], *, check: tuple[str, ...] = ()) -> T:
    """Connect a client from the environment, run ``action`` with it, map failures to exits.

    The environment is parsed once, here; the client takes that diagnosis. A refusal
    among the variables every call uses (``CONNECT_VARIABLES``) or ``check`` exits 78.
    """
    env = os.environ
    url = (env.get(DATABASE_URL_ENV) or "").strip()
    diagnosis = diagnose(env)
    for error in diagnosis.errors:
        if error.variable in CONNECT_VARIABLES + check:
            raise failure_of(error)
    # Library logs (retry warnings) would break the one-sentence and --json contracts.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )

    async def main() -> T:
        try:
            client = await LaneClient.connect(
                env=env, retry_for_s=CONNECT_RETRY_S, diagnosis=diagnosis, as_app=False
            )
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            if isinstance(exc, LaneConfigError):
                raise
            # The driver could not parse the URL; nothing reached the server.
            raise failure_of(
                LaneConfigError(
                    f"{DATABASE_URL_ENV} is not a usable database URL ({scrub(str(exc), url)}): "
                    "set it to postgresql://user:password@host:5432/dbname.",
                    variable=DATABASE_URL_ENV,
                )
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
