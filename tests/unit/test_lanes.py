"""Unit tests for worker/lanes.py against DESIGN.md "Lane rules" and the TS reference."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import types

import pytest

from worker import lanes
from worker.config.settings import Settings
from worker.errors import LaneConfigError, LaneMismatchError, LaneWorkerError
from worker.lanes import (
    Adopt,
    Defer,
    Own,
    Refuse,
    adoption_queues,
    assert_release_lane_matches,
    continuation_worker_id,
    current_release_id,
    is_isolated_schema,
    is_runs_queue,
    launch_release_id,
    normalize_queue_suffix,
    queue_name_for_launch,
    queue_name_for_release,
    queue_suffix_for_schema,
    queue_suffix_from_env,
    release_id_for_launch,
    release_id_for_suffix,
    resolve_lane_disposition,
    runs_queue_for_suffix,
    sanitize_release_segment,
    worker_requires_queue_suffix,
)

SUFFIX = "DEEPLINE_ABSURD_QUEUE_SUFFIX"
DEPLOY = "DEEPLINE_RUNTIME_DEPLOY_VERSION"
SCHEMA = "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"

SHA = "0123456789abcdef0123456789abcdef01234567"
PROD_SLUG = f"main-{SHA}"
# The sanitized worker id of PROD_SLUG: a 31-char head, "_", 8 hex of sha256("main_<sha>").
PROD_WORKER_ID = "main_0123456789abcdef0123456789_ab5c07c7"
PROD_QUEUE = f"runs_{PROD_WORKER_ID}"


def _tail(normalized: str) -> str:
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()[:8]


def _schema_suffix(schema: str) -> str:
    return hashlib.sha256(schema.encode("utf-8")).hexdigest()[:12]


def _worker_lane_or_refusal(env: dict[str, str]) -> str | LaneConfigError:
    try:
        return current_release_id(env)
    except LaneConfigError as refused:
        return refused


def _clear_lane_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (SUFFIX, DEPLOY, SCHEMA):
        monkeypatch.delenv(name, raising=False)


# --- constants ---------------------------------------------------------------------------


def test_constants_have_the_contract_values() -> None:
    """Every constant DESIGN.md names has exactly the documented value."""
    assert lanes.RELEASE_ID_ENV == DEPLOY
    assert lanes.QUEUE_SUFFIX_ENV == SUFFIX
    assert lanes.SCHEDULER_SCHEMA_ENV == SCHEMA
    assert lanes.PROD_DEFAULT_SCHEMA == "runtime_scheduler"
    assert lanes.DEV_RELEASE_ID == "dev"
    assert lanes.DEV_RELEASE_PREFIX == "dev-"
    assert lanes.RUNS_QUEUE_BASE == "runs"
    assert lanes.RELEASE_QUEUE_SUFFIX_MAX == 40
    assert lanes.CONTINUATION_WORKER_SUFFIX == ":continuations"
    assert lanes.LANE_ADOPTION_DEFER_SECONDS == 30


def test_error_classes_are_value_errors() -> None:
    """Both lane errors are ValueError subclasses under the project's base error."""
    assert issubclass(LaneConfigError, ValueError)
    assert issubclass(LaneMismatchError, ValueError)
    assert issubclass(LaneConfigError, LaneWorkerError)
    assert issubclass(LaneMismatchError, LaneWorkerError)


# --- normalize_queue_suffix ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", ""),
        ("   ", ""),
        ("\t\n", ""),
        ("---", ""),
        ("!!!", ""),
        ("_", ""),
        ("___", ""),
        ("wt1", "wt1"),
        ("WT1", "wt1"),
        ("Feature/My-Branch", "feature_my_branch"),
        ("  pr 42  ", "pr_42"),
        ("a--b..c", "a_b_c"),
        ("a___b", "a___b"),
        ("_a_", "a"),
        ("-a-", "a"),
        ("café", "caf"),
        ("é", ""),
        ("🚀", ""),
        ("发布", ""),
        ("x发布y", "x_y"),
        ("İ", "i"),
        ("\u212a", "k"),
    ],
)
def test_normalize_queue_suffix_examples(raw: str, expected: str) -> None:
    """Lowercase, fold runs outside [a-z0-9_] to one '_', strip '_' at both ends."""
    assert normalize_queue_suffix(raw) == expected


def test_normalize_queue_suffix_cuts_at_32_chars() -> None:
    """A long suffix keeps its first 32 chars (no hash tail, unlike release segments)."""
    assert normalize_queue_suffix("a" * 32) == "a" * 32
    assert normalize_queue_suffix("a" * 33) == "a" * 32
    assert normalize_queue_suffix("B" * 200) == "b" * 32
    assert normalize_queue_suffix("--" + "c" * 40) == "c" * 32


