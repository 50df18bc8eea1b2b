"""How commands print: one JSON object with ``--json``, else aligned text lines."""

from __future__ import annotations

import json
from typing import IO, Any

import click

from worker.errors import EXIT_CONFIG, EXIT_USAGE, SHOWN_CHARS, printable


def emit(as_json: bool, report: Any, *lines: str) -> None:
    """Print ``report`` as one JSON object, or else ``lines`` as text."""
    click.echo(
        json.dumps(report, indent=2, default=str) if as_json else printable("\n".join(lines))
    )


_CODES = {EXIT_USAGE: "usage", EXIT_CONFIG: "config"}


def refusal(exit_code: int, message: str) -> dict[str, Any]:
    """Return the JSON object every command's refusal is with ``--json``: one shape for all."""
    code = _CODES.get(exit_code, "failure")
    return {"error": {"code": code, "exitCode": exit_code, "message": message}}


class JsonRefusal(click.ClickException):
    """A refusal (``exc``, same exit code) said as one JSON object on stderr, for ``--json``.

    stderr, not stdout: a command may already have put its report on stdout (a run that
    failed under ``submit --wait``), which must stay one object.
    """

    def __init__(self, exc: click.ClickException) -> None:
        super().__init__(" ".join(exc.format_message().split()))
        self.exit_code = exc.exit_code  # type: ignore[misc]  # click types it ClassVar

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(json.dumps(refusal(self.exit_code, printable(self.message))), err=True)


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
    # URLs and errors run long; an error quoting a URL must keep its masked part. A
    # claim line holds a worker id (release@host:pid:token), the release and the machine
    # id, last: cut at 100 it lost the machine id (issue 31). Release ids have at most
    # 200 characters, so 600 keeps the machine id of any claim.
    name = name.strip()
    if name.startswith("claim "):
        limit = 6 * SHOWN_CHARS
    elif name in ("database", "error", "reason"):
        limit = 3 * SHOWN_CHARS
    else:
        limit = SHOWN_CHARS
    if len(value) > limit:
        value = value[:limit] + "..."
    return value if value.isprintable() else repr(value)
