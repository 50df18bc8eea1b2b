"""The ``lane-worker`` command group every command hangs from."""

from __future__ import annotations

import click

from worker.version import VERSION


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="lane-worker")
def cli() -> None:
    """Run and operate lane-worker: durable Absurd runs, one queue per release.

    Every command reads its configuration from the environment
    (WORKFLOW_RUNTIME_POSTGRES, DEEPLINE_RUNTIME_SCHEDULER_SCHEMA, ...). Exit
    codes: 0 success, 1 failure, 2 usage error, 78 configuration refused.
    """
