"""`releases deploy` of an odd release spelling (issue 31): an id no worker could boot with
is refused (exit 2, one sentence, nothing recorded); an id its queue spells otherwise (case,
punctuation) is deployed with a warning naming the queue. The lane rules are unchanged."""

from __future__ import annotations

import json

import pytest

from support.cli import lane_worker, one_error_line


@pytest.mark.parametrize(("release", "queue"), [("REL-D", "runs_rel_d"), ("rel a!", "runs_rel_a")])
async def test_an_id_its_queue_spells_otherwise_is_deployed_with_a_warning(
    database_url: str, release: str, queue: str
) -> None:
    done = await lane_worker(database_url, "releases", "deploy", release, "--image", "i:1")
    assert done.returncode == 0, done.stderr
    warning = one_error_line(done)
    assert warning.startswith(f"lane-worker: warning: release id {release!r} is spelled"), warning
    assert f"its runs ride queue {queue}." in warning, warning
    assert f"(queue {queue}," in done.stdout

    said = await lane_worker(
        database_url, "releases", "deploy", release, "--image", "i:2", "--json"
    )
    assert said.returncode == 0, said.stderr
    assert said.stderr == ""
    assert queue in json.loads(said.stdout)["warning"]


async def test_a_usual_id_gets_no_warning(database_url: str) -> None:
    done = await lane_worker(database_url, "releases", "deploy", "rel-42", "--image", "i:1")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("release", ["Dev!", "_dev", "dev_"])
async def test_an_id_no_worker_could_boot_with_is_refused(database_url: str, release: str) -> None:
    done = await lane_worker(database_url, "releases", "deploy", release, "--image", "i:1")
    assert done.returncode == 2, done.stderr
    sentence = one_error_line(done)
    assert sentence.startswith(
        f"lane-worker: release {release!r} cannot be deployed: no worker could boot with it"
    ), sentence
    assert done.stdout == ""
    listed = await lane_worker(database_url, "releases", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["releases"] == []
