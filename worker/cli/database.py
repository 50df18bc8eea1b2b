"""`doctor` (the environment; with --connect, the role) and `migrate` (the schemas)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from worker.cli.connect import with_client
from worker.cli.exits import failure_of
from worker.cli.output import columns, emit
from worker.cli.params import json_option
from worker.cli.root import cli
from worker.client import LaneClient
from worker.config import settings
from worker.db import role_check
from worker.db.store import MigrationReport
from worker.errors import printable

PARTS = ("worker", "app", "viewer", "scaler")


def _say_errors(diagnosis: settings.Diagnosis) -> None:
    for error in diagnosis.errors:
        click.echo(printable(f"lane-worker: {error}"), err=True)


def _render(diagnosis: settings.Diagnosis) -> str:
    t = diagnosis.tuning
    schema = diagnosis.scheduler_schema + (
        " (isolated)" if diagnosis.isolated else " (production default)"
    )
    suffix = diagnosis.queue_suffix or "(none)"
    listen = " (PgBouncer: no LISTEN, polling)" if t.pgbouncer else " + 1 LISTEN"
    rows = [
        ("release id", diagnosis.release_id or "(unresolved)"),
        ("queue", diagnosis.queue or "(unresolved)"),
        ("scheduler schema", schema),
        ("store schema", diagnosis.store_schema + _store_source(diagnosis)),
        ("queue suffix", f"{suffix} (lane from {diagnosis.suffix_source})"),
        ("database", diagnosis.database_url_redacted or _no_url(diagnosis)),
        ("pool", f"worker 2 connections{listen}; client {diagnosis.client_pool_size}"),
        ("concurrency", str(t.concurrency)),
        ("claim timeout", f"{t.claim_timeout_s} s"),
        ("poll interval", f"{t.poll_interval_s} s"),
        ("drain window", f"{t.drain_s} s"),
        ("health port", f"{t.health_port} on {t.health_host}"),
        ("page actions", _page_actions(diagnosis)),
        ("max attempts", str(t.max_attempts)),
        ("defer alert", f"after {t.defer_alert_after_s:g} s"),
        ("defer fail", _seconds_or_never(t.defer_fail_after_s, "a run is never failed for it")),
        ("unknown play", _unknown_play(t.unknown_play_grace_s)),
        ("auto-prune", _seconds_or_never(t.prune_after_s, "`lanes prune` by hand only")),
        ("log format", t.log_format),
        ("event loop", t.event_loop),
    ]
    lines = columns(rows)
    verdict = (
        f"boot would be REFUSED (exit {diagnosis.exit_code})"
        if diagnosis.refused
        else f"boot would proceed (exit {diagnosis.exit_code})"
    )
    lines += ["", f"verdict: {verdict}"]
    lines += [f"  error ({e.variable}): {e}" for e in diagnosis.errors]
    lines += [f"  warning: {w}" for w in diagnosis.warnings]
    return "\n".join(lines)


def _page_actions(diagnosis: settings.Diagnosis) -> str:
    if diagnosis.page_actions:
        return f"on ({settings.PAGE_TOKEN_ENV} set: signed-in operators may act)"
    return f"off (read-only page; set {settings.PAGE_TOKEN_ENV} to allow actions)"


def _seconds_or_never(seconds: float, never: str) -> str:
    return f"after {seconds:g} s" if seconds else f"never ({never})"


def _unknown_play(grace_s: float) -> str:
    if not grace_s:
        return "failed at once (LANE_WORKER_UNKNOWN_PLAY_GRACE=0)"
    return f"put back for {grace_s:g} s, then failed"


def _store_source(diagnosis: settings.Diagnosis) -> str:
    if diagnosis.store_schema == diagnosis.scheduler_schema:
        return " (the scheduler schema)"
    return f" ({settings.STORE_SCHEMA_ENV}; the lanes follow the scheduler schema)"


def _no_url(diagnosis: settings.Diagnosis) -> str:
    refused = any(e.variable == settings.DATABASE_URL_ENV for e in diagnosis.errors)
    return "(set but refused, not shown: see the error below)" if refused else "(not set)"


@cli.command()
@click.option(
    "--connect",
    is_flag=True,
    help="Also connect and say which role the database URL connects as, and whether it is "
    "broad (a superuser or the store's owner) for --part.",
)
@click.option(
    "--part",
    type=click.Choice(PARTS),
    default="worker",
    show_default=True,
    help="The part the URL is for (with --connect): the role it should connect as.",
)
@json_option
def doctor(connect: bool, part: str, as_json: bool) -> None:
    """Print the resolved topology and whether the daemon would refuse to boot.

    Reads the environment only, unless --connect: then it also connects and says
    which role the URL connects as. Exits with the code the daemon would use: 78
    when boot would be refused, else 0.
    """
    diagnosis = settings.diagnose(os.environ)
    report, text = diagnosis.as_json(), _render(diagnosis)
    if connect and not diagnosis.refused:

        async def action(client: LaneClient) -> dict[str, Any]:
            schema = client.store.schema
            return await client.db.run(lambda c: role_check.describe(c, schema, part))

        role = with_client(action)
        report = {**report, "role": role}
        text += f"\n\ndatabase role     {role['role']}: {role['said']}"
        if role["memberOf"]:
            text += f"\n  member of       {', '.join(role['memberOf'])}"
    emit(as_json, report, text)
    if as_json and diagnosis.errors:
        # One JSON refusal on stderr, as every command's under --json (the report,
        # on stdout, lists the errors one by one).
        raise failure_of(diagnosis.errors[0], " ".join(str(e) for e in diagnosis.errors))
    _say_errors(diagnosis)
    sys.exit(diagnosis.exit_code)


@cli.command()
@click.option(
    "--replace-engine-functions",
    "replace_engine_functions",
    is_flag=True,
    help="Let an engine upgrade replace Absurd functions another system patched (the "
    "TypeScript app's vendored claim_task); without it such an upgrade is refused.",
)
@json_option
def migrate(replace_engine_functions: bool, as_json: bool) -> None:
    """Install or upgrade the engine schema and the run-state store.

    An engine upgrade never silently replaces an Absurd function that differs from
    Absurd's own (another system patched it): it names the function and stops,
    unless --replace-engine-functions is given.
    """

    async def action(client: LaneClient) -> tuple[str, MigrationReport, str]:
        done = await client.migrate(replace_engine_functions=replace_engine_functions)
        return (*done, client.store.schema)

    engine, store, schema = with_client(action)
    applied = ", ".join(f"{v:04d}" for v in store.applied) or "nothing (current)"
    newer = ", ".join(f"{v:04d}" for v in store.unknown_compatible)
    report = dict(
        engine=engine,
        storeSchema=schema,
        storeVersion=store.current,
        storeApplied=list(store.applied),
        storeNewer=list(store.unknown_compatible),
        rolesRegranted=list(store.regranted),
    )
    lines = [f"engine schema: {engine}", f"store {schema}: applied {applied}"]
    lines[-1] += f"; version {store.current:04d}"
    if newer:
        lines.append(f"store {schema} also holds newer compatible migrations {newer}")
    if store.regranted:
        lines.append(f"roles granted again: {', '.join(p + '_*' for p in store.regranted)}")
    emit(as_json, report, *lines)