def test_normalize_queue_suffix_cut_after_a_separator() -> None:
    """A cut right after a separator keeps the 31-char head and at most 32 chars."""
    cut = normalize_queue_suffix("a" * 31 + "-b")
    assert cut.startswith("a" * 31)
    assert len(cut) <= 32
    assert cut.rstrip("_") == "a" * 31


def test_normalize_queue_suffix_keeps_the_reference_cut() -> None:
    """At the 32-char cut a trailing '_' survives, exactly as the app derives it.

    Stripping happens before the cut (DESIGN.md and the reference agree), so a second
    normalization strips it: a contract quirk we keep for byte compatibility. Every
    lane queue goes through queue_name_for_release, which is stable; doctor warns about
    such suffixes (tests/unit/test_config_settings.py).
    """
    once = normalize_queue_suffix("a" * 31 + "-b")
    assert once == "a" * 31 + "_"
    assert normalize_queue_suffix(once) == "a" * 31


def test_lane_queue_for_a_suffix_is_stable_at_the_cut() -> None:
    """Worker and submitter derive the lane queue the same way, even at the cut.

    Both stamp release_id_for_suffix / current_release_id and map it with
    queue_name_for_release; only the compatibility helper runs_queue_for_suffix keeps
    the trailing '_' (as the reference does).
    """
    suffix = "feature-abcdefghijklmnopqrstuvw-xyz"
    env = {SUFFIX: suffix}
    lane = queue_name_for_release(current_release_id(env))
    assert lane == queue_name_for_release(release_id_for_suffix(suffix, env={}))
    assert lane == "runs_feature_abcdefghijklmnopqrstuvw"
    assert runs_queue_for_suffix(env=env) == lane + "_"


# --- queue_suffix_from_env ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ""),
        ({SUFFIX: ""}, ""),
        ({SUFFIX: "   "}, ""),
        ({SUFFIX: "---"}, ""),
        ({SUFFIX: "Feature/X"}, "feature_x"),
        ({SUFFIX: " wt1 "}, "wt1"),
        ({SUFFIX: "é🚀"}, ""),
        ({DEPLOY: "main-abc", SCHEMA: "pr_1"}, ""),
    ],
)
def test_queue_suffix_from_env(env: dict[str, str], expected: str) -> None:
    """The env suffix is the normalized DEEPLINE_ABSURD_QUEUE_SUFFIX, '' when unset."""
    assert queue_suffix_from_env(env) == expected


# --- is_isolated_schema / worker_requires_queue_suffix -----------------------------------


@pytest.mark.parametrize(
    ("schema", "isolated"),
    [
        (None, False),
        ("", False),
        ("   ", False),
        ("runtime_scheduler", False),
        ("  runtime_scheduler\n", False),
        ("RUNTIME_SCHEDULER", True),
        ("runtime_scheduler_2", True),
        ("pr_123", True),
        (" pr_123 ", True),
        ("é", True),
    ],
)
def test_isolated_schema_predicates(schema: str | None, isolated: bool) -> None:
    """Isolated means trimmed non-empty and not the production default; both names agree."""
    assert is_isolated_schema(schema) is isolated
    assert worker_requires_queue_suffix(schema) is isolated


# --- queue_suffix_for_schema --------------------------------------------------------------


@pytest.mark.parametrize("schema", [None, "", "   ", "runtime_scheduler", " runtime_scheduler "])
def test_queue_suffix_for_native_schema_uses_env_suffix(schema: str | None) -> None:
    """Empty schema and the production default give the env suffix ('' when unset)."""
    assert queue_suffix_for_schema(schema, {SUFFIX: "WT-1"}) == "wt_1"
    assert queue_suffix_for_schema(schema, {}) == ""


def test_queue_suffix_for_own_schema_uses_env_suffix() -> None:
    """The process's own scheduler schema (compared trimmed) gives the env suffix."""
    env = {SCHEMA: " pr_7 ", SUFFIX: "preview7"}
    assert queue_suffix_for_schema("pr_7", env) == "preview7"
    assert queue_suffix_for_schema("  pr_7\t", env) == "preview7"
    assert queue_suffix_for_schema("pr_7", {SCHEMA: "pr_7"}) == ""


@pytest.mark.parametrize("schema", ["pr_123", "  pr_123  ", "PR_123", "é-schema", "x" * 200])
def test_queue_suffix_for_foreign_schema_is_a_hash(schema: str) -> None:
    """A foreign schema gives the first 12 hex chars of sha256 of the trimmed schema."""
    expected = hashlib.sha256(schema.strip().encode("utf-8")).hexdigest()[:12]
    env = {SCHEMA: "pr_999", SUFFIX: "mine"}
    assert queue_suffix_for_schema(schema, env) == expected
    assert queue_suffix_for_schema(schema, {}) == expected
    assert len(expected) == 12


