"""Release lanes: which queue a release drains, and what a worker may do with a run.

Pure functions, no I/O. These rules are a contract with the app that submits
runs (written in another language): for the same inputs both sides must derive
the same queue name, byte for byte. ``tests/unit/data/lane_vectors.json`` pins
the results the reference implementation produces.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from worker.errors import LaneConfigError, LaneMismatchError, shown

RELEASE_ID_ENV = "DEEPLINE_RUNTIME_DEPLOY_VERSION"
QUEUE_SUFFIX_ENV = "DEEPLINE_ABSURD_QUEUE_SUFFIX"
SCHEDULER_SCHEMA_ENV = "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"
PROD_DEFAULT_SCHEMA = "runtime_scheduler"
DEV_RELEASE_ID = "dev"
DEV_RELEASE_PREFIX = "dev-"
RUNS_QUEUE_BASE = "runs"
# runs_ (5) + 40 stays far below the engine's 57-byte queue-name limit, which
# itself leaves room for the engine's two-letter table prefixes in 63 bytes.
RELEASE_QUEUE_SUFFIX_MAX = 40
CONTINUATION_WORKER_SUFFIX = ":continuations"
LANE_ADOPTION_DEFER_SECONDS = 30

_QUEUE_SUFFIX_MAX = 32
_HASH_TAIL_CHARS = 8
_SCHEMA_SUFFIX_CHARS = 12
# ASCII only on purpose: the app's regex class is ASCII, and Python's \w is not.
_OUTSIDE_QUEUE_ALPHABET = re.compile(r"[^a-z0-9_]+")

Env = Mapping[str, str]


def _env(env: Env | None) -> Env:
    return os.environ if env is None else env


def _collapse(value: str) -> str:
    """Lowercase, fold runs outside ``[a-z0-9_]`` into one ``_``, trim ``_`` at both ends."""
    return _OUTSIDE_QUEUE_ALPHABET.sub("_", value.lower()).strip("_")


def _sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def _queue(suffix: str) -> str:
    return f"{RUNS_QUEUE_BASE}_{suffix}" if suffix else RUNS_QUEUE_BASE


def normalize_queue_suffix(raw: str) -> str:
    """Return ``raw`` as a queue-name suffix: lowercased, folded to ``[a-z0-9_]``, 32 chars."""
    return _collapse(raw)[:_QUEUE_SUFFIX_MAX]


def queue_suffix_from_env(env: Env | None = None) -> str:
    """Return the normalized ``DEEPLINE_ABSURD_QUEUE_SUFFIX``, or ``""`` when unset."""
    return normalize_queue_suffix(_env(env).get(QUEUE_SUFFIX_ENV) or "")


def is_isolated_schema(schema: str | None) -> bool:
    """Tell whether a scheduler schema names an isolated (preview / worktree) topology."""
    trimmed = (schema or "").strip()
    return bool(trimmed) and trimmed != PROD_DEFAULT_SCHEMA


def worker_requires_queue_suffix(schema: str | None) -> bool:
    """Tell whether a worker on this scheduler schema must have a queue suffix to boot."""
    return is_isolated_schema(schema)


def queue_suffix_for_schema(schema: str | None, env: Env | None = None) -> str:
    """Return the queue suffix a submitter derives for an explicit scheduler schema.

    A schema native to this process (empty, the production default, or this
    process's own schema) uses the process's suffix; any other schema names a
    remote runtime, whose worker is provisioned with a suffix hashed from it.
    """
    values = _env(env)
    trimmed = (schema or "").strip()
    own_schema = (values.get(SCHEDULER_SCHEMA_ENV) or "").strip()
    if not trimmed or trimmed in (PROD_DEFAULT_SCHEMA, own_schema):
        return queue_suffix_from_env(values)
    return _sha256_hex(trimmed)[:_SCHEMA_SUFFIX_CHARS]


def sanitize_release_segment(release_id: str) -> str:
    """Return a release id as a queue-name segment of at most 40 chars (``""`` if none is left).

    Overlong ids keep a readable head and gain a hash tail of the whole
    normalized id, so two long ids that differ only past the cut never share a lane.
    """
    normalized = _collapse(release_id.strip())
    if len(normalized) <= RELEASE_QUEUE_SUFFIX_MAX:
        return normalized
    tail = _sha256_hex(normalized)[:_HASH_TAIL_CHARS]
    head = normalized[: RELEASE_QUEUE_SUFFIX_MAX - _HASH_TAIL_CHARS - 1].rstrip("_")
    return f"{head}_{tail}"


def current_release_id(env: Env | None = None) -> str:
    """Return the lane id this worker process serves.

    Precedence: a queue suffix (``dev-<suffix>``), then the baked deploy
    version (sanitized), then ``dev``.
    """
    values = _env(env)
    suffix = queue_suffix_from_env(values)
    if suffix:
        return f"{DEV_RELEASE_PREFIX}{suffix}"
    deploy_version = (values.get(RELEASE_ID_ENV) or "").strip()
    if not deploy_version:
        return DEV_RELEASE_ID
    segment = sanitize_release_segment(deploy_version)
    if not segment:
        raise LaneConfigError(
            f"{RELEASE_ID_ENV}={shown(deploy_version)} has no letter, digit or underscore, "
            "so it names no release lane; set it to the release id (for example a git sha).",
            variable=RELEASE_ID_ENV,
        )
    return segment


def launch_release_id(env: Env | None = None) -> str:
    """Return the release id stamped on a launch row: the raw deploy slug, not the lane id."""
    values = _env(env)
    suffix = queue_suffix_from_env(values)
    if suffix:
        return f"{DEV_RELEASE_PREFIX}{suffix}"
    return (values.get(RELEASE_ID_ENV) or "").strip() or DEV_RELEASE_ID


# Asked twice per run (the lane guard compares a run's raw release with the worker's
# sanitized one); a worker meets a handful of releases.
@functools.lru_cache(maxsize=1024)
def queue_name_for_release(release_id: str) -> str:
    """Return the one queue a release's runs ride for their whole life."""
    trimmed = (release_id or "").strip()
    if not trimmed:
        raise LaneConfigError(
            "a release lane needs a non-empty release id; resolve it with "
            "current_release_id() or from the run's launch row."
        )
    if trimmed == DEV_RELEASE_ID:
        return RUNS_QUEUE_BASE
    if trimmed.startswith(DEV_RELEASE_PREFIX):
        return _queue(normalize_queue_suffix(trimmed[len(DEV_RELEASE_PREFIX) :]))
    segment = sanitize_release_segment(trimmed)
    if not segment:
        raise LaneConfigError(
            f"release id {shown(trimmed)} has no letter, digit or underscore, so it names no queue."
        )
    return _queue(segment)


def _effective_suffix(explicit_suffix: str | None, env: Env | None) -> str:
    # An explicit suffix that is not blank wins even if it normalizes to
    # nothing: the caller asked for a specific lane, not for the process default.
    explicit = (explicit_suffix or "").strip()
    if explicit:
        return normalize_queue_suffix(explicit)
    return queue_suffix_from_env(env)


def release_id_for_suffix(explicit_suffix: str | None = None, env: Env | None = None) -> str:
    """Return the release id a submit stamps, given an optional explicit (preview) suffix."""
    suffix = _effective_suffix(explicit_suffix, env)
    if suffix:
        return f"{DEV_RELEASE_PREFIX}{suffix}"
    return current_release_id(env)


def release_id_for_launch(launch: Mapping[str, object], env: Env | None = None) -> str:
    """Return the release a launch row belongs to: its stamp, else this process's lane.

    Rows written before release stamping existed carry no ``absurdReleaseId``.
    """
    stamped = launch.get("absurdReleaseId")
    if stamped is not None and not isinstance(stamped, str):
        raise LaneConfigError(
            f"launch row has a non-string absurdReleaseId ({type(stamped).__name__}); "
            "it must be the release id string the run was submitted on."
        )
    return (stamped or "").strip() or current_release_id(env)


def queue_name_for_launch(launch: Mapping[str, object], env: Env | None = None) -> str:
    """Return the queue a launch row rides for its whole life."""
    return queue_name_for_release(release_id_for_launch(launch, env))


def runs_queue_for_suffix(suffix: str | None = None, env: Env | None = None) -> str:
    """Return ``runs`` or ``runs_<effective suffix>``."""
    return _queue(_effective_suffix(suffix, env))


def is_runs_queue(name: str) -> bool:
    """Tell whether a queue name is a release lane of the runs queue."""
    return name == RUNS_QUEUE_BASE or name.startswith(f"{RUNS_QUEUE_BASE}_")


def _same_lane(run_release_id: str, worker_release_id: str) -> bool:
    # The raw launch slug and the sanitized worker id are two spellings of one
    # lane once an id overflows 40 chars; the queue is the real boundary.
    return run_release_id == worker_release_id or queue_name_for_release(
        run_release_id
    ) == queue_name_for_release(worker_release_id)


def assert_release_lane_matches(run_id: str, run_release_id: str, worker_release_id: str) -> None:
    """Raise ``LaneMismatchError`` unless the run's release and this worker's share a lane."""
    if _same_lane(run_release_id, worker_release_id):
        return
    run_queue = queue_name_for_release(run_release_id)
    raise LaneMismatchError(
        f"release lane mismatch for run {run_id}: it was launched on release "
        f"{run_release_id!r} but this worker serves release {worker_release_id!r}, and a run "
        f"must finish on the release that launched it; start a lane worker for "
        f"{run_release_id!r} (queue {run_queue}).",
        run_id=run_id,
        run_release_id=run_release_id,
        worker_release_id=worker_release_id,
    )


# The own loop drains the release's queue; a continuation loop adopts from (or
# finishes its adoptees on) another lane's queue.
LoopKind = Literal["own", "continuation"]


def loop_kind(queue: str, own_queue: str) -> LoopKind:
    """Return the kind of claim loop a worker whose lane is ``own_queue`` runs on ``queue``."""
    return "own" if queue == own_queue else "continuation"


def continuation_worker_id(worker_base: str, queue: str) -> str:
    """Return the engine worker id of a continuation loop on ``queue``.

    The ``:continuations`` suffix is what the continuation claim function
    checks before it hands out anything.
    """
    return f"{worker_base}:{queue}{CONTINUATION_WORKER_SUFFIX}"


@dataclass(frozen=True)
class Own:
    """The run belongs to this worker's lane."""

    kind: Literal["own"] = field(default="own", init=False)


@dataclass(frozen=True)
class Adopt:
    """A retired lane's parked run resumes on this (newer) release."""

    adopted_release_id: str
    kind: Literal["adopt"] = field(default="adopt", init=False)


@dataclass(frozen=True)
class Defer:
    """A retired lane's run that is not parked: put it back later, spending no attempt."""

    reason: str
    delay_seconds: int = LANE_ADOPTION_DEFER_SECONDS
    kind: Literal["defer"] = field(default="defer", init=False)


@dataclass(frozen=True)
class Refuse:
    """The run's lane still claims: this worker must not touch it (operator error)."""

    kind: Literal["refuse"] = field(default="refuse", init=False)


LaneDisposition = Own | Adopt | Defer | Refuse


def resolve_lane_disposition(
    *,
    run_id: str,
    run_release_id: str,
    worker_release_id: str,
    lane_claiming: bool,
    parked_in_adoptable_wait: bool,
) -> LaneDisposition:
    """Decide what this worker does with a claimed run, from the store's lane facts.

    ``run_release_id`` is the run's effective release (its adopter once adopted).
    """
    if _same_lane(run_release_id, worker_release_id):
        return Own()
    if lane_claiming:
        return Refuse()
    if not parked_in_adoptable_wait:
        return Defer(
            reason=(
                f"run {run_id} rides retired release lane {run_release_id!r} but is not "
                "parked in a sleep or event wait; only parked runs are adopted, so it "
                "is left for its own lane."
            ),
        )
    return Adopt(adopted_release_id=run_release_id)


def adoption_queues(
    worker_release_id: str, adoptable_release_ids: Iterable[str | None]
) -> list[str]:
    """Return the queues to attach continuation loops to, sorted, without this worker's own."""
    own_queue = queue_name_for_release(worker_release_id)
    queues = {
        queue_name_for_release(release_id)
        for release_id in adoptable_release_ids
        if release_id and release_id.strip()
    }
    queues.discard(own_queue)
    return sorted(queues)
