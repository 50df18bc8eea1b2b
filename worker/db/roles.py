"""The database roles by job (``lane-worker roles``): what each may do, as SQL.

Five NOLOGIN role templates, ``<prefix>_<job>``; a login role is made a member
of the template its part needs (``grant lane_worker_app to my_app_login``):

- ``app``: the SQL API only. USAGE on the store schema and EXECUTE on
  ``APP_FUNCTIONS`` (SECURITY DEFINER since store migration 0041: they run with
  the owner's rights). No table, no engine schema, no other function: a run's
  input, another run, a runtime API token are out of its reach.
- ``viewer``: reads the registry and the runs' bookkeeping, never a payload:
  no input, output, error, checkpoint, idempotency key, signal payload, ledger
  fact, runner result or token (``VIEWER_COLUMNS``). No engine schema: the
  drain report's reads that touch it run with the owner's rights and return
  counts and ids (``REPORT_FUNCTIONS``, store 0049).
- ``scaler``: the viewer's reads, and writes the release registry
  (``SCALER_TABLES``) and its functions (``SCALER_FUNCTIONS``).
- ``worker``: what the daemon reads and writes: every store, engine and
  contract table and function, the engine tables created later by whoever
  applies this (``alter default privileges``). No CREATE: its lane's queue and
  NOTIFY trigger are made by the owner (``prepare_lane_queue``, store 0042), and
  it boots only on schemas the owner migrated.
- ``migrator``: the owner. Membership in the store schema's owner when that is
  not a superuser (a superuser's rights are not passed on by membership).

Every statement is idempotent: a role is created only when missing, a grant
already held is a no-op. Names come from a checked prefix and schema; no value
reaches the SQL any other way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.db.sql import quote_ident as quoted

ENGINE_SCHEMA = "absurd"
CONTRACT_SCHEMA = "lane_worker"
DEFAULT_PREFIX = "lane_worker"
JOBS: tuple[str, ...] = ("app", "viewer", "scaler", "worker", "migrator")
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")

# The SQL API an app calls (README "From any language: the SQL API"), by signature.
APP_FUNCTIONS: tuple[str, ...] = (
    "submit_run(text, jsonb, text, text, jsonb, integer)",
    "submit_runs(jsonb)",
    "signal_run(uuid, text, jsonb)",
    "cancel_run(uuid, text)",
    "run_status(uuid)",
    "report_runner_result(uuid, integer, jsonb)",
    "worker_release_id(text, text)",
    "schema_versions()",  # store 0043: the versions a client checks before its calls
    "value_limits()",
)
# Which of them run with the owner's rights (value_limits reads nothing).
DEFINER_FUNCTIONS: tuple[str, ...] = APP_FUNCTIONS[:-1]
# What the viewer may call: the versions its commands check (it reads no engine schema),
# and the drain report's reads that run with the owner's rights (store 0049: counts,
# ids, plays, times; never a payload or a token).
REPORT_FUNCTIONS: tuple[str, ...] = (
    "report_lanes_v1()",
    "report_runs_v1()",
    "report_open_runs_v1(text[], integer)",
    "report_foreign_tasks_v1(text[])",
    "report_cleanups_v1()",
    "run_status_bookkeeping_v1(uuid)",
    "run_page_bookkeeping_v1(uuid)",
)
# The store's pure helpers the read commands' queries call (a lane's name, a
# worker's liveness, a run's bucket). Invoker functions: each reads with the
# caller's rights, so granting one gives a role nothing its own grants refuse.
READ_HELPERS: tuple[str, ...] = (
    "worker_live(timestamp with time zone, timestamp with time zone)",
    "attempt_worker_live(text)",
    "release_as_deployed(text)",
    "lane_release_id(text)",
    "lane_trim(text)",
    "lane_collapse(text)",
    "lane_segment(text)",
    "queue_for_release(text)",
    "open_run_bucket(text, bigint, jsonb)",
    "lane_is_dev(text[])",
    "adoptable_plays(text)",
    "play_adoptable(text, text)",
    "needs_own_lane(text, text, text, text)",
    "lane_needs_own(text)",
    "lane_older(text, text)",
    "lane_claims(text)",
    "adoptable_by(text, text, text, text, text, text[])",
    "lane_served(text, text)",
    "lane_live_plays(text)",
    "lane_serves_play(text, text, text)",
    "deploy_version_problem(text)",
    "checked_release(text)",
    "store_id()",
)
VIEWER_FUNCTIONS: tuple[str, ...] = ("schema_versions()", *REPORT_FUNCTIONS, *READ_HELPERS)
# The worker's own (store 0042): its lane's queue and trigger, made as the owner.
WORKER_DEFINER_FUNCTIONS: tuple[str, ...] = ("prepare_lane_queue(text)",)

# What the viewer may read, table by table: None is every column. A column that
# holds a payload (input, output, error, a fact, a result) or a secret is left out.
VIEWER_COLUMNS: dict[str, tuple[str, ...] | None] = {
    "releases": None,
    "deployments": None,
    "deployment_events": None,
    "release_hold": None,
    "workers": None,
    "created_queues": None,
    "schema_migrations": None,
    "store_identity": None,
    "scaler_state": None,
    # The page's actions log (/actions): who acted, when, on which filter, with what
    # counts; no run's payload. Read-only, like the rest.
    "page_actions": None,
    "runs": (
        "run_id",
        "play",
        "release_id",
        "queue",
        "task_id",
        "status",
        "adopted_release_id",
        "adopted_queue",
        "attempts",
        "max_attempts",
        "current_attempt_id",
        "created_at",
        "updated_at",
        "finished_at",
        "step_keys",
        "defer_count",
        "first_deferred_at",
        "defer_alerted_at",
        "retry_of",
        "retried_by",
    ),
    "attempts": (
        "attempt_id",
        "run_id",
        "engine_run_id",
        "attempt",
        "worker_id",
        "release_id",
        "disposition",
        "outcome",
        "claimed_at",
        "finished_at",
    ),
    "ledger": (
        "fact_id",
        "run_id",
        "type",
        "created_at",
        "published_at",
        "delivery",
        "delivery_attempts",
        "next_delivery_at",
        "delivered_at",
    ),
}
SCALER_TABLES: tuple[str, ...] = (
    "releases",
    "deployments",
    "deployment_events",
    "release_hold",
    "scaler_state",
    "scaler_creates",
)
# A deploy gate's runs, as the scaler submits, follows and cancels them: with the owner's
# rights, for a candidate's gate keys and gate runs only (store 0051).
GATE_RUN_FUNCTIONS: tuple[str, ...] = (
    "gate_submit_run(text, timestamp with time zone, integer, text)",
    "gate_run_status(uuid)",
    "gate_cancel_run(uuid, text)",
)
SCALER_FUNCTIONS: tuple[str, ...] = (
    "deploy_release(text, text, integer, text, text)",
    "deploy_release_checked(text, text, integer, text, text, boolean)",
    "retire_superseded(text)",
    "retire_superseded_by(text, text, timestamp with time zone)",
    "retire_superseded_unless_held(text, text, timestamp with time zone)",
    "hold_releases(text, text)",
    "resume_releases(text)",
    "refuse_if_held(text, boolean)",
    # The deploy gate (store 0050) and its runs (0051: gate keys and gate runs only).
    "deploy_release_gated(text, text, integer, text, text, boolean, jsonb, double precision)",
    "retire_candidate_lane(text, text)",
    "gate_begun(text, timestamp with time zone)",
    "gate_passed(text, text, timestamp with time zone, jsonb)",
    "gate_failed(text, text, timestamp with time zone, text, text)",
    *GATE_RUN_FUNCTIONS,
    *VIEWER_FUNCTIONS,
)


@dataclass(frozen=True)
class RolePlan:
    """The statements that give one job's role its rights, in order."""

    job: str
    role: str
    statements: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        return {"job": self.job, "role": self.role, "statements": list(self.statements)}


