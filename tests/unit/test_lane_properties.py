"""Property tests of the lane rules and the checkpoint envelope (hypothesis)."""

from __future__ import annotations

import copy
import random
import re
import string
from collections import defaultdict
from typing import Any

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from worker.checkpoint import checkpoint_base
from worker.errors import LaneConfigError
from worker.lanes import (
    Adopt,
    Defer,
    Own,
    Refuse,
    current_release_id,
    normalize_queue_suffix,
    queue_name_for_release,
    resolve_lane_disposition,
    runs_queue_for_suffix,
    sanitize_release_segment,
)

SUFFIX = "DEEPLINE_ABSURD_QUEUE_SUFFIX"
DEPLOY = "DEEPLINE_RUNTIME_DEPLOY_VERSION"
SCHEMA = "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"
QUEUE_PATTERN = re.compile(r"runs(_[a-z0-9_]+)?")
QUEUE_MAX_BYTES = 57

SEPARATORS = " -./:@+~!#$%^&*()[]{}|;,<>?=\t\u00e9\u6f22\U0001f600"
WORD_CHARS = string.ascii_letters + string.digits + "_"

FAST = settings(max_examples=300, deadline=None)
SLOW = settings(max_examples=150, deadline=None)


def _assert_valid_queue(queue: str) -> None:
    assert len(queue.encode("utf-8")) <= QUEUE_MAX_BYTES, queue
    assert QUEUE_PATTERN.fullmatch(queue), queue


def _normal_form(release_id: str) -> str:
    """The DESIGN normal form before truncation: trim, lowercase, fold, strip '_'."""
    return re.sub(r"[^a-z0-9_]+", "_", release_id.strip().lower()).strip("_")


def _is_dev_spelled(release_id: str) -> bool:
    trimmed = release_id.strip()
    return trimmed == "dev" or trimmed.startswith("dev-")


# --- strategies ---------------------------------------------------------------------------

words = st.text(alphabet=WORD_CHARS, min_size=1, max_size=12)
separator_runs = st.text(alphabet=SEPARATORS, min_size=1, max_size=3)
edge_runs = st.text(alphabet=SEPARATORS, max_size=3)


@st.composite
def structured_ids(draw: st.DrawFn) -> str:
    """Release-id-like strings: word tokens joined by separator runs, padded by separators."""
    tokens = draw(st.lists(words, min_size=1, max_size=12))
    joined = tokens[0]
    for token in tokens[1:]:
        joined += draw(separator_runs) + token
    return draw(edge_runs) + joined + draw(edge_runs)


release_ids = st.one_of(
    st.text(max_size=80),
    structured_ids(),
    st.builds(lambda tail: "dev-" + tail, st.text(max_size=60)),
    st.sampled_from(["dev", " dev ", "dev-", "DEV", "main-" + "ab" * 20]),
)


def _variant(rng: random.Random, release_id: str) -> str:
    """The same id with ASCII case flipped and every separator run swapped for another."""
    pieces = re.split(r"([^A-Za-z0-9_]+)", release_id)
    out = []
    for index, piece in enumerate(pieces):
        if index % 2:
            out.append("".join(rng.choice(SEPARATORS) for _ in range(rng.randint(1, 3))))
        else:
            out.append("".join(c.swapcase() if rng.random() < 0.5 else c for c in piece))
    text = "".join(out)
    if rng.random() < 0.5:
        text = rng.choice(SEPARATORS) + text + rng.choice(SEPARATORS)
    return text


# --- queue names always fit the engine ----------------------------------------------------


@FAST
@given(release_ids)
@example("a" * 41)
@example("dev-" + "b" * 200)
@example("\u0130" * 50)
def test_queue_name_for_release_is_a_valid_engine_queue(release_id: str) -> None:
    """Any release id that does not raise gives runs(_[a-z0-9_]+)? within 57 bytes."""
    try:
        queue = queue_name_for_release(release_id)
    except LaneConfigError:
        assert not sanitize_release_segment(release_id) or not release_id.strip()
        return
    _assert_valid_queue(queue)


@FAST
@given(st.one_of(st.none(), st.text(max_size=80), structured_ids()), st.text(max_size=40))
def test_runs_queue_for_suffix_is_a_valid_engine_queue(suffix: str | None, env_suffix: str) -> None:
    """Any explicit suffix (or none, with any env suffix) gives a valid engine queue."""
    _assert_valid_queue(runs_queue_for_suffix(suffix, env={}))
    _assert_valid_queue(runs_queue_for_suffix(suffix, env={SUFFIX: env_suffix}))


