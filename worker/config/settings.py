"""The environment, read once at the entry point into one frozen ``Settings``.

``diagnose`` resolves as much of the topology as it can and lists every
problem; ``Settings.from_env`` is the boot guard built on it: the first problem
refuses the boot (exit 78) with one sentence naming the variable to set.
Nothing else in lane-worker reads ``os.environ``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from worker import lanes
from worker.config.dburl import WHOLE_WORD_BELOW, redact_url, url_problem, url_secrets

# The contract's names, re-exported: tests and tools read them from here.
from worker.config.env import BOOT_RETRY_ENV as BOOT_RETRY_ENV
from worker.config.env import CLAIM_TIMEOUT_ENV as CLAIM_TIMEOUT_ENV
from worker.config.env import CONCURRENCY_ENV as CONCURRENCY_ENV
from worker.config.env import DATABASE_URL_ENV as DATABASE_URL_ENV
from worker.config.env import DEFER_ALERT_AFTER_ENV as DEFER_ALERT_AFTER_ENV
from worker.config.env import DEFER_FAIL_AFTER_ENV as DEFER_FAIL_AFTER_ENV
from worker.config.env import DRAIN_SECONDS_ENV as DRAIN_SECONDS_ENV
from worker.config.env import EVENT_LOOP_ENV as EVENT_LOOP_ENV
from worker.config.env import (
    FLY_MACHINE_ID_ENV,
    MACHINE_ID_ENV,
    Problems,
    blank_as_unset,
    flag,
    plain_text,
    supervised_by_parent,
    supervisor_pid_warnings,
    unknown_variables,
)
from worker.config.env import HEALTH_HOST_ENV as HEALTH_HOST_ENV
from worker.config.env import HEALTH_PORT_ENV as HEALTH_PORT_ENV
from worker.config.env import LOG_FORMAT_ENV as LOG_FORMAT_ENV
from worker.config.env import MAX_ATTEMPTS_ENV as MAX_ATTEMPTS_ENV
from worker.config.env import MAX_RELEASE_ID_CHARS as MAX_RELEASE_ID_CHARS
from worker.config.env import PGBOUNCER_ENV as PGBOUNCER_ENV
from worker.config.env import POLL_INTERVAL_ENV as POLL_INTERVAL_ENV
from worker.config.env import SERVERLESS_ENV as SERVERLESS_ENV
from worker.config.env import STORE_SCHEMA_ENV as STORE_SCHEMA_ENV
from worker.config.env import TEST_DATABASE_URL_ENV as TEST_DATABASE_URL_ENV
from worker.config.env import decimal_number as decimal_number
from worker.config.env import whole_number as whole_number
from worker.config.tuning import LogFormat as LogFormat
from worker.config.tuning import Tuning as Tuning
from worker.config.tuning import read_tuning
from worker.errors import EXIT_CONFIG as EXIT_CONFIG
from worker.errors import EXIT_OK as EXIT_OK
from worker.errors import LaneConfigError, exit_code_for, shown

WORKER_POOL_SIZE = 2
SERVERLESS_CLIENT_POOL_SIZE = 1
_PG_IDENTIFIER_MAX_BYTES = 63
# Lower case only: Postgres folds an unquoted name to lower case, so a schema made
# as "Runtime" (quoted, as the store quotes it) is not the app's unquoted Runtime.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]*")
# The engine's schemas and Postgres's own: store tables there would mix with theirs.
_RESERVED_SCHEMAS = frozenset({"absurd", "lane_worker", "public", "information_schema"})

SuffixSource = Literal["DEEPLINE_ABSURD_QUEUE_SUFFIX", "DEEPLINE_RUNTIME_DEPLOY_VERSION", "default"]


@dataclass(frozen=True)
class Diagnosis:
    """Everything the environment resolves to, plus what is wrong with it."""

    release_id: str | None
    launch_release_id: str | None
    queue: str | None
    scheduler_schema: str
    # Where lane-worker's store lives: LANE_WORKER_STORE_SCHEMA, else the scheduler schema.
    store_schema: str
    isolated: bool
    queue_suffix: str
    suffix_source: SuffixSource
    database_url_redacted: str | None
    serverless: bool
    tuning: Tuning
    errors: tuple[LaneConfigError, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        """Tell whether the daemon would refuse to boot."""
        return bool(self.errors)

    @property
    def exit_code(self) -> int:
        """Return the exit code the daemon would use for this configuration (78 or 0)."""
        return exit_code_for(self.errors[0]) if self.errors else EXIT_OK

    @property
    def client_pool_size(self) -> int:
        """Return how many pooled connections a client (the app) holds here."""
        return SERVERLESS_CLIENT_POOL_SIZE if self.serverless else WORKER_POOL_SIZE

    def as_json(self) -> dict[str, object]:
        """Return the diagnosis as the JSON object ``lane-worker doctor --json`` prints."""
        return {
            "releaseId": self.release_id,
            "launchReleaseId": self.launch_release_id,
            "queue": self.queue,
            "schedulerSchema": self.scheduler_schema,
            "storeSchema": self.store_schema,
            "isolated": self.isolated,
            "queueSuffix": self.queue_suffix,
            "suffixSource": self.suffix_source,
            "database": self.database_url_redacted,
            "serverless": self.serverless,
            "workerPoolSize": WORKER_POOL_SIZE,
            "clientPoolSize": self.client_pool_size,
            "concurrency": self.tuning.concurrency,
            "claimTimeoutSeconds": self.tuning.claim_timeout_s,
            "pollIntervalSeconds": self.tuning.poll_interval_s,
            "listenPollIntervalSeconds": self.tuning.listen_poll_interval_s,
            "drainSeconds": self.tuning.drain_s,
            "healthPort": self.tuning.health_port,
            "healthHost": self.tuning.health_host,
            "maxAttempts": self.tuning.max_attempts,
            "logFormat": self.tuning.log_format,
            "eventLoop": self.tuning.event_loop,
            "pgbouncer": self.tuning.pgbouncer,
            "deferAlertAfterSeconds": self.tuning.defer_alert_after_s,
            "deferFailAfterSeconds": self.tuning.defer_fail_after_s,
            "refused": self.refused,
            "exitCode": self.exit_code,
            "errors": [{"variable": e.variable, "message": str(e)} for e in self.errors],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Settings:
    """The validated configuration of one worker process."""

    database_url: str = field(repr=False)  # carries the password: never in repr or logs
    release_id: str
    launch_release_id: str
    queue: str
    scheduler_schema: str
    store_schema: str
    isolated: bool
    queue_suffix: str
    suffix_source: SuffixSource
    serverless: bool
    tuning: Tuning
    warnings: tuple[str, ...] = ()
    # What from_env parsed: a client of this process takes it instead of parsing again.
    diagnosis: Diagnosis | None = field(default=None, repr=False, compare=False)
    # Daytona's own variables (DAYTONA_*), read by the sandbox cleanup: the API key
    # is a secret, so never in repr or logs.
    daytona_env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    # The machine this worker runs on (FLY_MACHINE_ID, or LANE_WORKER_MACHINE_ID from
    # the scaler's process backend), recorded with its heartbeat; None by hand.
    machine_id: str | None = None
    # One of a LANE_WORKER_PROCESSES supervisor's processes: stops come from it.
    supervised: bool = False

    @property
    def database_url_redacted(self) -> str:
        """Return the database URL with its password removed, for logs and displays."""
        return redact_url(self.database_url)

    @property
    def client_pool_size(self) -> int:
        """Return how many pooled connections a client (the app) holds here."""
        return SERVERLESS_CLIENT_POOL_SIZE if self.serverless else WORKER_POOL_SIZE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Validate the environment once; raise the first ``LaneConfigError`` if boot is refused."""
        diagnosis = diagnose(env)
        if diagnosis.errors:
            raise diagnosis.errors[0]
        # diagnose() leaves these None only when it also reported an error.
        assert diagnosis.release_id is not None
        assert diagnosis.launch_release_id is not None
        assert diagnosis.queue is not None
        return cls(
            database_url=(env.get(DATABASE_URL_ENV) or "").strip(),
            release_id=diagnosis.release_id,
            launch_release_id=diagnosis.launch_release_id,
            queue=diagnosis.queue,
            scheduler_schema=diagnosis.scheduler_schema,
            store_schema=diagnosis.store_schema,
            isolated=diagnosis.isolated,
            queue_suffix=diagnosis.queue_suffix,
            suffix_source=diagnosis.suffix_source,
            serverless=diagnosis.serverless,
            tuning=diagnosis.tuning,
            warnings=diagnosis.warnings,
            diagnosis=diagnosis,
            daytona_env={k: v for k, v in env.items() if k.startswith("DAYTONA_")},
            machine_id=(
                (env.get(MACHINE_ID_ENV) or env.get(FLY_MACHINE_ID_ENV) or "").strip()[:200] or None
            ),
            supervised=supervised_by_parent(env),
        )


