"""The environment, read once at the entry point into one frozen ``Settings``.

``diagnose`` resolves as much of the topology as it can and lists every
problem; ``Settings.from_env`` is the boot guard built on it: the first problem
refuses the boot (exit 78) with one sentence naming the variable to set.
Nothing else in lane-worker reads ``os.environ``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from worker import lanes
from worker.errors import LaneConfigError

EXIT_OK = 0
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h: what orchestrators read as "fix the config"

DATABASE_URL_ENV = "WORKFLOW_RUNTIME_POSTGRES"
SERVERLESS_ENV = "VERCEL"
CONCURRENCY_ENV = "LANE_WORKER_CONCURRENCY"
CLAIM_TIMEOUT_ENV = "LANE_WORKER_CLAIM_TIMEOUT"
POLL_INTERVAL_ENV = "LANE_WORKER_POLL_INTERVAL"
DRAIN_SECONDS_ENV = "LANE_WORKER_DRAIN_SECONDS"
HEALTH_PORT_ENV = "LANE_WORKER_HEALTH_PORT"
MAX_ATTEMPTS_ENV = "LANE_WORKER_MAX_ATTEMPTS"
LOG_FORMAT_ENV = "LANE_WORKER_LOG_FORMAT"
PGBOUNCER_ENV = "LANE_WORKER_PGBOUNCER"
# Read by the test suite only; listed so doctor does not call it a typo.
TEST_DATABASE_URL_ENV = "LANE_WORKER_TEST_DATABASE_URL"

WORKER_POOL_SIZE = 2
SERVERLESS_CLIENT_POOL_SIZE = 1
_PG_IDENTIFIER_MAX_BYTES = 63
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REDACTED = "***"

LogFormat = Literal["json", "console", "auto"]
SuffixSource = Literal["DEEPLINE_ABSURD_QUEUE_SUFFIX", "DEEPLINE_RUNTIME_DEPLOY_VERSION", "default"]
_Number = TypeVar("_Number", int, float)


def redact_url(url: str) -> str:
    """Return ``url`` with any password (userinfo or ``password=`` parameter) replaced."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = f"{userinfo.split(':', 1)[0]}:{_REDACTED}"
            netloc = f"{userinfo}@{host}"
        query = urlencode(
            [
                (key, _REDACTED if key.lower() == "password" else value)
                for key, value in parse_qsl(parts.query, keep_blank_values=True)
            ],
            safe="*/",
        )
        # Built by hand: urlunsplit drops the `//` of a URL with an empty host.
        rebuilt = f"{parts.scheme}://{netloc}{parts.path}"
        rebuilt += f"?{query}" if query else ""
        return rebuilt + (f"#{parts.fragment}" if parts.fragment else "")
    except ValueError:
        # Unparseable: say nothing of its content rather than risk echoing a secret.
        return "<unparseable URL>"


def url_secrets(url: str) -> tuple[str, ...]:
    """Return the secrets in ``url`` that must never be printed: its passwords, both spellings."""
    try:
        parts = urlsplit(url)
        found = [parts.password or ""]
        found += [
            v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k.lower() == "password"
        ]
    except ValueError:
        return ()
    # urlsplit leaves the password percent-encoded; the driver (and its errors) decode it.
    found += [unquote(s) for s in found]
    # Longest first, so a secret containing another is replaced whole.
    return tuple(sorted({s for s in found if s}, key=len, reverse=True))


