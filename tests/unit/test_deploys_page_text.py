"""The /deploys timeline's words for a registry event (worker/daemon/deploys_page.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from worker.daemon import deploys_page
from worker.daemon.deploys_page import _event_text
from worker.daemon.page_actions import RetryGroups
from worker.daemon.page_forms import nothing_to_retry
from worker.db.store.page import TimelineRelease
from worker.db.store.rows import DeploymentEvent


def event(detail: dict[str, object]) -> DeploymentEvent:
    at = datetime(2026, 12, 7, tzinfo=UTC)
    return DeploymentEvent(1, at, "rel-b", "deployed", "ana", detail)


def test_a_deploy_forced_through_a_hold_says_so_and_whose_hold() -> None:
    """Store 0040 marks the event; the timeline names the override, not a JSON blob."""
    said = _event_text(
        event({"image": "img:b", "desired": 2, "queue": "runs_rel_b", "previous": ["rel-a"],
               "forcedThroughHold": {"heldBy": "bo@host", "reason": "incident 42"}})
    )  # fmt: skip
    assert "FORCED through the hold of bo@host: incident 42" in said
    assert "forcedThroughHold" not in said


def test_an_ordinary_deploy_says_nothing_of_a_hold() -> None:
    said = _event_text(event({"image": "img:b", "desired": 2, "previous": []}))
    assert "hold" not in said.lower()


def test_an_exit_code_is_words_and_a_null_is_left_out() -> None:
    """The walk of 2026-12-07 read `{"exitCode": null}` on the timeline."""
    said = _event_text(event({"machine": "m-1", "exitCode": None}))
    assert "null" not in said
    assert "{" not in said
    assert "exit code 78" in _event_text(event({"machine": "m-1", "exitCode": 78}))


def test_nothing_to_retry_ends_in_one_full_stop() -> None:
    """A refusal's own sentence ends in a full stop; the page's did too ('..')."""
    said = nothing_to_retry(RetryGroups((), 0, (("lane runs_x is retired.", 2),)))
    assert said == "nothing to retry: 2 run(s) cannot be retried: lane runs_x is retired."


def test_a_release_whose_machines_fail_to_boot_says_so_escaped() -> None:
    """The scaler's record (store 0047) is a line of the release's section."""
    failed = {"reason": "2 machines in a row exited 78: <bad>", "logs": "/l/m-1.log"}
    release = TimelineRelease(
        "rel-b", "runs_rel_b", "current", "img", 1, None, "t", None, None, None, None, None,
        None, [], boot_failed=failed,
    )  # fmt: skip
    html = deploys_page.render([release], [], [])
    said = 'data-field="bootFailed">its machines fail to boot: 2 machines in a row exited 78:'
    assert said in html
    assert "&lt;bad&gt;" in html
    assert "<bad>" not in html
    assert "/l/m-1.log" in html
    quiet = deploys_page.render([replace(release, boot_failed=None)], [], [])
    assert "bootFailed" not in quiet


def test_a_gated_deploy_and_its_gate_verdict_are_words() -> None:
    """Store 0050: a gated deploy is a candidate, not current; a failed gate names its run."""
    said = _event_text(
        event({"image": "img:b", "desired": 1, "previous": [], "current": ["rel-a"],
               "gate": [{"play": "smoke", "input": {}}], "gateTimeoutSeconds": 300})
    )  # fmt: skip
    assert said.startswith("deployed as the candidate: current once its gate passes"), said
    assert "gated by smoke within 300 s" in said
    assert "current meanwhile: rel-a" in said
    assert "{" not in said
    at = datetime(2026, 12, 7, tzinfo=UTC)
    failed = _event_text(
        DeploymentEvent(2, at, "rel-b", "gate_failed", "scaler",
                        {"run": "r-1", "error": "gate run r-1 (smoke) failed: boom",
                         "queue": "runs_rel_b"})
    )  # fmt: skip
    assert failed.startswith("gate failed: never current"), failed
    assert "(gate run r-1 (smoke) failed: boom)" in failed
    assert failed.count("r-1") == 1, failed
