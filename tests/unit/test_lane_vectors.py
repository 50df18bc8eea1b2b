"""Lane and checkpoint rules against vectors produced by the reference TypeScript module.

The vectors live in ``data/lane_vectors.json``; ``data/README.md`` says how they were made.
A vector marked with a ``divergence`` is one where the reference's JavaScript semantics and
DESIGN.md's Python rule (``str.strip()`` trimming, dict lookups, dict key order, integers beyond
a JS number) disagree: it carries both outcomes, and Python is held to ``design_rule``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from worker import checkpoint, lanes
from worker.errors import LaneConfigError, LaneMismatchError, UnknownBoundaryError

VECTORS_PATH = Path(__file__).parent / "data" / "lane_vectors.json"

ERRORS: dict[str, type[ValueError]] = {
    "LaneConfigError": LaneConfigError,
    "LaneMismatchError": LaneMismatchError,
    "UnknownBoundaryError": UnknownBoundaryError,
}


def _decode_nonfinite(obj: dict[str, Any]) -> Any:
    """Turn ``{"$float": "NaN"}`` (JSON has no NaN or Infinity) back into a float."""
    if obj.keys() == {"$float"}:
        return float(obj["$float"])
    return obj


def _disposition(**kwargs: Any) -> dict[str, Any]:
    """Reduce a disposition to the fields the vectors record."""
    disposition = lanes.resolve_lane_disposition(**kwargs)
    observed: dict[str, Any] = {"kind": disposition.kind}
    for name in ("adopted_release_id", "delay_seconds"):
        if hasattr(disposition, name):
            observed[name] = getattr(disposition, name)
    return observed


CALLS: dict[str, Callable[..., Any]] = {
    "normalize_queue_suffix": lanes.normalize_queue_suffix,
    "queue_suffix_from_env": lanes.queue_suffix_from_env,
    "is_isolated_schema": lanes.is_isolated_schema,
    "worker_requires_queue_suffix": lanes.worker_requires_queue_suffix,
    "queue_suffix_for_schema": lanes.queue_suffix_for_schema,
    "sanitize_release_segment": lanes.sanitize_release_segment,
    "current_release_id": lanes.current_release_id,
    "launch_release_id": lanes.launch_release_id,
    "queue_name_for_release": lanes.queue_name_for_release,
    "release_id_for_suffix": lanes.release_id_for_suffix,
    "release_id_for_launch": lanes.release_id_for_launch,
    "queue_name_for_launch": lanes.queue_name_for_launch,
    "runs_queue_for_suffix": lanes.runs_queue_for_suffix,
    "is_runs_queue": lanes.is_runs_queue,
    "assert_release_lane_matches": lanes.assert_release_lane_matches,
    "continuation_worker_id": lanes.continuation_worker_id,
    "resolve_lane_disposition": _disposition,
    "adoption_queues": lanes.adoption_queues,
    "integration_event_name": checkpoint.integration_event_name,
    "runner_terminal_event_name": checkpoint.runner_terminal_event_name,
    "integration_event_boundary_output": checkpoint.integration_event_boundary_output,
    "checkpoint_base": checkpoint.checkpoint_base,
    "boundary_resolved": checkpoint.boundary_resolved,
    "checkpoint_with_sleep": checkpoint.checkpoint_with_sleep,
    "checkpoint_with_integration_event": checkpoint.checkpoint_with_integration_event,
    "terminal_ledger_event": checkpoint.terminal_ledger_event,
}


def _load() -> dict[str, list[dict[str, Any]]]:
    """Read the vectors file, without its ``_meta`` entry."""
    text = VECTORS_PATH.read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text, object_hook=_decode_nonfinite)
    data.pop("_meta")
    return data


VECTORS = _load()


def _params(*, divergent: bool) -> list[Any]:
    """One pytest param per vector, with an id naming the function, index and arguments."""
    params = []
    for fn, vectors in VECTORS.items():
        for index, vector in enumerate(vectors):
            if ("divergence" in vector) != divergent:
                continue
            shown = json.dumps(list(vector["args"].values()), ensure_ascii=True)
            label = f"{fn}-{index}-{shown[:48]}"
            params.append(pytest.param(fn, vector, id=label))
    return params


def _check(fn: str, args: dict[str, Any], expected: dict[str, Any]) -> None:
    """Call ``fn`` with ``args`` and compare with one recorded outcome."""
    call = CALLS[fn]
    if expected.get("error"):
        with pytest.raises(ERRORS[expected["error_type"]]) as caught:
            call(**args)
        _check_error_details(fn, args, caught.value)
        return
    result = call(**args)
    assert result == expected["result"]
    if isinstance(expected["result"], bool):
        assert isinstance(result, bool)
    if "key_order" in expected:
        assert list(result) == expected["key_order"]


def _check_error_details(fn: str, args: dict[str, Any], error: Exception) -> None:
    """Check what DESIGN.md says an error must name."""
    if fn == "current_release_id":
        assert lanes.RELEASE_ID_ENV in str(error)
    if isinstance(error, LaneMismatchError):
        assert error.run_id == args["run_id"]
        assert error.run_release_id == args["run_release_id"]
        assert error.worker_release_id == args["worker_release_id"]
        assert lanes.queue_name_for_release(args["run_release_id"]) in str(error)


def test_vectors_cover_every_function() -> None:
    """Keep the vectors file and this module's function table in step."""
    assert set(VECTORS) == set(CALLS)
    assert all(VECTORS.values())


@pytest.mark.parametrize(("fn", "vector"), _params(divergent=False))
def test_vector_matches_reference(fn: str, vector: dict[str, Any]) -> None:
    """Produce the reference module's result (or error) for these arguments."""
    _check(fn, vector["args"], vector)


@pytest.mark.parametrize(("fn", "vector"), _params(divergent=True))
def test_divergent_vector_follows_design_rule(fn: str, vector: dict[str, Any]) -> None:
    """Where JS and Python semantics split, follow DESIGN.md's Python rule (see the note)."""
    _check(fn, vector["args"], vector["design_rule"])