def mask_secrets(text: str, secrets: Sequence[str]) -> str:
    """Return ``text`` with every occurrence of each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class Tuning:
    """Worker tuning knobs (``LANE_WORKER_*``), each with the documented default."""

    concurrency: int = 8
    claim_timeout_s: int = 60
    poll_interval_s: float = 1.0
    drain_s: float = 25.0
    health_port: int = 8080
    max_attempts: int = 5
    log_format: LogFormat = "auto"
    pgbouncer: bool = False


@dataclass(frozen=True)
class Diagnosis:
    """Everything the environment resolves to, plus what is wrong with it."""

    release_id: str | None
    launch_release_id: str | None
    queue: str | None
    scheduler_schema: str
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
        """Return the exit code the daemon would use for this configuration."""
        return EXIT_CONFIG if self.errors else EXIT_OK

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
            "drainSeconds": self.tuning.drain_s,
            "healthPort": self.tuning.health_port,
            "maxAttempts": self.tuning.max_attempts,
            "logFormat": self.tuning.log_format,
            "pgbouncer": self.tuning.pgbouncer,
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
    isolated: bool
    queue_suffix: str
    suffix_source: SuffixSource
    serverless: bool
    tuning: Tuning

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
            isolated=diagnosis.isolated,
            queue_suffix=diagnosis.queue_suffix,
            suffix_source=diagnosis.suffix_source,
            serverless=diagnosis.serverless,
            tuning=diagnosis.tuning,
        )


class _Problems:
    """Collects configuration errors and warnings while ``diagnose`` reads the environment."""

    def __init__(self) -> None:
        self.errors: list[LaneConfigError] = []
        self.warnings: list[str] = []

    def refuse(self, variable: str, sentence: str) -> None:
        self.errors.append(LaneConfigError(sentence, variable=variable))


def blank_as_unset(env: Mapping[str, str], name: str) -> str | None:
    """Return the stripped value of ``name``, or None when it is unset or blank."""
    # `NAME=` in an env file means "not set", not "set to nothing".
    value = (env.get(name) or "").strip()
    return value or None


def _number(
    env: Mapping[str, str],
    problems: _Problems,
    name: str,
    default: _Number,
    parse: Callable[[str], _Number],
    bounds: tuple[_Number, ...],
    meaning: str,
) -> _Number:
    minimum, maximum = bounds
    raw = blank_as_unset(env, name)
    if raw is None:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not minimum <= value <= maximum:
        problems.refuse(
            name,
            f"{name}={raw!r} is not valid: set it to {meaning} between {minimum} and {maximum} "
            f"(default {default}), or unset it.",
        )
        return default
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def pgbouncer_mode(env: Mapping[str, str]) -> bool:
    """Tell whether ``LANE_WORKER_PGBOUNCER`` asks for PgBouncer mode (invalid values: no)."""
    return (blank_as_unset(env, PGBOUNCER_ENV) or "").lower() in _TRUE


def _tuning(env: Mapping[str, str], problems: _Problems) -> Tuning:
    defaults = Tuning()
    log_format = (blank_as_unset(env, LOG_FORMAT_ENV) or defaults.log_format).lower()
    if log_format not in ("json", "console", "auto"):
        problems.refuse(
            LOG_FORMAT_ENV,
            f"{LOG_FORMAT_ENV}={env.get(LOG_FORMAT_ENV)!r} is not valid: set it to json, "
            "console or auto (default auto: console on a terminal, json otherwise).",
        )
        log_format = defaults.log_format

    pgbouncer_raw = (blank_as_unset(env, PGBOUNCER_ENV) or "false").lower()
    if pgbouncer_raw not in _TRUE + _FALSE:
        problems.refuse(
            PGBOUNCER_ENV,
            f"{PGBOUNCER_ENV}={env.get(PGBOUNCER_ENV)!r} is not valid: set it to true when "
            "WORKFLOW_RUNTIME_POSTGRES goes through PgBouncer transaction pooling, else false.",
        )

    def read(name: str, default: _Number, parse: Callable[[str], _Number], *bounds: _Number,
             meaning: str) -> _Number:  # fmt: skip
        return _number(env, problems, name, default, parse, bounds, meaning)

    runs, whole_s, secs = (
        "a whole number of runs",
        "a whole number of seconds",
        "a number of seconds",
    )
    return Tuning(
        concurrency=read(CONCURRENCY_ENV, defaults.concurrency, int, 1, 1000, meaning=runs),
        claim_timeout_s=read(
            CLAIM_TIMEOUT_ENV, defaults.claim_timeout_s, int, 5, 86_400, meaning=whole_s
        ),
        poll_interval_s=read(
            POLL_INTERVAL_ENV, defaults.poll_interval_s, float, 0.01, 3600.0, meaning=secs
        ),
        drain_s=read(DRAIN_SECONDS_ENV, defaults.drain_s, float, 0.0, 3600.0, meaning=secs),
        health_port=read(
            HEALTH_PORT_ENV,
            defaults.health_port,
            int,
            0,
            65_535,
            meaning="a TCP port (0: any free)",
        ),
        max_attempts=read(
            MAX_ATTEMPTS_ENV,
            defaults.max_attempts,
            int,
            1,
            1000,
            meaning="a whole number of attempts",
        ),
        log_format=log_format,  # type: ignore[arg-type]  # checked against the Literal above
        pgbouncer=pgbouncer_raw in _TRUE,
    )


def _database_url(env: Mapping[str, str], problems: _Problems) -> str | None:
    url = blank_as_unset(env, DATABASE_URL_ENV)
    if url is None:
        problems.refuse(
            DATABASE_URL_ENV,
            f"{DATABASE_URL_ENV} is not set: set it to the runtime database's URL "
            "(postgresql://user:password@host:5432/dbname).",
        )
        return None
    try:
        scheme = urlsplit(url).scheme
    except ValueError:
        scheme = ""
    if scheme not in ("postgres", "postgresql"):
        # Name the scheme only: the rest of the value may hold a password.
        problems.refuse(
            DATABASE_URL_ENV,
            f"{DATABASE_URL_ENV} is not a postgresql:// URL (scheme {scheme!r}): set it to "
            "the runtime database's URL (postgresql://user:password@host:5432/dbname).",
        )
        return None
    return redact_url(url)


def _scheduler_schema(env: Mapping[str, str], problems: _Problems) -> str:
    schema = blank_as_unset(env, lanes.SCHEDULER_SCHEMA_ENV) or lanes.PROD_DEFAULT_SCHEMA
    too_long = len(schema.encode("utf-8")) > _PG_IDENTIFIER_MAX_BYTES
    if too_long or not _SCHEMA_NAME.fullmatch(schema):
        problems.refuse(
            lanes.SCHEDULER_SCHEMA_ENV,
            f"{lanes.SCHEDULER_SCHEMA_ENV}={schema!r} is not a usable schema name: set it to "
            "letters, digits and underscores (at most 63 bytes, not starting with a digit), "
            f"or unset it for the production default {lanes.PROD_DEFAULT_SCHEMA}.",
        )
    return schema


def normalize_twice_differs(raw: str) -> bool:
    """Tell whether a suffix's normal form ends in ``_`` (the 32-char cut fell before one)."""
    once = lanes.normalize_queue_suffix(raw)
    return lanes.normalize_queue_suffix(once) != once


