"""`releases deploy` with the process backend checks the app before recording (issue 31).

The app (`--image`, module:attr) is loaded in a subprocess as the scaler's machines
would load it (the live scaler's interpreter, directory and environment): a typo is
refused (exit 2) before anything is written, and nothing of the deploying process
(here: its PYTHONPATH) decides the answer. `--skip-app-check` skips it; a check that
cannot be done here (the scaler on another host) is refused, naming that flag.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.cli import lane_worker
from support.db import execute, fetch
from support.runtime import SCHEMA
from support.scaler import passes_seen, scaler_running

APP = "support.apps.basic:app"


async def recorded(database_url: str, release_id: str) -> list[str]:
    rows = await fetch(
        database_url,
        f"select action from {SCHEMA}.deployment_events where release_id = $1 order by event_id",
        release_id,
    )
    return [r["action"] for r in rows]


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join(done.stderr.split())


async def test_a_deploy_whose_app_does_not_load_is_refused_before_anything_is_written(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    # A module only the deploying process can import.
    elsewhere = tmp_path / "deployer"
    elsewhere.mkdir()
    (elsewhere / "onlyhere.py").write_text("from worker.app import App\napp = App()\n")
    async with scaler_running(database_url, state, tmp_path / "scaler.log"):
        await passes_seen(database_url, 1)  # the scaler has said its backend and host
        typo = await lane_worker(
            database_url, "releases", "deploy", "chk-a", "--image", "support.apps.basic:ap"
        )
        no_module = await lane_worker(
            database_url, "releases", "deploy", "chk-a", "--image", "support.apps.basik:app"
        )
        not_there = await lane_worker(
            database_url, "releases", "deploy", "chk-a", "--image", "onlyhere:app",
            env={"PYTHONPATH": str(elsewhere)},
        )  # fmt: skip
        refused = await recorded(database_url, "chk-a")
        # The deploying process cannot import support.apps (no PYTHONPATH): the scaler's
        # machines can, and that is what is checked.
        good = await lane_worker(database_url, "releases", "deploy", "chk-a", "--image", APP)
        skipped = await lane_worker(
            database_url, "releases", "deploy", "chk-b", "--image", "support.apps.basic:ap",
            "--skip-app-check",
        )  # fmt: skip
    assert typo.returncode == 2, (typo.stdout, typo.stderr)
    said = one_line(typo)
    assert "release chk-a was not deployed: its app support.apps.basic:ap does not load" in said
    assert "has no attribute 'ap'; it has App objects: app" in said, said
    assert no_module.returncode == 2, no_module.stderr
    assert "no module 'support.apps.basik'" in one_line(no_module), no_module.stderr
    assert not_there.returncode == 2, not_there.stderr
    assert "no module 'onlyhere'" in one_line(not_there), not_there.stderr
    assert refused == []  # nothing recorded by the refused deploys
    assert good.returncode == 0, good.stderr
    assert skipped.returncode == 0, skipped.stderr
    # (The scaler, still running then, may have created its machine since.)
    assert (await recorded(database_url, "chk-a"))[:1] == ["deployed"]
    assert (await recorded(database_url, "chk-b"))[:1] == ["deployed"]


async def test_a_check_that_cannot_be_done_here_refuses_unless_skipped(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    async with scaler_running(database_url, state, tmp_path / "scaler.log"):
        await passes_seen(database_url, 1)
    await execute(database_url, f"update {SCHEMA}.scaler_state set holder = 'elsewhere:1'")
    done = await lane_worker(database_url, "releases", "deploy", "chk-c", "--image", APP)
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = one_line(done)
    assert "cannot be checked here" in said, said
    assert "runs on host 'elsewhere', not here" in said, said
    assert "--skip-app-check" in said, said
    assert await recorded(database_url, "chk-c") == []
    skipped = await lane_worker(
        database_url, "releases", "deploy", "chk-c", "--image", APP, "--skip-app-check"
    )
    assert skipped.returncode == 0, skipped.stderr
    assert await recorded(database_url, "chk-c") == ["deployed"]
