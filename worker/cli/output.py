"""How commands print: one JSON object with ``--json``, else aligned text lines."""

from __future__ import annotations

import json
from typing import Any

import click

from worker.errors import SHOWN_CHARS, printable


def emit(as_json: bool, report: Any, *lines: str) -> None:
    """Print ``report`` as one JSON object, or else ``lines`` as text."""
    click.echo(
        json.dumps(report, indent=2, default=str) if as_json else printable("\n".join(lines))
    )


def one_line(value: Any, limit: int = 300) -> str:
    """Return an error (its message) or any JSON value as one line of at most ``limit``."""
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        value = value["message"]
    text = " ".join((value if isinstance(value, str) else json.dumps(value, default=str)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def columns(rows: list[tuple[str, str]]) -> list[str]:
    """Return ``name  value`` lines, the names padded to one width."""
    width = max(len(name) for name, _ in rows)
    # A value with a line break (from the environment, a release id) must not split its
    # row, and a pasted megabyte must not fill the terminal.
    return [f"{name.ljust(width)}  {cell(name, value)}" for name, value in rows]


def cell(name: str, value: str) -> str:
    """Return ``value`` cut to its column's limit, as ``repr`` when it is not printable."""
    # URLs and errors run long; an error quoting a URL must keep its masked part.
    limit = 3 * SHOWN_CHARS if name.strip() in ("database", "error", "reason") else SHOWN_CHARS
    if len(value) > limit:
        value = value[:limit] + "..."
    return value if value.isprintable() else repr(value)