def test_queue_suffix_for_schema_is_case_sensitive_about_own_schema() -> None:
    """A schema differing from the own schema only in case is foreign and hashed."""
    env = {SCHEMA: "pr_7", SUFFIX: "mine"}
    assert queue_suffix_for_schema("PR_7", env) == _schema_suffix("PR_7")


# --- sanitize_release_segment -------------------------------------------------------------


@pytest.mark.parametrize(
    ("release_id", "expected"),
    [
        ("", ""),
        ("   ", ""),
        ("\n\t", ""),
        ("---", ""),
        ("!!!", ""),
        ("___", ""),
        ("é", ""),
        ("🚀", ""),
        ("发布", ""),
        ("v1", "v1"),
        ("  V1.2.3  ", "v1_2_3"),
        ("Main-ABC", "main_abc"),
        ("main__abc", "main__abc"),
        ("--main--", "main"),
        ("café", "caf"),
        ("🚀 v1 🚀", "v1"),
        ("发布-2", "2"),
        ("Release-İ1", "release_i_1"),
        ("İ", "i"),
        ("\u212aelvin", "kelvin"),
        ("dev", "dev"),
        ("dev-FOO", "dev_foo"),
    ],
)
def test_sanitize_release_segment_short_examples(release_id: str, expected: str) -> None:
    """Short ids are trimmed, lowercased, folded and stripped; garbage gives ''."""
    assert sanitize_release_segment(release_id) == expected


def test_sanitize_release_segment_exactly_40_is_kept() -> None:
    """An id of exactly 40 normalized chars is kept whole, with no hash tail."""
    release_id = "r" * 40
    assert sanitize_release_segment(release_id) == release_id
    assert sanitize_release_segment(f"  {release_id.upper()}--") == release_id


def test_sanitize_release_segment_41_gets_a_hash_tail() -> None:
    """An id of 41 normalized chars keeps a 31-char head and a sha256 tail of the whole."""
    release_id = "r" * 41
    segment = sanitize_release_segment(release_id)
    assert segment == "r" * 31 + "_" + _tail(release_id)
    assert len(segment) == 40


def test_sanitize_release_segment_200_chars() -> None:
    """A 200-char id is hashed over its full normalized form."""
    release_id = "Ab-" * 66 + "Zz"
    normalized = "ab_" * 66 + "zz"
    assert len(normalized) == 200
    segment = sanitize_release_segment(release_id)
    assert segment == normalized[:31].rstrip("_") + "_" + _tail(normalized)
    assert segment == "ab_ab_ab_ab_ab_ab_ab_ab_ab_ab_a_" + _tail(normalized)
    assert len(segment) == 40


def test_sanitize_release_segment_strips_underscores_before_the_tail() -> None:
    """When the 31-char cut lands on underscores they are stripped before '_<hash>'."""
    release_id = "a" * 30 + "___" + "b" * 20
    segment = sanitize_release_segment(release_id)
    assert segment == "a" * 30 + "_" + _tail(release_id)
    assert segment == "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa_9be8b8a4"
    assert "__" not in segment
    # A punctuation run at the cut folds to one '_' first, then is stripped the same way.
    punctuated = "a" * 30 + "-.-" + "b" * 20
    assert sanitize_release_segment(punctuated) == "a" * 30 + "_" + _tail("a" * 30 + "_" + "b" * 20)


def test_sanitize_release_segment_hash_covers_the_normalized_id() -> None:
    """The tail hashes the normalized id, so case and punctuation variants agree."""
    upper = "MAIN-" + SHA.upper()
    assert sanitize_release_segment(upper) == sanitize_release_segment(PROD_SLUG)
    assert sanitize_release_segment(f" {PROD_SLUG}. ") == PROD_WORKER_ID
    assert PROD_WORKER_ID.endswith(_tail(f"main_{SHA}"))


def test_sanitize_release_segment_long_ids_differing_past_the_cut_differ() -> None:
    """Two long ids sharing the readable head still get different segments."""
    first = sanitize_release_segment("release-" + "x" * 40 + "-one")
    second = sanitize_release_segment("release-" + "x" * 40 + "-two")
    assert first != second
    assert first[:32] == second[:32]


def test_sanitize_release_segment_unicode_length_counts_after_folding() -> None:
    """Non-ASCII chars fold before the length check, so 39 ASCII chars + emoji stay short."""
    assert sanitize_release_segment("a" * 39 + "🚀🚀🚀🚀") == "a" * 39
    assert sanitize_release_segment("a" * 20 + "é" * 30 + "b" * 19) == "a" * 20 + "_" + "b" * 19


# --- current_release_id -------------------------------------------------------------------


def test_current_release_id_defaults_to_dev() -> None:
    """Neither a suffix nor a deploy version: the dev lane."""
    assert current_release_id({}) == "dev"
    assert current_release_id({DEPLOY: "", SUFFIX: ""}) == "dev"
    assert current_release_id({DEPLOY: "   ", SUFFIX: "   "}) == "dev"
    assert current_release_id({SCHEMA: "pr_1"}) == "dev"