def _database_url(env: Mapping[str, str], problems: Problems) -> str | None:
    url = blank_as_unset(env, DATABASE_URL_ENV)
    if url is None:
        problems.refuse(
            DATABASE_URL_ENV,
            f"{DATABASE_URL_ENV} is not set: set it to the runtime database's URL "
            "(postgresql://user:password@host:5432/dbname).",
        )
        return None
    problem = url_problem(url)
    if problem is not None:
        # The sentence quotes none of the value: any part of it may be the password.
        problems.refuse(DATABASE_URL_ENV, database_url_refusal(problem))
        return None
    if any(len(s) < WHOLE_WORD_BELOW for s in url_secrets(url)):
        problems.warnings.append(
            f"the password in {DATABASE_URL_ENV} is shorter than {WHOLE_WORD_BELOW} characters: "
            "logs and messages mask it only where it stands as a whole word; use a longer one."
        )
    return redact_url(url)


def database_url_refusal(problem: str) -> str:
    """Return the one sentence that refuses a database URL for ``problem`` (from url_problem)."""
    return f"{DATABASE_URL_ENV} {problem}."


def _scheduler_schema(env: Mapping[str, str], problems: Problems) -> str:
    schema = blank_as_unset(env, lanes.SCHEDULER_SCHEMA_ENV) or lanes.PROD_DEFAULT_SCHEMA
    _check_schema_name(
        lanes.SCHEDULER_SCHEMA_ENV, schema, f"the production default {lanes.PROD_DEFAULT_SCHEMA}",
        problems,
    )  # fmt: skip
    return schema


