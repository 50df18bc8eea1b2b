"""`roles`: the database roles by job (app, viewer, scaler, worker, migrator) and their grants."""

from __future__ import annotations

import os

import click

from worker import lanes
from worker.cli.connect import with_client
from worker.cli.exits import UsageFailure, failure_of
from worker.cli.output import emit
from worker.cli.params import json_option
from worker.cli.root import cli
from worker.client import LaneClient
from worker.config import settings
from worker.db import role_grants
from worker.db import roles as role_sql
from worker.db.pool import Connection


@cli.command()
@click.option(
    "--prefix",
    default=role_sql.DEFAULT_PREFIX,
    show_default=True,
    help="The roles are <prefix>_app, _viewer, _scaler, _worker and _migrator.",
)
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help="Execute the statements (in one transaction, as the connecting user: the owner "
    "of the schemas, with CREATEROLE) instead of printing them.",
)
@json_option
def roles(prefix: str, apply_: bool, as_json: bool) -> None:
    """Print (or, with --apply, execute) the roles by job and their grants.

    Each role is a NOLOGIN template: grant it to the login role of the part that
    connects (grant lane_worker_app to my_app). The app gets the SQL API only, the
    viewer reads without payloads or tokens, the scaler writes the release registry,
    the worker what the daemon reads and writes, the migrator is the owner.
    Idempotent: a role is created only when missing, a grant held stays as it is.
    """
    try:
        role_sql.checked_prefix(prefix)
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None
    diagnosis = settings.diagnose(os.environ)
    for error in diagnosis.errors:
        if error.variable in (settings.STORE_SCHEMA_ENV, lanes.SCHEDULER_SCHEMA_ENV):
            raise failure_of(error)
    plans = role_sql.plans(diagnosis.store_schema, prefix)
    if apply_:

        async def apply(conn: Connection) -> None:
            for plan in plans:
                for statement in plan.statements:
                    await conn.execute(statement)

        async def apply_and_record(conn: Connection) -> None:
            await apply(conn)
            # So `migrate` grants them what a later migration adds (store 0043).
            await role_grants.record(conn, diagnosis.store_schema, prefix)

        async def action(client: LaneClient) -> None:
            # A store older than this build lacks what the grants name: migrate first.
            await client.check_schemas()
            await client.db.transaction(apply_and_record)

        with_client(action)
    report = {
        "storeSchema": diagnosis.store_schema,
        "applied": apply_,
        "roles": [plan.as_json() for plan in plans],
    }
    lines = [f"-- roles for store schema {diagnosis.store_schema} (idempotent)"]
    for plan in plans:
        lines += ["", f"-- {plan.job}: {plan.role}", *(f"{s};" for s in plan.statements)]
    if apply_:
        lines = [f"applied: {', '.join(plan.role for plan in plans)}"]
    emit(as_json, report, *lines)
