"""The ``lane-worker`` command line: a thin shell over settings, client and supervisor."""

from __future__ import annotations

import json
import os
import sys

import click

from worker.config import Diagnosis, diagnose


def _say_errors(diagnosis: Diagnosis) -> None:
    for error in diagnosis.errors:
        click.echo(f"lane-worker: {error}", err=True)


def _render(diagnosis: Diagnosis) -> str:
    t = diagnosis.tuning
    schema = diagnosis.scheduler_schema + (
        " (isolated)" if diagnosis.isolated else " (production default)"
    )
    suffix = diagnosis.queue_suffix or "(none)"
    rows = [
        ("release id", diagnosis.release_id or "(unresolved)"),
        ("launch release id", diagnosis.launch_release_id or "(unresolved)"),
        ("queue", diagnosis.queue or "(unresolved)"),
        ("scheduler schema", schema),
        ("queue suffix", f"{suffix} (lane from {diagnosis.suffix_source})"),
        ("database", diagnosis.database_url_redacted or "(not set)"),
        ("pool", f"worker 2 connections + 1 LISTEN; client {diagnosis.client_pool_size}"),
        ("concurrency", str(t.concurrency)),
        ("claim timeout", f"{t.claim_timeout_s} s"),
        ("poll interval", f"{t.poll_interval_s} s"),
        ("drain window", f"{t.drain_s} s"),
        ("health port", str(t.health_port)),
        ("max attempts", str(t.max_attempts)),
        ("log format", t.log_format),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    verdict = (
        f"boot would be REFUSED (exit {diagnosis.exit_code})"
        if diagnosis.refused
        else f"boot would proceed (exit {diagnosis.exit_code})"
    )
    lines += ["", f"verdict: {verdict}"]
    lines += [f"  error ({e.variable}): {e}" for e in diagnosis.errors]
    lines += [f"  warning: {w}" for w in diagnosis.warnings]
    return "\n".join(lines)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Run and operate lane-worker: durable Absurd runs, one queue per release."""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def doctor(as_json: bool) -> None:
    """Print the resolved topology and whether the daemon would refuse to boot.

    Reads the environment only; never connects to the database. Exits with the
    code the daemon would use: 78 when boot would be refused, else 0.
    """
    diagnosis = diagnose(os.environ)
    if as_json:
        click.echo(json.dumps(diagnosis.as_json(), indent=2))
    else:
        click.echo(_render(diagnosis))
    _say_errors(diagnosis)
    sys.exit(diagnosis.exit_code)


def main() -> None:
    """Run the ``lane-worker`` command."""
    cli(prog_name="lane-worker")
