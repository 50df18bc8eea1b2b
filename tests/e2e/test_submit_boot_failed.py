"""A submit to a release whose machines cannot boot says it is not served (store 0047).

The app loads (the deploy's check passes), but every machine's worker refuses its
configuration at boot (exit 78): no worker ever registers. Once the scaler judges the
boot failed (as `releases deploy --wait` does), a submit to that release answers
served=false with a warning naming the release, the exit and `lane-worker releases`,
and `releases` shows the failure. Real scaler, real machines (the process backend).
"""

from __future__ import annotations

from pathlib import Path

from support.cli import lane_worker, lane_worker_json
from support.db import fetch
from support.runtime import SCHEMA
from support.scaler import scaler_running

APP = "support.apps.basic:app"


async def test_a_submit_to_a_release_that_cannot_boot_is_not_served(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    # Every machine inherits a concurrency its worker refuses (exit 78); the app loads.
    async with scaler_running(
        database_url, state, tmp_path / "scaler.log", LANE_WORKER_CONCURRENCY="0"
    ):
        done = await lane_worker(
            database_url, "releases", "deploy", "boot-sub", "--image", APP, "--wait",
            "--timeout", "100",
        )  # fmt: skip
        [made] = await fetch(
            database_url, f"select {SCHEMA}.submit_run('greet', '{{}}', 'boot-sub') as made"
        )
        listed = await lane_worker(database_url, "releases")
        said = await lane_worker_json(database_url, "releases")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "2 in a row exited 78" in " ".join(done.stderr.split())
    answer = made["made"]
    assert answer["served"] is False, answer
    warning = answer["warning"]
    assert warning.startswith(
        "lane runs_boot_sub (release 'boot-sub') is the current deploy, but its machines fail "
        "to boot (2 machines in a row exited 78: their worker refused its configuration"
    ), warning
    assert "LANE_WORKER_CONCURRENCY" in warning, warning  # the last line of its refusal
    assert "`lane-worker releases`" in warning, warning
    [release] = said["releases"]
    assert release["bootFailed"]["exitCode"] == 78, release
    assert release["bootFailed"]["reason"] in warning
    assert "boot-sub: BOOT FAILING: 2 machines in a row exited 78" in listed.stdout, listed.stdout