def _store_schema(env: Mapping[str, str], problems: Problems, scheduler_schema: str) -> str:
    """Return where the store lives: ``LANE_WORKER_STORE_SCHEMA``, else the scheduler schema.

    A schema of the store's own beside another system's tables named alike (the
    TypeScript app's ``runs``, ``attempts``); the lane rules (isolated or not,
    the queue suffix) still follow ``DEEPLINE_RUNTIME_SCHEDULER_SCHEMA`` alone.
    """
    schema = blank_as_unset(env, STORE_SCHEMA_ENV)
    if schema is None:
        return scheduler_schema
    _check_schema_name(
        STORE_SCHEMA_ENV, schema, f"the store in {lanes.SCHEDULER_SCHEMA_ENV}'s schema", problems
    )
    return schema


def _check_schema_name(variable: str, schema: str, unset_means: str, problems: Problems) -> None:
    if schema.lower() in _RESERVED_SCHEMAS or schema.lower().startswith("pg_"):
        problems.refuse(
            variable,
            f"{variable}={shown(schema)} is a schema the engine or Postgres owns: choose a "
            f"schema of the run-state store's own, or unset it for {unset_means}.",
        )
    elif (
        schema != schema.lower()
        and _SCHEMA_NAME.fullmatch(schema.lower())
        and len(schema) <= _PG_IDENTIFIER_MAX_BYTES
    ):
        problems.refuse(
            variable,
            f"{variable}={shown(schema)} has upper-case letters: Postgres folds an unquoted "
            f"name to lower case, so the app's {schema}.submit_run would look in "
            f"{schema.lower()}, not in the schema lane-worker would create; set it to "
            f"{schema.lower()!r}, or unset it for {unset_means}.",
        )
    # The pattern is ASCII, so a name it matches has as many bytes as characters.
    elif not _SCHEMA_NAME.fullmatch(schema) or len(schema) > _PG_IDENTIFIER_MAX_BYTES:
        problems.refuse(
            variable,
            f"{variable}={shown(schema)} is not a usable schema name: set it to lower-case "
            "letters, digits and underscores (at most 63 bytes, not starting with a digit), "
            f"or unset it for {unset_means}.",
        )


