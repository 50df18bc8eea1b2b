"""structlog setup: JSON lines in production, a readable console on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog


def configure(log_format: Literal["json", "console", "auto"], *, stream: object = None) -> None:
    """Configure structlog (and stdlib logging) once, at the entry point."""
    out = stream if stream is not None else sys.stdout
    use_console = log_format == "console" or (
        log_format == "auto" and hasattr(out, "isatty") and out.isatty()
    )
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    # Libraries that use stdlib logging (aiohttp, asyncpg) go to stderr, warnings only.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
