"""The topology the environment names: the schemas, the lane, the release id.

Each reader appends what it refuses or warns about to the caller's ``Problems``;
``settings.diagnose`` calls them in order and builds the ``Diagnosis``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from worker import lanes
from worker.config.env import (
    MAX_RELEASE_ID_CHARS,
    STORE_SCHEMA_ENV,
    Problems,
    blank_as_unset,
    plain_text,
)
from worker.errors import LaneConfigError, shown

_PG_IDENTIFIER_MAX_BYTES = 63
# Lower case only: Postgres folds an unquoted name to lower case, so a schema made
# as "Runtime" (quoted, as the store quotes it) is not the app's unquoted Runtime.
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]*")
# The engine's schemas and Postgres's own: store tables there would mix with theirs.
_RESERVED_SCHEMAS = frozenset({"absurd", "lane_worker", "public", "information_schema"})

SuffixSource = Literal["DEEPLINE_ABSURD_QUEUE_SUFFIX", "DEEPLINE_RUNTIME_DEPLOY_VERSION", "default"]


def scheduler_schema(env: Mapping[str, str], problems: Problems) -> str:
    schema = blank_as_unset(env, lanes.SCHEDULER_SCHEMA_ENV) or lanes.PROD_DEFAULT_SCHEMA
    _check_schema_name(
        lanes.SCHEDULER_SCHEMA_ENV,
        schema,
        f"the production default {lanes.PROD_DEFAULT_SCHEMA}",
        problems,
    )
    return schema


def store_schema(env: Mapping[str, str], problems: Problems, scheduler_schema: str) -> str:
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


def boot_refusal(release_id: str) -> str | None:
    """Why a worker started with ``DEEPLINE_RUNTIME_DEPLOY_VERSION=release_id`` refuses to
    boot (the boot's own check, lane_of), or None: a deploy of such an id could never run."""
    problems = Problems()
    lane_of({lanes.RELEASE_ID_ENV: release_id}, lanes.PROD_DEFAULT_SCHEMA, False, problems)
    return str(problems.errors[0]) if problems.errors else None


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


@dataclass(frozen=True)
class EnvLane:
    """The lane the environment names (release id and queue None when refused)."""

    release_id: str | None
    queue: str | None
    suffix: str
    source: SuffixSource


def lane_of(env: Mapping[str, str], schema: str, isolated: bool, problems: Problems) -> EnvLane:
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
    lane = EnvLane(release_id, queue, suffix, source)
    problems.warnings += _lane_warnings(lane, schema, isolated, raw_suffix, deploy_version)
    return lane


def _lane_warnings(
    lane: EnvLane, schema: str, isolated: bool, raw_suffix: str | None, deploy_version: str | None
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