def normalize_twice_differs(raw: str) -> bool:
    """Tell whether a suffix's normal form ends in ``_`` (the 32-char cut fell before one)."""
    once = lanes.normalize_queue_suffix(raw)
    return lanes.normalize_queue_suffix(once) != once


def release_id_problem(release_id: str) -> str | None:
    """Say why ``release_id`` (as an operator typed it) names no lane, or None."""
    trimmed = release_id.strip()
    if not trimmed:
        return "a release id must not be blank"
    if not plain_text(trimmed):
        return f"release id {shown(trimmed)} holds a control character or invalid text"
    if len(trimmed) > MAX_RELEASE_ID_CHARS:
        return (
            f"a release id has at most {MAX_RELEASE_ID_CHARS} characters "
            f"(this one has {len(trimmed)})"
        )
    try:
        lanes.queue_name_for_release(trimmed)
    except LaneConfigError:
        return (
            f"release id {shown(trimmed)} has no letter, digit or underscore, so it names no lane"
        )
    return None


def _check_deploy_version(
    env: Mapping[str, str], deploy_version: str, release_id: str | None, problems: Problems
) -> None:
    """Refuse a deploy version that is too long or spelled like a dev lane."""
    name = lanes.RELEASE_ID_ENV
    if release_id is None:
        return  # current_release_id already refused it
    if not plain_text(deploy_version):
        problems.refuse(
            name,
            f"{name}={shown(deploy_version)} holds a control character or invalid text: set it "
            "to the release id (for example a git sha).",
        )
        return
    if len(deploy_version) > MAX_RELEASE_ID_CHARS:
        problems.refuse(
            name,
            f"{name} has {len(deploy_version)} characters, more than the "
            f"{MAX_RELEASE_ID_CHARS} a release id may have: set it to the release id "
            "(for example a git sha).",
        )
        return
    # The app stamps the raw slug and derives its queue through the dev rules;
    # the worker sanitizes it first. A slug spelled like a dev lane ("DEV",
    # "dev-x") gives two different queues and every run would hang; "dev" or
    # "dev-" gives the shared dev queue, which a production machine must not drain.
    worker_queue = lanes.queue_name_for_release(release_id)
    launch_queue = lanes.queue_name_for_release(lanes.launch_release_id(env))
    if launch_queue != worker_queue or worker_queue == lanes.RUNS_QUEUE_BASE:
        problems.refuse(
            name,
            f"{name}={shown(deploy_version)} is spelled like a dev lane ('dev' or 'dev-...'): "
            f"the app would submit its runs to {launch_queue} and this worker would drain "
            f"{worker_queue}; set it to the release id (for example a git sha), or unset it "
            "to serve the dev lane.",
        )


def diagnose(env: Mapping[str, str]) -> Diagnosis:
    """Resolve the worker topology from ``env`` and list everything that would refuse boot.

    Problems are listed in the order they are found (the boot guard says the first):
    the store schema, the lane, the tuning variables, the URL, ``VERCEL``.
    """
    problems = Problems()
    problems.warnings += unknown_variables(env)
    problems.warnings += supervisor_pid_warnings(env)
    schema = _scheduler_schema(env, problems)
    store_schema = _store_schema(env, problems, schema)
    isolated = lanes.is_isolated_schema(schema)
    lane = _lane(env, schema, isolated, problems)
    tuning = read_tuning(env, problems)
    database = _database_url(env, problems)
    return Diagnosis(
        release_id=lane.release_id,
        launch_release_id=lanes.launch_release_id(env) if lane.release_id is not None else None,
        queue=lane.queue,
        scheduler_schema=schema,
        store_schema=store_schema,
        isolated=isolated,
        queue_suffix=lane.suffix,
        suffix_source=lane.source,
        database_url_redacted=database,
        serverless=flag(env, problems, SERVERLESS_ENV, "on a serverless platform (Vercel sets 1)"),
        tuning=tuning,
        errors=tuple(problems.errors),
        warnings=tuple(problems.warnings),
    )