def checked_prefix(prefix: str) -> str:
    """Return ``prefix`` when it makes usable role names; else raise ValueError."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"role prefix {prefix[:60]!r} is not usable: it must be 1..41 lower-case letters, "
            "digits and underscores, not starting with a digit."
        )
    return prefix


def role_name(prefix: str, job: str) -> str:
    """Return the template role of ``job`` (``<prefix>_<job>``)."""
    return f"{checked_prefix(prefix)}_{job}"


def _create(role: str) -> str:
    # CREATE ROLE has no IF NOT EXISTS (PostgreSQL 15 included): ask the catalog.
    literal = "'" + role + "'"  # a checked prefix and a fixed job: no quote can occur
    return (
        f"do $$ begin if not exists (select from pg_catalog.pg_roles where rolname = {literal}) "
        f"then create role {quoted(role)} nologin; end if; end $$"
    )


def _functions(schema: str, signatures: tuple[str, ...], role: str) -> str:
    names = ", ".join(f"{schema}.{signature}" for signature in signatures)
    return f"grant execute on function {names} to {role}"


def _viewer_reads(schema: str, role: str) -> list[str]:
    out = []
    for table, cols in VIEWER_COLUMNS.items():
        what = "select" if cols is None else f"select ({', '.join(cols)})"
        out.append(f"grant {what} on {schema}.{table} to {role}")
    return out


def plans(store_schema: str, prefix: str = DEFAULT_PREFIX) -> tuple[RolePlan, ...]:
    """Return each job's role and statements against store schema ``store_schema``."""
    schema = quoted(store_schema)
    engine, contracts = quoted(ENGINE_SCHEMA), quoted(CONTRACT_SCHEMA)
    role = {job: quoted(role_name(prefix, job)) for job in JOBS}
    app = [
        f"grant usage on schema {schema} to {role['app']}",
        _functions(schema, APP_FUNCTIONS, role["app"]),
    ]
    viewer = [f"grant usage on schema {schema} to {role['viewer']}"]
    viewer += _viewer_reads(schema, role["viewer"])
    viewer.append(_functions(schema, VIEWER_FUNCTIONS, role["viewer"]))
    scaler = [f"grant usage on schema {schema} to {role['scaler']}"]
    scaler += _viewer_reads(schema, role["scaler"])
    tables = ", ".join(f"{schema}.{t}" for t in SCALER_TABLES)
    scaler += [
        f"grant select, insert, update, delete on {tables} to {role['scaler']}",
        f"grant usage on sequence {schema}.deployment_events_event_id_seq to {role['scaler']}",
        _functions(schema, SCALER_FUNCTIONS, role["scaler"]),
    ]
    worker = []
    for each in (schema, engine, contracts):
        worker += [
            f"grant usage on schema {each} to {role['worker']}",
            f"grant select, insert, update, delete on all tables in schema {each} "
            f"to {role['worker']}",
            f"grant usage, select, update on all sequences in schema {each} to {role['worker']}",
            f"grant execute on all functions in schema {each} to {role['worker']}",
        ]
    # Which roles `migrate` grants again (store 0043) is the owner's record alone.
    worker.append(f"revoke insert, update, delete on {schema}.role_templates from {role['worker']}")
    # A lane's engine tables are created later (a first submit, a boot): by the owner.
    worker += [
        f"alter default privileges in schema {engine} grant select, insert, update, delete "
        f"on tables to {role['worker']}",
        f"alter default privileges in schema {engine} grant usage, select, update "
        f"on sequences to {role['worker']}",
    ]
    migrator_literal = "'" + role_name(prefix, "migrator") + "'"
    schema_literal = "'" + store_schema + "'"
    migrator = [
        # The owner's rights pass by membership, a superuser's do not: then say so.
        "do $$ declare v_owner name; v_super boolean; begin "
        "select r.rolname, r.rolsuper into v_owner, v_super from pg_catalog.pg_namespace n "
        "join pg_catalog.pg_roles r on r.oid = n.nspowner "
        f"where n.nspname = {schema_literal}; "
        "if v_owner is null or v_super then "
        "raise notice 'the store schema is owned by a superuser (or missing): run migrate as a "
        "dedicated owner role to give the migrator its rights'; "
        f"elsif v_owner <> {migrator_literal} then "
        f"execute pg_catalog.format('grant %I to %I', v_owner, {migrator_literal}); "
        "end if; end $$",
    ]
    grants = {"app": app, "viewer": viewer, "scaler": scaler, "worker": worker}
    grants["migrator"] = migrator
    return tuple(
        RolePlan(
            job=job,
            role=role_name(prefix, job),
            statements=(_create(role_name(prefix, job)), *grants[job]),
        )
        for job in JOBS
    )