lane_envs = st.fixed_dictionaries(
    {},
    optional={
        SUFFIX: st.one_of(st.text(max_size=50), structured_ids()),
        DEPLOY: st.one_of(st.text(max_size=120), structured_ids()),
        SCHEMA: st.text(max_size=20),
    },
)


@FAST
@given(lane_envs)
def test_current_release_id_gives_a_valid_engine_queue(env: dict[str, str]) -> None:
    """Over random environments the worker's lane id maps to a valid engine queue."""
    try:
        release_id = current_release_id(env)
    except LaneConfigError as refused:
        refusal: LaneConfigError | None = refused
    else:
        refusal = None
        _assert_valid_queue(queue_name_for_release(release_id))
    if refusal is not None:
        assert refusal.variable == DEPLOY
        assert not sanitize_release_segment(env[DEPLOY])


# --- idempotence --------------------------------------------------------------------------


@FAST
@given(st.one_of(st.text(max_size=80), structured_ids()))
@example("a" * 31 + "-b")
def test_normalize_queue_suffix_is_idempotent(raw: str) -> None:
    """Normalizing twice changes nothing, except the reference's trailing '_' at the cut.

    Stripping comes before the 32-char cut (DESIGN.md and the reference), so a cut that
    lands just after a separator leaves one '_' that a second pass strips; that is the
    only difference, and the lane queue itself (via the release id) is stable.
    """
    once = normalize_queue_suffix(raw)
    twice = normalize_queue_suffix(once)
    assert twice == once or (len(once) == 32 and once.endswith("_") and twice == once.rstrip("_"))
    assert normalize_queue_suffix(twice) == twice
    if once:
        lane = queue_name_for_release(f"dev-{once}")
        assert queue_name_for_release(f"dev-{twice}") == lane


@FAST
@given(st.one_of(st.text(max_size=120), structured_ids()))
@example("a" * 30 + "___" + "b" * 20)
def test_sanitize_release_segment_is_idempotent(release_id: str) -> None:
    """sanitize_release_segment(sanitize_release_segment(x)) == sanitize_release_segment(x)."""
    once = sanitize_release_segment(release_id)
    assert sanitize_release_segment(once) == once
    assert len(once) <= 40


# --- long ids: distinct normal forms never share a queue, variants always do -------------


def _long_id(rng: random.Random, head: str) -> str:
    """A release id starting with head, grown by random tokens until it is long."""
    text = head
    while True:
        token = "".join(rng.choice(WORD_CHARS) for _ in range(rng.randint(1, 8)))
        text += rng.choice(["", "-", ".", "/", " ", "_", "\u00e9"]) + token
        if len(_normal_form(text)) > 40 and rng.random() >= 0.3:
            return text


def _long_id_sample(rng: random.Random) -> list[str]:
    ids: list[str] = []
    # Many ids sharing a readable head, so only the hash tail can tell them apart.
    for _ in range(300):
        head = "".join(rng.choice(WORD_CHARS + "-.") for _ in range(rng.randint(34, 45)))
        ids.extend(_long_id(rng, head) for _ in range(40))
    # Plus independent ids, production slugs among them.
    for _ in range(4000):
        ids.append(_long_id(rng, rng.choice(["main-", "release/", "", "v"])))
    for _ in range(2000):
        ids.append("main-" + "".join(rng.choice("0123456789abcdef") for _ in range(40)))
    return [i for i in ids if len(_normal_form(i)) > 40 and not _is_dev_spelled(i)]


def test_long_ids_with_distinct_normal_forms_never_share_a_queue() -> None:
    """In ~18k long ids, two different normal forms never map to one queue."""
    rng = random.Random(20240601)  # noqa: S311  # seeded test data
    ids = _long_id_sample(rng)
    forms_by_queue: dict[str, set[str]] = defaultdict(set)
    heads: dict[str, set[str]] = defaultdict(set)
    for release_id in ids:
        form = _normal_form(release_id)
        queue = queue_name_for_release(release_id)
        _assert_valid_queue(queue)
        forms_by_queue[queue].add(form)
        heads[form[:31]].add(form)
    distinct_forms = {form for forms in forms_by_queue.values() for form in forms}
    assert len(ids) >= 15_000
    assert len(distinct_forms) >= 15_000
    # The sample really exercises the hash tail: many distinct forms share a head.
    assert sum(len(forms) for forms in heads.values() if len(forms) > 1) >= 10_000
    clashes = {queue: forms for queue, forms in forms_by_queue.items() if len(forms) > 1}
    assert clashes == {}


