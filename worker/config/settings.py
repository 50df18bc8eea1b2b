"""The environment, read once at the entry point into one frozen ``Settings``.

``diagnose`` resolves as much of the topology as it can and lists every
problem; ``Settings.from_env`` is the boot guard built on it: the first problem
refuses the boot (exit 78) with one sentence naming the variable to set.
Nothing else in lane-worker reads ``os.environ``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
    page_token,
    supervised_by_parent,
    supervisor_pid_warnings,
    unknown_variables,
)
from worker.config.env import HEALTH_HOST_ENV as HEALTH_HOST_ENV
from worker.config.env import HEALTH_PORT_ENV as HEALTH_PORT_ENV
from worker.config.env import LOG_FORMAT_ENV as LOG_FORMAT_ENV
from worker.config.env import MAX_ATTEMPTS_ENV as MAX_ATTEMPTS_ENV
from worker.config.env import MAX_RELEASE_ID_CHARS as MAX_RELEASE_ID_CHARS
from worker.config.env import PAGE_TOKEN_ENV as PAGE_TOKEN_ENV
from worker.config.env import PAGE_URL_ENV as PAGE_URL_ENV
from worker.config.env import PGBOUNCER_ENV as PGBOUNCER_ENV
from worker.config.env import POLL_INTERVAL_ENV as POLL_INTERVAL_ENV
from worker.config.env import SERVERLESS_ENV as SERVERLESS_ENV
from worker.config.env import STORE_SCHEMA_ENV as STORE_SCHEMA_ENV
from worker.config.env import TEST_DATABASE_URL_ENV as TEST_DATABASE_URL_ENV
from worker.config.env import decimal_number as decimal_number
from worker.config.env import whole_number as whole_number
from worker.config.topology import SuffixSource, lane_of, scheduler_schema, store_schema
from worker.config.topology import boot_refusal as boot_refusal
from worker.config.topology import normalize_twice_differs as normalize_twice_differs
from worker.config.topology import release_id_problem as release_id_problem
from worker.config.tuning import LogFormat as LogFormat
from worker.config.tuning import Tuning as Tuning
from worker.config.tuning import read_tuning
from worker.errors import EXIT_CONFIG as EXIT_CONFIG
from worker.errors import EXIT_OK as EXIT_OK
from worker.errors import LaneConfigError, exit_code_for

WORKER_POOL_SIZE = 2
SERVERLESS_CLIENT_POOL_SIZE = 1


@dataclass(frozen=True)
class Diagnosis:
    """Everything the environment resolves to, plus what is wrong with it."""

    # The release id as deployed (what the app stamps: ``lanes.launch_release_id``); every
    # output and store row names the release by it. Its lane is ``queue``, derived from
    # the sanitized segment (``lanes.current_release_id``) as the lane rules say.
    release_id: str | None
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
    # Whether LANE_WORKER_PAGE_TOKEN is set (the page's actions are on); never the token.
    page_actions: bool = False

    @property
    def launch_release_id(self) -> str | None:
        """The release id as deployed: ``release_id`` (the name kept for callers of 0.2.1)."""
        return self.release_id

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
            # The same value as releaseId, kept for scripts written against 0.2.1.
            "launchReleaseId": self.release_id,
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
            "pageActions": self.page_actions,
            "maxAttempts": self.tuning.max_attempts,
            "logFormat": self.tuning.log_format,
            "eventLoop": self.tuning.event_loop,
            "pgbouncer": self.tuning.pgbouncer,
            "deferAlertAfterSeconds": self.tuning.defer_alert_after_s,
            "deferFailAfterSeconds": self.tuning.defer_fail_after_s,
            "pruneAfterSeconds": self.tuning.prune_after_s,
            "refused": self.refused,
            "exitCode": self.exit_code,
            "errors": [{"variable": e.variable, "message": str(e)} for e in self.errors],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Settings:
    """The validated configuration of one worker process."""

    database_url: str = field(repr=False)  # carries the password: never in repr or logs
    release_id: str  # as deployed (Diagnosis.release_id); the lane is ``queue``
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
    # LANE_WORKER_PAGE_TOKEN: the operator page's actions need it (None: read-only).
    page_token: str | None = field(default=None, repr=False, compare=False)
    # LANE_WORKER_PAGE_POSTGRES: the pages' own database URL (None: the daemon's).
    page_database_url: str | None = field(default=None, repr=False, compare=False)

    @property
    def launch_release_id(self) -> str:
        """The release id as deployed: ``release_id`` (the name kept for callers of 0.2.1)."""
        return self.release_id

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
        assert diagnosis.queue is not None
        return cls(
            database_url=(env.get(DATABASE_URL_ENV) or "").strip(),
            release_id=diagnosis.release_id,
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
            page_token=blank_as_unset(env, PAGE_TOKEN_ENV),
            page_database_url=blank_as_unset(env, PAGE_URL_ENV),
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


def _page_url(env: Mapping[str, str], problems: Problems) -> None:
    url = blank_as_unset(env, PAGE_URL_ENV)
    problem = None if url is None else url_problem(url)
    if problem is not None:  # quoting none of the value, as for the daemon's URL
        problems.refuse(PAGE_URL_ENV, f"{PAGE_URL_ENV} {problem}.")


def database_url_refusal(problem: str) -> str:
    """Return the one sentence that refuses a database URL for ``problem`` (from url_problem)."""
    return f"{DATABASE_URL_ENV} {problem}."


def diagnose(env: Mapping[str, str]) -> Diagnosis:
    """Resolve the worker topology from ``env`` and list everything that would refuse boot.

    Problems are listed in the order they are found (the boot guard says the first):
    the store schema, the lane, the tuning variables, the URL, ``VERCEL``.
    """
    problems = Problems()
    problems.warnings += unknown_variables(env)
    problems.warnings += supervisor_pid_warnings(env)
    schema = scheduler_schema(env, problems)
    store = store_schema(env, problems, schema)
    isolated = lanes.is_isolated_schema(schema)
    lane = lane_of(env, schema, isolated, problems)
    tuning = read_tuning(env, problems)
    token = page_token(env, problems)
    database = _database_url(env, problems)
    _page_url(env, problems)
    return Diagnosis(
        # The boot guard refuses a deploy version whose two spellings name two queues, so
        # this id and the lane's segment name one queue (``queue``, from the segment).
        release_id=lanes.launch_release_id(env) if lane.release_id is not None else None,
        queue=lane.queue,
        scheduler_schema=schema,
        store_schema=store,
        isolated=isolated,
        queue_suffix=lane.suffix,
        suffix_source=lane.source,
        database_url_redacted=database,
        serverless=flag(env, problems, SERVERLESS_ENV, "on a serverless platform (Vercel sets 1)"),
        tuning=tuning,
        errors=tuple(problems.errors),
        warnings=tuple(problems.warnings),
        page_actions=token is not None,
    )