def test_current_release_id_suffix_outranks_deploy_version() -> None:
    """A queue suffix gives dev-<suffix> even when a deploy version is baked in."""
    assert current_release_id({SUFFIX: "WT-1", DEPLOY: PROD_SLUG}) == "dev-wt_1"
    assert current_release_id({SUFFIX: "wt1"}) == "dev-wt1"


def test_current_release_id_suffix_outranks_a_garbage_deploy_version() -> None:
    """With a suffix set, a deploy version that sanitizes to nothing is never consulted."""
    assert current_release_id({SUFFIX: "wt1", DEPLOY: "---"}) == "dev-wt1"


def test_current_release_id_suffix_that_normalizes_to_empty_falls_through() -> None:
    """A suffix of only punctuation is no suffix: the deploy version decides."""
    assert current_release_id({SUFFIX: "---", DEPLOY: "v2"}) == "v2"
    assert current_release_id({SUFFIX: "!!!"}) == "dev"


def test_current_release_id_sanitizes_the_deploy_version() -> None:
    """A production deploy version gives its sanitized (hashed when long) segment."""
    assert current_release_id({DEPLOY: PROD_SLUG}) == PROD_WORKER_ID
    assert current_release_id({DEPLOY: "  V1.2  "}) == "v1_2"


@pytest.mark.parametrize("garbage", ["---", "!!!", "é", "🚀", "发布", " - . - "])
def test_current_release_id_garbage_deploy_version_raises(garbage: str) -> None:
    """A deploy version that sanitizes to nothing raises LaneConfigError naming the variable."""
    with pytest.raises(LaneConfigError) as caught:
        current_release_id({DEPLOY: garbage})
    assert caught.value.variable == DEPLOY
    assert DEPLOY in str(caught.value)
    assert isinstance(caught.value, ValueError)


# --- launch_release_id --------------------------------------------------------------------


def test_launch_release_id_precedence() -> None:
    """Suffix gives dev-<suffix>; else the raw trimmed deploy version; else dev."""
    assert launch_release_id({}) == "dev"
    assert launch_release_id({DEPLOY: "   "}) == "dev"
    assert launch_release_id({DEPLOY: f"  {PROD_SLUG} "}) == PROD_SLUG
    assert launch_release_id({DEPLOY: "Main-ABC"}) == "Main-ABC"
    assert launch_release_id({SUFFIX: "WT-1", DEPLOY: PROD_SLUG}) == "dev-wt_1"
    assert launch_release_id({SUFFIX: "---", DEPLOY: PROD_SLUG}) == PROD_SLUG


def test_launch_release_id_does_not_validate_the_raw_slug() -> None:
    """The raw slug is stamped as is; only deriving its queue refuses garbage."""
    assert launch_release_id({DEPLOY: "---"}) == "---"
    with pytest.raises(LaneConfigError):
        queue_name_for_release("---")


# --- the two spellings of one production lane --------------------------------------------


def test_production_lane_two_spellings_share_one_queue() -> None:
    """The raw launch slug and the sanitized worker id of a main-<sha> release share a queue."""
    env = {DEPLOY: PROD_SLUG}
    raw = launch_release_id(env)
    worker = current_release_id(env)
    assert raw == PROD_SLUG
    assert worker == PROD_WORKER_ID
    assert raw != worker
    assert queue_name_for_release(raw) == queue_name_for_release(worker) == PROD_QUEUE
    assert_release_lane_matches("run-1", raw, worker)
    assert_release_lane_matches("run-1", worker, raw)
    assert isinstance(
        resolve_lane_disposition(
            run_id="run-1",
            run_release_id=raw,
            worker_release_id=worker,
            lane_claiming=True,
            parked_in_adoptable_wait=False,
        ),
        Own,
    )


@pytest.mark.parametrize(
    ("deploy_version", "launch_queue", "worker_queue"),
    [
        ("dev-foo", "runs_foo", "runs_dev_foo"),
        ("DEV", "runs_dev", "runs"),
        ("-dev-", "runs_dev", "runs"),
    ],
)
def test_deploy_version_spelled_like_a_dev_lane_splits_in_the_reference(
    deploy_version: str, launch_queue: str, worker_queue: str
) -> None:
    """A dev-spelled deploy version maps its launch slug and worker id to two queues.

    This is the reference's behaviour and the lane rules keep it byte for byte; the boot
    guard (worker.config) refuses such a deploy version instead, naming the variable.
    """
    env = {DEPLOY: deploy_version}
    assert queue_name_for_release(launch_release_id(env)) == launch_queue
    assert queue_name_for_release(current_release_id(env)) == worker_queue
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env({**env, "WORKFLOW_RUNTIME_POSTGRES": "postgresql://x"})
    assert caught.value.variable == DEPLOY