def test_long_id_case_and_punctuation_variants_share_a_queue() -> None:
    """Ids differing only in ASCII case or separator runs map to one queue."""
    rng = random.Random(7)  # noqa: S311  # seeded test data
    ids = _long_id_sample(rng)[:5000]
    checked = 0
    for release_id in ids:
        variant = _variant(rng, release_id)
        if _is_dev_spelled(variant):
            continue
        assert _normal_form(variant) == _normal_form(release_id)
        assert queue_name_for_release(variant) == queue_name_for_release(release_id)
        assert sanitize_release_segment(variant) == sanitize_release_segment(release_id)
        checked += 1
    assert checked >= 4900


@SLOW
@given(structured_ids(), st.randoms(use_true_random=False))
def test_case_and_punctuation_variants_share_a_queue(release_id: str, rng: random.Random) -> None:
    """For ids of any length, a case / separator variant maps to the same queue."""
    # Words may be all '_' (e.g. the id "_"): such an id names no queue at all.
    assume(_normal_form(release_id) != "")
    variant = _variant(rng, release_id)
    if _is_dev_spelled(release_id) or _is_dev_spelled(variant):
        return
    assert queue_name_for_release(variant) == queue_name_for_release(release_id)


# --- checkpoint_base ----------------------------------------------------------------------

KNOWN_KEYS = [
    "completedBatches",
    "completedToolBatches",
    "resolvedWaterfalls",
    "resolvedBoundaries",
    "durableCallCacheEpochMs",
    "mapFrames",
]
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=4),
    ),
    max_leaves=20,
)
checkpoints = st.dictionaries(
    st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=12)), json_values, max_size=8
)


@SLOW
@given(checkpoints)
def test_checkpoint_base_keeps_unknown_keys_and_never_mutates(checkpoint: dict[str, Any]) -> None:
    """Unknown keys keep their very values, known keys are valid, and the input is unchanged."""
    before = copy.deepcopy(checkpoint)
    base = checkpoint_base(checkpoint)
    assert checkpoint == before
    for key, value in checkpoint.items():
        if key not in KNOWN_KEYS:
            assert base[key] is value
    assert set(base) - set(KNOWN_KEYS) == set(checkpoint) - set(KNOWN_KEYS)
    for table in KNOWN_KEYS[:4]:
        assert base[table] is not None
        if checkpoint.get(table) is not None:
            assert base[table] is checkpoint[table]
    if "durableCallCacheEpochMs" in base:
        epoch = base["durableCallCacheEpochMs"]
        assert not isinstance(epoch, bool)
        assert isinstance(epoch, int | float)
        assert epoch >= 0
        assert epoch != float("inf")
    if "mapFrames" in base:
        assert isinstance(base["mapFrames"], dict)
        assert base["mapFrames"] is checkpoint["mapFrames"]


@SLOW
@given(checkpoints)
def test_checkpoint_base_is_idempotent(checkpoint: dict[str, Any]) -> None:
    """checkpoint_base(checkpoint_base(x)) == checkpoint_base(x)."""
    once = checkpoint_base(checkpoint)
    assert checkpoint_base(once) == once


@FAST
@given(json_values.filter(lambda value: not isinstance(value, dict)))
def test_checkpoint_base_non_dict_is_empty(value: object) -> None:
    """Any JSON value that is not an object gives the empty envelope."""
    assert checkpoint_base(value) == {key: {} for key in KNOWN_KEYS[:4]}


# --- resolve_lane_disposition -------------------------------------------------------------


@st.composite
def release_id_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """Two release ids that both name a queue; often two spellings of one lane."""
    first = draw(release_ids.filter(lambda value: bool(sanitize_release_segment(value))))
    how = draw(st.sampled_from(["variant", "sanitized", "independent", "same"]))
    if how == "variant":
        second = _variant(draw(st.randoms(use_true_random=False)), first)
    elif how == "sanitized":
        second = sanitize_release_segment(first)
    elif how == "same":
        second = first
    else:
        second = draw(release_ids)
    return first, second


@SLOW
@given(release_id_pairs(), st.booleans(), st.booleans())
def test_disposition_is_own_whenever_queues_match(
    pair: tuple[str, str], claiming: bool, parked: bool
) -> None:
    """Same queue means Own whatever the booleans; otherwise the booleans decide."""
    run_release_id, worker_release_id = pair
    try:
        run_queue = queue_name_for_release(run_release_id)
        worker_queue = queue_name_for_release(worker_release_id)
    except LaneConfigError:
        return
    result = resolve_lane_disposition(
        run_id="run-1",
        run_release_id=run_release_id,
        worker_release_id=worker_release_id,
        lane_claiming=claiming,
        parked_in_adoptable_wait=parked,
    )
    if run_queue == worker_queue:
        assert result == Own()
    elif claiming:
        assert result == Refuse()
    elif not parked:
        assert isinstance(result, Defer)
        assert result.delay_seconds == 30
    else:
        assert result == Adopt(adopted_release_id=run_release_id)