@dataclass(frozen=True)
class _Lane:
    """The lane the environment names (release id and queue None when refused)."""

    release_id: str | None
    queue: str | None
    suffix: str
    source: SuffixSource


def _lane(env: Mapping[str, str], schema: str, isolated: bool, problems: Problems) -> _Lane:
    raw_suffix = blank_as_unset(env, lanes.QUEUE_SUFFIX_ENV)
    suffix = lanes.queue_suffix_from_env(env)
    deploy_version = blank_as_unset(env, lanes.RELEASE_ID_ENV)
    if raw_suffix is not None and not suffix:
        # Falling back to the shared queue would drain another topology's runs.
        problems.refuse(
            lanes.QUEUE_SUFFIX_ENV,
            f"{lanes.QUEUE_SUFFIX_ENV}={shown(raw_suffix)} has no letter, digit or underscore, "
            "so it names no queue: set it to the worktree or preview name, or unset it.",
        )
    elif isolated and not suffix and _SCHEMA_NAME.fullmatch(schema):
        # (An unusable name is refused above; the suffix derived from it means nothing.)
        problems.refuse(
            lanes.QUEUE_SUFFIX_ENV,
            f"{lanes.SCHEDULER_SCHEMA_ENV}={shown(schema)} is an isolated topology, which needs "
            f"its own queue: set {lanes.QUEUE_SUFFIX_ENV} (to "
            f"{lanes.queue_suffix_for_schema(schema, {})!r}, the suffix the app derives for it).",
        )

    release_id: str | None
    try:
        release_id = lanes.current_release_id(env)
        queue: str | None = lanes.queue_name_for_release(release_id)
    except LaneConfigError as exc:
        problems.errors.append(exc)
        release_id = queue = None

    if deploy_version is not None and not suffix:
        _check_deploy_version(env, deploy_version, release_id, problems)
    source: SuffixSource = (
        "DEEPLINE_ABSURD_QUEUE_SUFFIX"
        if suffix
        else "DEEPLINE_RUNTIME_DEPLOY_VERSION"
        if deploy_version is not None
        else "default"
    )
    lane = _Lane(release_id, queue, suffix, source)
    problems.warnings += _lane_warnings(lane, schema, isolated, raw_suffix, deploy_version)
    return lane


def _lane_warnings(
    lane: _Lane, schema: str, isolated: bool, raw_suffix: str | None, deploy_version: str | None
) -> list[str]:
    """What doctor warns about a lane that boots: suffixes the app may derive otherwise."""
    suffix, said = lane.suffix, []
    if suffix and raw_suffix is not None and normalize_twice_differs(raw_suffix):
        said.append(
            f"{lanes.QUEUE_SUFFIX_ENV}={shown(raw_suffix)} is cut at 32 characters just before "
            f"an underscore: the lane queue is {lane.queue} but runs_queue_for_suffix() gives "
            f"runs_{suffix}; choose a suffix of at most 31 characters."
        )
    if isolated and suffix and _SCHEMA_NAME.fullmatch(schema):
        # The hosted preview app learns the schema per request and derives the
        # suffix from it; a worker on any other suffix drains a queue nobody fills.
        app_suffix = lanes.queue_suffix_for_schema(schema, {})
        if suffix != app_suffix:
            said.append(
                f"{lanes.QUEUE_SUFFIX_ENV}={suffix!r} differs from {app_suffix!r}, the suffix "
                f"the app derives for schema {shown(schema)}; runs the app submits for that schema "
                f"land on runs_{app_suffix}, which this worker does not drain."
            )
    if suffix and deploy_version is not None:
        said.append(
            f"{lanes.QUEUE_SUFFIX_ENV} outranks {lanes.RELEASE_ID_ENV}={shown(deploy_version)}: "
            f"this worker serves the dev lane {lane.release_id!r}, not that release."
        )
    return said