# --- queue_name_for_release ---------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
def test_queue_name_for_release_blank_raises(blank: str) -> None:
    """An empty or blank release id names no lane and raises LaneConfigError."""
    with pytest.raises(LaneConfigError):
        queue_name_for_release(blank)


def test_queue_name_for_release_none_raises() -> None:
    """A missing release id raises LaneConfigError rather than landing on runs."""
    with pytest.raises(LaneConfigError):
        queue_name_for_release(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("garbage", ["---", "!!!", "é", "🚀", "发布", "  --  "])
def test_queue_name_for_release_garbage_raises(garbage: str) -> None:
    """A release id that sanitizes to nothing raises LaneConfigError."""
    with pytest.raises(LaneConfigError):
        queue_name_for_release(garbage)


@pytest.mark.parametrize(
    ("release_id", "queue"),
    [
        ("dev", "runs"),
        (" dev ", "runs"),
        ("\tdev\n", "runs"),
        ("dev-", "runs"),
        (" dev- ", "runs"),
        ("dev----", "runs"),
        ("dev-!!!", "runs"),
        ("dev-FOO", "runs_foo"),
        ("dev-Feature/X", "runs_feature_x"),
        ("dev--x", "runs_x"),
        ("dev-" + "a" * 40, "runs_" + "a" * 32),
        ("DEV", "runs_dev"),
        ("Dev-foo", "runs_dev_foo"),
        ("devx", "runs_devx"),
        ("dev_foo", "runs_dev_foo"),
        ("v1", "runs_v1"),
        (" Main-ABC ", "runs_main_abc"),
        ("café", "runs_caf"),
        ("İ", "runs_i"),
        (PROD_SLUG, PROD_QUEUE),
        (PROD_WORKER_ID, PROD_QUEUE),
    ],
)
def test_queue_name_for_release_examples(release_id: str, queue: str) -> None:
    """dev maps to runs, dev-<x> to runs_<normalized x>, anything else to runs_<segment>."""
    assert queue_name_for_release(release_id) == queue


def test_queue_name_for_release_overlong_ids() -> None:
    """Ids of 40, 41 and 200 chars give queues of runs_ + at most 40 chars."""
    assert queue_name_for_release("q" * 40) == "runs_" + "q" * 40
    assert queue_name_for_release("q" * 41) == "runs_" + "q" * 31 + "_" + _tail("q" * 41)
    long_queue = queue_name_for_release("Q" * 200)
    assert long_queue == "runs_" + "q" * 31 + "_" + _tail("q" * 200)
    assert len(long_queue.encode("utf-8")) == 45


# --- release_id_for_suffix ----------------------------------------------------------------


def test_release_id_for_suffix_explicit_suffix_wins() -> None:
    """A non-blank explicit suffix gives dev-<normalized suffix>, whatever the env says."""
    env = {SUFFIX: "env-wt", DEPLOY: PROD_SLUG}
    assert release_id_for_suffix("PR-42", env) == "dev-pr_42"
    assert release_id_for_suffix("  pr42  ", {}) == "dev-pr42"


@pytest.mark.parametrize("blank", [None, "", "   ", "\n"])
def test_release_id_for_suffix_blank_explicit_falls_back_to_env(blank: str | None) -> None:
    """A missing or blank explicit suffix falls back to the env suffix, then the env release."""
    assert release_id_for_suffix(blank, {SUFFIX: "Env-WT"}) == "dev-env_wt"
    assert release_id_for_suffix(blank, {DEPLOY: PROD_SLUG}) == PROD_WORKER_ID
    assert release_id_for_suffix(blank, {}) == "dev"


def test_release_id_for_suffix_punctuation_only_explicit_does_not_use_env_suffix() -> None:
    """A non-blank explicit suffix that normalizes to '' gives current_release_id(env)."""
    assert release_id_for_suffix("---", {DEPLOY: PROD_SLUG}) == PROD_WORKER_ID
    assert release_id_for_suffix("---", {}) == "dev"
    env = {SUFFIX: "env-wt", DEPLOY: PROD_SLUG}
    assert release_id_for_suffix("---", env) == current_release_id(env)


def test_release_id_for_suffix_garbage_deploy_version_raises() -> None:
    """With no suffix anywhere the env release decides, so a garbage deploy version raises."""
    with pytest.raises(LaneConfigError) as caught:
        release_id_for_suffix(None, {DEPLOY: "!!!"})
    assert caught.value.variable == DEPLOY


# --- release_id_for_launch / queue_name_for_launch ----------------------------------------


def test_release_id_for_launch_uses_the_trimmed_stamp() -> None:
    """A stamped launch row rides its stamp (trimmed), not this process's lane."""
    env = {SUFFIX: "wt1"}
    assert release_id_for_launch({"absurdReleaseId": f" {PROD_SLUG} "}, env) == PROD_SLUG
    assert release_id_for_launch({"absurdReleaseId": "dev"}, env) == "dev"


@pytest.mark.parametrize(
    "launch",
    [
        {},
        {"absurdReleaseId": None},
        {"absurdReleaseId": ""},
        {"absurdReleaseId": "   "},
        {"other": "x"},
    ],
)
def test_release_id_for_launch_unstamped_falls_back(launch: dict[str, object]) -> None:
    """A missing, None or blank stamp falls back to current_release_id(env)."""
    assert release_id_for_launch(launch, {}) == "dev"
    assert release_id_for_launch(launch, {SUFFIX: "wt1"}) == "dev-wt1"
    assert release_id_for_launch(launch, {DEPLOY: PROD_SLUG}) == PROD_WORKER_ID


def test_release_id_for_launch_non_string_stamp_raises() -> None:
    """A stamp that is not a string is a corrupt launch row and raises LaneConfigError."""
    with pytest.raises(LaneConfigError):
        release_id_for_launch({"absurdReleaseId": 42}, {})


def test_queue_name_for_launch() -> None:
    """The launch queue is the queue of the launch row's release."""
    assert queue_name_for_launch({"absurdReleaseId": PROD_SLUG}, {}) == PROD_QUEUE
    assert queue_name_for_launch({"absurdReleaseId": "dev-WT1"}, {}) == "runs_wt1"
    assert queue_name_for_launch({}, {}) == "runs"
    assert queue_name_for_launch({}, {SUFFIX: "wt1"}) == "runs_wt1"
    assert queue_name_for_launch({"absurdReleaseId": "  "}, {DEPLOY: PROD_SLUG}) == PROD_QUEUE
    with pytest.raises(LaneConfigError):
        queue_name_for_launch({"absurdReleaseId": "---"}, {})


# --- runs_queue_for_suffix / is_runs_queue / continuation_worker_id -----------------------


def test_runs_queue_for_suffix() -> None:
    """runs or runs_<effective suffix>; a punctuation-only explicit suffix gives runs."""
    assert runs_queue_for_suffix(None, {}) == "runs"
    assert runs_queue_for_suffix("", {SUFFIX: "Env-WT"}) == "runs_env_wt"
    assert runs_queue_for_suffix("   ", {SUFFIX: "Env-WT"}) == "runs_env_wt"
    assert runs_queue_for_suffix(None, {SUFFIX: "Env-WT"}) == "runs_env_wt"
    assert runs_queue_for_suffix("PR-1", {SUFFIX: "Env-WT"}) == "runs_pr_1"
    assert runs_queue_for_suffix("---", {SUFFIX: "Env-WT"}) == "runs"
    assert runs_queue_for_suffix("é🚀", {}) == "runs"
    assert runs_queue_for_suffix("x" * 100, {}) == "runs_" + "x" * 32


def test_runs_queue_for_suffix_ignores_deploy_version() -> None:
    """The suffix queue does not look at the deploy version at all."""
    assert runs_queue_for_suffix(None, {DEPLOY: PROD_SLUG}) == "runs"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("runs", True),
        ("runs_", True),
        ("runs_wt1", True),
        (PROD_QUEUE, True),
        ("", False),
        ("run", False),
        ("runsx", False),
        ("Runs", False),
        ("RUNS_x", False),
        (" runs", False),
        ("runs-x", False),
        ("other_runs", False),
    ],
)
def test_is_runs_queue(name: str, expected: bool) -> None:
    """A runs lane is exactly runs or starts with runs_."""
    assert is_runs_queue(name) is expected


