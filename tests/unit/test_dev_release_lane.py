"""`lane-worker dev` serves a dev lane: a deploy version without a suffix is refused."""

from __future__ import annotations

import pytest

from worker.dev.mode import release_lane_refusal
from worker.errors import EXIT_CONFIG, exit_code_for

VERSION = "DEEPLINE_RUNTIME_DEPLOY_VERSION"
SUFFIX = "DEEPLINE_ABSURD_QUEUE_SUFFIX"


@pytest.mark.parametrize(
    "env",
    [{}, {VERSION: ""}, {VERSION: "  "}, {VERSION: "rel-42", SUFFIX: "wt"}, {SUFFIX: "wt"}],
)
def test_dev_serves_its_dev_lane(env: dict[str, str]) -> None:
    """Unset or blank (an env file's `NAME=`), or outranked by a suffix: a dev lane."""
    assert release_lane_refusal(env) is None


@pytest.mark.parametrize("env", [{VERSION: "rel-42"}, {VERSION: "rel-42", SUFFIX: " "}])
def test_a_leftover_deploy_version_is_refused_in_one_sentence(env: dict[str, str]) -> None:
    refusal = release_lane_refusal(env)
    assert refusal is not None
    assert exit_code_for(refusal) == EXIT_CONFIG
    said = str(refusal)
    assert said.startswith("lane-worker dev serves a dev lane, but ")
    assert "DEEPLINE_RUNTIME_DEPLOY_VERSION='rel-42'" in said
    assert "`lane-worker run`" in said
    assert said.count(". ") == 0
    assert said.endswith(".")
