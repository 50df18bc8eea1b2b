"""The ``lane-worker`` command group every command hangs from."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from worker.cli.output import JsonRefusal
from worker.version import VERSION


def _json_asked(args: Sequence[str]) -> bool:
    """Whether the command line asks for ``--json`` (before any ``--``)."""
    return "--json" in (args[: list(args).index("--")] if "--" in args else args)


@contextmanager
def _refusals_as_json(as_json: bool) -> Iterator[None]:
    # The one place a refusal turns into JSON: a parse error click finds, or a
    # Failure a command raises, found before or after the flag itself is parsed.
    try:
        yield
    except click.ClickException as exc:
        if not as_json or isinstance(exc, JsonRefusal):
            raise
        raise JsonRefusal(exc) from None


class _Root(click.Group):
    """The group: with ``--json``, whatever refuses is said as one JSON object on stderr."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        as_json = _json_asked(args)
        with _refusals_as_json(as_json):
            ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta["lane_worker.json"] = as_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        with _refusals_as_json(bool(ctx.meta.get("lane_worker.json"))):
            return super().invoke(ctx)


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="lane-worker")
def cli() -> None:
    """Run and operate lane-worker: durable Absurd runs, one queue per release.

    Every command reads its configuration from the environment
    (WORKFLOW_RUNTIME_POSTGRES, DEEPLINE_RUNTIME_SCHEDULER_SCHEMA, ...). Exit
    codes: 0 success, 1 failure, 2 usage error, 78 configuration refused. With
    --json, a refusal is one JSON object on stderr,
    {"error": {"code": "usage"|"config"|"failure", "exitCode": N, "message": "..."}},
    and the exit code is the same.
    """