def test_continuation_worker_id() -> None:
    """The continuation worker id is <base>:<queue>:continuations."""
    assert continuation_worker_id("host-1", "runs_v1") == "host-1:runs_v1:continuations"
    assert continuation_worker_id("", "runs") == ":runs:continuations"
    assert continuation_worker_id("w", "runs").endswith(lanes.CONTINUATION_WORKER_SUFFIX)


# --- assert_release_lane_matches ----------------------------------------------------------


def test_assert_release_lane_matches_equal_ids() -> None:
    """Equal ids pass, including ids of the dev lane and its suffixed form."""
    assert_release_lane_matches("r", "dev", "dev")
    assert_release_lane_matches("r", "dev-wt1", "dev-wt1")
    assert_release_lane_matches("r", PROD_SLUG, PROD_SLUG)


def test_assert_release_lane_matches_same_queue_different_spelling() -> None:
    """Different spellings of one queue pass."""
    assert_release_lane_matches("r", "dev", "dev-")
    assert_release_lane_matches("r", "dev-WT1", "dev-wt1")
    assert_release_lane_matches("r", "V1.2", "v1_2")
    assert_release_lane_matches("r", PROD_SLUG, PROD_WORKER_ID)


def test_assert_release_lane_matches_mismatch_message() -> None:
    """A mismatch raises LaneMismatchError naming the run, both ids and the remedy queue."""
    with pytest.raises(LaneMismatchError) as caught:
        assert_release_lane_matches("run-42", PROD_SLUG, "v2")
    error = caught.value
    message = str(error)
    assert isinstance(error, ValueError)
    assert "run-42" in message
    assert PROD_SLUG in message
    assert "v2" in message
    assert PROD_QUEUE in message
    assert (error.run_id, error.run_release_id, error.worker_release_id) == (
        "run-42",
        PROD_SLUG,
        "v2",
    )


