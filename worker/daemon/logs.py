"""structlog setup: JSON lines in production, a readable console on a terminal."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
import structlog

from worker.config.dburl import mask_secrets

# Keys whose values the daemon writes from its own names, never from a driver's text.
_OWN_NAMES = frozenset(
    {
        "event",
        "level",
        "log_level",
        "timestamp",
        "logger",
        "queue",
        "release_id",
        "worker_id",
        "run_id",
        "task_id",
        "schema",
        "loop",
        "from_release_id",
        "to_queue",
        "adopter_release_id",
    }
)


# The values most lines hold; a line with anything else is written by json.dumps.
_FLAT = frozenset({str, int, bool, type(None)})
_encode = msgspec.json.Encoder().encode


def render_json(event: Mapping[str, Any], **kw: Any) -> str:
    """Return a JSON log line: msgspec for flat lines, ``json.dumps(event, **kw)`` for the rest.

    msgspec writes a line in a fraction of json's time (two lines per run). It is
    used only where it writes the same JSON value json would: flat values (a
    nested dict, a UUID or a date keep json's text, and structlog's fallback for
    what json cannot write), finite floats, ASCII only (json escapes the rest, so a
    line stays ASCII whatever stdout's encoding). The text differs in spacing and
    an exponent's spelling only (1e-07 is 1e-7).
    """
    for value in event.values():
        kind = type(value)
        if kind not in _FLAT and not (kind is float and math.isfinite(value)):
            return json.dumps(event, **kw)
    try:
        text = _encode(event)
    except (TypeError, ValueError, OverflowError):  # a lone surrogate, a 5,000-digit int
        return json.dumps(event, **kw)
    return text.decode("ascii") if text.isascii() else json.dumps(event, **kw)


# The last whole second stamped and its ISO text: a line needs only its microseconds.
# One tuple, swapped whole: a step's thread may log at the same time.
_second: tuple[int, str] = (-1, "")


def iso_utc(now_ns: int) -> str:
    """Return Unix time ``now_ns`` as structlog's TimeStamper(fmt="iso", utc=True) writes it.

    ``2026-12-07T05:50:43.676900Z`` (microseconds floored, none written when they
    are 0, as ``datetime.now().isoformat()``), at a fraction of its cost (two lines
    per run).
    """
    global _second
    whole, fraction = divmod(now_ns, 1_000_000_000)
    second, text = _second
    if whole != second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, text)
    micros = fraction // 1000
    return f"{text}.{micros:06d}Z" if micros else f"{text}Z"


def _stamp(_logger: Any, _method: str, event: Any) -> Any:
    event["timestamp"] = iso_utc(time.time_ns())
    return event


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return mask_secrets(value, secrets)
    if isinstance(value, dict):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, secrets) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    # Anything else (an exception, bytes, a UUID) is rendered as text anyway.
    text = str(value)
    masked = mask_secrets(text, secrets)
    return value if masked == text else masked


class _ScrubFilter(logging.Filter):
    """Masks secrets in stdlib log records (asyncpg and aiohttp warnings), tracebacks too."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad %-args: show them raw rather than fail the caller
            message = f"{record.msg!r} % {record.args!r}"
        record.msg, record.args = mask_secrets(message, self._secrets), None
        if record.exc_info:
            # Rendered here, so the handler prints the masked text instead.
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text, record.exc_info = mask_secrets(text, self._secrets), None
        elif record.exc_text:
            record.exc_text = mask_secrets(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = mask_secrets(record.stack_info, self._secrets)
        return True


def _traceback_below(_logger: Any, _method: str, event: Any) -> Any:
    """Print an attempt's traceback under its line, indented (a terminal's log only).

    In the error's dict it would be one long escaped string; indented, no line of it
    reads as an exception that escaped the process.
    """
    error = event.get("error") if isinstance(event, dict) else None
    if isinstance(error, dict) and isinstance(error.get("traceback"), str):
        shown = {k: v for k, v in error.items() if k != "traceback"}
        lines = error["traceback"].rstrip("\n").splitlines()
        event = {**event, "error": shown, "exception": "\n".join("    " + x for x in lines)}
    return event


def configure(
    log_format: Literal["json", "console", "auto"],
    *,
    stream: object = None,
    secrets: Sequence[str] = (),
) -> None:
    """Configure structlog (and stdlib logging) once, at the entry point.

    Every occurrence of one of ``secrets`` (the database password) in a log line
    is masked: a driver's error text is logged as it is, and must not leak it.
    """
    secrets = tuple(s for s in secrets if s)

    def scrub_secrets(_logger: Any, _method: str, event: Any) -> Any:
        if not secrets or not isinstance(event, dict):
            return _scrub(event, secrets) if secrets else event
        # Names the daemon itself writes hold no secret; a short password must not
        # mangle them (`run.started`, the queue a filter looks for).
        return {k: v if k in _OWN_NAMES else _scrub(v, secrets) for k, v in event.items()}

    out = stream if stream is not None else sys.stdout
    use_console = log_format == "console" or (
        log_format == "auto" and hasattr(out, "isatty") and out.isatty()
    )
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if use_console
        else structlog.processors.JSONRenderer(serializer=render_json)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _stamp,
            structlog.processors.format_exc_info,
            scrub_secrets,
            *([_traceback_below] if use_console else []),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        # One write per line (print writes the newline apart when unbuffered, as in
        # the image): the processes of LANE_WORKER_PROCESSES share one stdout, and a
        # pipe keeps a write of up to 4 KiB whole.
        logger_factory=structlog.WriteLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    # Libraries that use stdlib logging (aiohttp, asyncpg) go to stderr, warnings only.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    if secrets:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_ScrubFilter(secrets))
