"""`releases deploy --wait` ends early when the release's machines cannot boot (issue 31).

A machine whose worker refuses its configuration (exit 78) or its app (exit 2) does not
boot by being started again: once two machines of the deploy exit so in a row, the wait
ends with exit 1 naming the exit code, the last machine's log and its last line, instead
of waiting out its timeout. Real scaler, real machines (the process backend).
"""

from __future__ import annotations

from pathlib import Path

from support.cli import lane_worker, lane_worker_json
from support.db import fetch
from support.runtime import SCHEMA
from support.scaler import scaler_running

APP = "support.apps.basic:app"


async def test_deploy_wait_ends_once_machines_refuse_their_configuration(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    # Every machine inherits a concurrency its worker refuses (exit 78).
    async with scaler_running(
        database_url, state, tmp_path / "scaler.log", LANE_WORKER_CONCURRENCY="0"
    ):
        done = await lane_worker(
            database_url, "releases", "deploy", "boot-bad", "--image", APP, "--wait",
            "--timeout", "100",
        )  # fmt: skip
        listed = await lane_worker(database_url, "releases")
        said = await lane_worker_json(database_url, "releases")
        recorded = await fetch(
            database_url,
            f"select detail from {SCHEMA}.deployment_events"
            " where release_id = 'boot-bad' and action = 'boot_failed'",
        )
    assert done.returncode == 1, (done.stdout, done.stderr)
    err = " ".join(done.stderr.split())
    assert "did not roll out:" in err, err  # at once, not "within 100 s"
    assert "within 100 s" not in err, err
    assert "2 in a row exited 78" in err, err
    assert "refused its configuration" in err, err
    assert f"logs: {state}/m-" in err, err
    assert "its last line:" in err, err
    assert "LANE_WORKER_CONCURRENCY" in err, err
    [release] = said["releases"]
    failed = release["scaler"]["bootFailed"]
    assert failed["exitCode"] == 78, failed
    assert failed["inARow"] >= 2, failed
    assert "boot failing: " in listed.stdout, listed.stdout
    assert len(recorded) == 1, recorded
    assert recorded[0]["detail"]["exitCode"] == 78