def test_assert_release_lane_matches_dev_vs_suffix_mismatch() -> None:
    """The dev lane and a suffixed dev lane are different lanes."""
    with pytest.raises(LaneMismatchError) as caught:
        assert_release_lane_matches("run-1", "dev-wt1", "dev")
    assert "runs_wt1" in str(caught.value)


# --- resolve_lane_disposition -------------------------------------------------------------


def _resolve(run: str, worker: str, *, claiming: bool, parked: bool) -> lanes.LaneDisposition:
    return resolve_lane_disposition(
        run_id="run-7",
        run_release_id=run,
        worker_release_id=worker,
        lane_claiming=claiming,
        parked_in_adoptable_wait=parked,
    )


@pytest.mark.parametrize("claiming", [True, False])
@pytest.mark.parametrize("parked", [True, False])
def test_disposition_own_for_same_lane(claiming: bool, parked: bool) -> None:
    """Same id or same queue is Own whatever the store says."""
    for run, worker in [("v1", "v1"), (PROD_SLUG, PROD_WORKER_ID), ("dev", "dev-")]:
        result = _resolve(run, worker, claiming=claiming, parked=parked)
        assert result == Own()
        assert result.kind == "own"


@pytest.mark.parametrize("parked", [True, False])
def test_disposition_refuse_when_lane_claims(parked: bool) -> None:
    """A foreign lane that still claims is refused."""
    result = _resolve("v1", "v2", claiming=True, parked=parked)
    assert result == Refuse()
    assert result.kind == "refuse"


def test_disposition_defer_when_not_parked() -> None:
    """A retired lane's run that is not parked is deferred 30 s with a reason."""
    result = _resolve("v1", "v2", claiming=False, parked=False)
    assert isinstance(result, Defer)
    assert result.kind == "defer"
    assert result.delay_seconds == 30 == lanes.LANE_ADOPTION_DEFER_SECONDS
    assert "run-7" in result.reason
    assert "v1" in result.reason


def test_disposition_adopt_when_parked_on_retired_lane() -> None:
    """A retired lane's parked run is adopted, recording the run's release."""
    result = _resolve(PROD_SLUG, "v2", claiming=False, parked=True)
    assert result == Adopt(adopted_release_id=PROD_SLUG)
    assert isinstance(result, Adopt)
    assert result.kind == "adopt"
    assert result.adopted_release_id == PROD_SLUG