def _unknown_variables(env: Mapping[str, str]) -> list[str]:
    known = {
        CONCURRENCY_ENV, CLAIM_TIMEOUT_ENV, POLL_INTERVAL_ENV, DRAIN_SECONDS_ENV,
        HEALTH_PORT_ENV, MAX_ATTEMPTS_ENV, LOG_FORMAT_ENV, TEST_DATABASE_URL_ENV, PGBOUNCER_ENV,
    }  # fmt: skip
    return [
        f"{name} is set but lane-worker does not read it (a typo?); it is ignored."
        for name in sorted(env)
        if name.startswith("LANE_WORKER_") and name not in known
    ]


def diagnose(env: Mapping[str, str]) -> Diagnosis:
    """Resolve the worker topology from ``env`` and list everything that would refuse boot."""
    problems = _Problems()
    warnings = _unknown_variables(env)
    schema = _scheduler_schema(env, problems)
    isolated = lanes.is_isolated_schema(schema)
    raw_suffix = blank_as_unset(env, lanes.QUEUE_SUFFIX_ENV)
    suffix = lanes.queue_suffix_from_env(env)
    deploy_version = blank_as_unset(env, lanes.RELEASE_ID_ENV)

    if raw_suffix is not None and not suffix:
        # Falling back to the shared queue would drain another topology's runs.
        problems.refuse(
            lanes.QUEUE_SUFFIX_ENV,
            f"{lanes.QUEUE_SUFFIX_ENV}={raw_suffix!r} has no letter, digit or underscore, so it "
            "names no queue: set it to the worktree or preview name, or unset it.",
        )
    elif isolated and not suffix:
        problems.refuse(
            lanes.QUEUE_SUFFIX_ENV,
            f"{lanes.SCHEDULER_SCHEMA_ENV}={schema!r} is an isolated topology, which needs its "
            f"own queue: set {lanes.QUEUE_SUFFIX_ENV} (to "
            f"{lanes.queue_suffix_for_schema(schema, {})!r}, the suffix the app derives for it).",
        )

    release_id: str | None
    try:
        release_id = lanes.current_release_id(env)
        queue: str | None = lanes.queue_name_for_release(release_id)
    except LaneConfigError as exc:
        problems.errors.append(exc)
        release_id = queue = None

    if release_id is not None and deploy_version is not None and not suffix:
        # The app stamps the raw slug and derives its queue through the dev
        # rules; the worker sanitizes it first. For a slug spelled like a dev
        # lane ("DEV", "dev-x") the two queues differ and every run would hang.
        launch_queue = lanes.queue_name_for_release(lanes.launch_release_id(env))
        if launch_queue != queue:
            problems.refuse(
                lanes.RELEASE_ID_ENV,
                f"{lanes.RELEASE_ID_ENV}={deploy_version!r} is spelled like a dev lane: the app "
                f"submits its runs to {launch_queue} but this worker would drain {queue}; "
                "use a release id that is not 'dev' and does not start with 'dev-'.",
            )
    if suffix and raw_suffix is not None and normalize_twice_differs(raw_suffix):
        warnings.append(
            f"{lanes.QUEUE_SUFFIX_ENV}={raw_suffix!r} is cut at 32 characters just before "
            f"an underscore: the lane queue is {queue} but runs_queue_for_suffix() gives "
            f"runs_{suffix}; choose a suffix of at most 31 characters."
        )
    if isolated and suffix:
        # The hosted preview app learns the schema per request and derives the
        # suffix from it; a worker on any other suffix drains a queue nobody fills.
        app_suffix = lanes.queue_suffix_for_schema(schema, {})
        if suffix != app_suffix:
            warnings.append(
                f"{lanes.QUEUE_SUFFIX_ENV}={suffix!r} differs from {app_suffix!r}, the suffix "
                f"the app derives for schema {schema!r}; runs the app submits for that schema "
                f"land on runs_{app_suffix}, which this worker does not drain."
            )
    if suffix and deploy_version is not None:
        warnings.append(
            f"{lanes.QUEUE_SUFFIX_ENV} outranks {lanes.RELEASE_ID_ENV}={deploy_version!r}: "
            f"this worker serves the dev lane {release_id!r}, not that release."
        )

    tuning = _tuning(env, problems)
    database = _database_url(env, problems)
    source: SuffixSource = (
        "DEEPLINE_ABSURD_QUEUE_SUFFIX"
        if suffix
        else "DEEPLINE_RUNTIME_DEPLOY_VERSION"
        if deploy_version is not None
        else "default"
    )
    return Diagnosis(
        release_id=release_id,
        launch_release_id=lanes.launch_release_id(env) if release_id is not None else None,
        queue=queue,
        scheduler_schema=schema,
        isolated=isolated,
        queue_suffix=suffix,
        suffix_source=source,
        database_url_redacted=database,
        serverless=blank_as_unset(env, SERVERLESS_ENV) is not None,
        tuning=tuning,
        errors=tuple(problems.errors),
        warnings=tuple(warnings),
    )