@pytest.mark.parametrize(
    "value",
    [Own(), Refuse(), Defer(reason="r"), Adopt(adopted_release_id="v1")],
)
def test_dispositions_are_frozen(value: object) -> None:
    """Every disposition is a frozen dataclass: assigning any field raises."""
    assert dataclasses.is_dataclass(value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.kind = "other"  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.extra = 1  # type: ignore[attr-defined]


def test_disposition_kind_is_not_an_init_argument() -> None:
    """The kind strings are fixed and cannot be overridden at construction."""
    assert Defer(reason="x").kind == "defer"
    assert Defer(reason="x", delay_seconds=5).delay_seconds == 5
    with pytest.raises(TypeError):
        Own(kind="adopt")  # type: ignore[call-arg]


# --- adoption_queues ----------------------------------------------------------------------


def test_adoption_queues_sorted_deduplicated_without_own() -> None:
    """Queues of adoptable ids, deduplicated across spellings, sorted, own queue removed."""
    result = adoption_queues(
        "v3",
        ["v2", "V2", " v2 ", PROD_SLUG, PROD_WORKER_ID, "v3", "V3.", "dev-WT1", "a1"],
    )
    assert result == sorted(["runs_v2", PROD_QUEUE, "runs_wt1", "runs_a1"])
    assert result == ["runs_a1", PROD_QUEUE, "runs_v2", "runs_wt1"]


def test_adoption_queues_skips_blank_ids() -> None:
    """None, empty and blank ids are skipped instead of raising."""
    assert adoption_queues("v3", [None, "", "   ", "\n", "v1"]) == ["runs_v1"]
    assert adoption_queues("v3", []) == []


def test_adoption_queues_own_queue_under_another_spelling() -> None:
    """The worker's own lane given under its raw slug spelling is still removed."""
    assert adoption_queues(PROD_WORKER_ID, [PROD_SLUG, f" {PROD_SLUG.upper()} "]) == []
    assert adoption_queues(PROD_SLUG, [PROD_WORKER_ID]) == []


def test_adoption_queues_dev_collapse_attaches_nothing() -> None:
    """A dev-collapse worker whose runs are all stamped dev attaches no continuation loop."""
    assert adoption_queues("dev", ["dev", "dev", " dev ", "dev-"]) == []
    assert adoption_queues("dev-wt1", ["dev-wt1", "dev-WT1"]) == []


def test_adoption_queues_accepts_any_iterable() -> None:
    """A generator of ids works as well as a list."""
    assert adoption_queues("v3", (x for x in ["v1", "v2"])) == ["runs_v1", "runs_v2"]


# --- env handling: the given mapping wins, None means os.environ -------------------------

_CONFLICTING_OS_ENV = {SUFFIX: "from-os", DEPLOY: "os-release", SCHEMA: "os_schema"}


def _set_os_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _CONFLICTING_OS_ENV.items():
        monkeypatch.setenv(name, value)


def test_env_dict_wins_over_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every env-taking function reads only the given mapping when one is passed."""
    _set_os_env(monkeypatch)
    env = {DEPLOY: PROD_SLUG, SCHEMA: "pr_1"}
    assert queue_suffix_from_env(env) == ""
    assert queue_suffix_for_schema("pr_1", env) == ""
    assert queue_suffix_for_schema("os_schema", env) == _schema_suffix("os_schema")
    assert current_release_id(env) == PROD_WORKER_ID
    assert launch_release_id(env) == PROD_SLUG
    assert release_id_for_suffix(None, env) == PROD_WORKER_ID
    assert release_id_for_suffix("---", env) == PROD_WORKER_ID
    assert release_id_for_launch({}, env) == PROD_WORKER_ID
    assert queue_name_for_launch({}, env) == PROD_QUEUE
    assert runs_queue_for_suffix(None, env) == "runs"


def test_empty_env_dict_is_not_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty mapping is an empty environment, not a request for os.environ."""
    _set_os_env(monkeypatch)
    assert queue_suffix_from_env({}) == ""
    assert queue_suffix_for_schema(None, {}) == ""
    assert queue_suffix_for_schema("os_schema", {}) == _schema_suffix("os_schema")
    assert current_release_id({}) == "dev"
    assert launch_release_id({}) == "dev"
    assert release_id_for_suffix(None, {}) == "dev"
    assert release_id_for_launch({}, {}) == "dev"
    assert queue_name_for_launch({}, {}) == "runs"
    assert runs_queue_for_suffix(None, {}) == "runs"


def test_env_any_mapping_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only Mapping works as env, and still beats os.environ."""
    _set_os_env(monkeypatch)
    env = types.MappingProxyType({SUFFIX: "Proxy"})
    assert queue_suffix_from_env(env) == "proxy"
    assert current_release_id(env) == "dev-proxy"
    assert runs_queue_for_suffix(env=env) == "runs_proxy"


def test_env_none_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """With env omitted every function reads os.environ."""
    _set_os_env(monkeypatch)
    assert os.environ[SUFFIX] == "from-os"
    assert queue_suffix_from_env() == "from_os"
    assert queue_suffix_for_schema("os_schema") == "from_os"
    assert queue_suffix_for_schema("pr_1") == _schema_suffix("pr_1")
    assert current_release_id() == "dev-from_os"
    assert launch_release_id() == "dev-from_os"
    assert release_id_for_suffix() == "dev-from_os"
    assert release_id_for_suffix("PR-2") == "dev-pr_2"
    assert release_id_for_launch({}) == "dev-from_os"
    assert queue_name_for_launch({}) == "runs_from_os"
    assert runs_queue_for_suffix() == "runs_from_os"


def test_env_none_reads_deploy_version_from_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a suffix in os.environ the deploy version there decides."""
    _clear_lane_env(monkeypatch)
    monkeypatch.setenv(DEPLOY, PROD_SLUG)
    assert current_release_id() == PROD_WORKER_ID
    assert launch_release_id() == PROD_SLUG
    assert release_id_for_suffix("---") == PROD_WORKER_ID
    assert release_id_for_launch({"absurdReleaseId": None}) == PROD_WORKER_ID
    assert queue_name_for_launch({}) == PROD_QUEUE
    monkeypatch.setenv(DEPLOY, "!!!")
    with pytest.raises(LaneConfigError) as caught:
        current_release_id()
    assert caught.value.variable == DEPLOY


def test_env_none_with_clean_os_environ_is_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no lane variables in os.environ everything resolves to the dev lane."""
    _clear_lane_env(monkeypatch)
    assert queue_suffix_from_env() == ""
    assert current_release_id() == "dev"
    assert launch_release_id() == "dev"
    assert runs_queue_for_suffix() == "runs"
    assert queue_name_for_launch({}) == "runs"
