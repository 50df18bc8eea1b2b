"""Where the process backend's scaler keeps its machines, and what it says of others.

The default folder does not depend on the directory the scaler runs from: a scaler
restarted elsewhere (systemd, another shell) manages the machines the first one
started, and starts no duplicate. A default folder that is empty while the old
relative default holds machine records is warned of; live workers of a release on
machines the backend does not list are warned of once, and left alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from support.db import fetch
from support.machines import destroy_all
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import events, machine_events, passes_seen, start_scaler, worker_on

APP = "support.apps.basic:app"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _said(log: Path, event: str) -> list[dict[str, object]]:
    return [e for e in events(log) if e.get("event") == event] if log.exists() else []


async def test_a_scaler_restarted_from_another_directory_manages_the_first_ones_machines(
    database_url: str, tmp_path: Path
) -> None:
    """Scaler 1 (cwd a) starts a machine; scaler 2 (cwd b, same user) lists it: no duplicate."""
    xdg = tmp_path / "xdg"
    first_cwd, second_cwd = tmp_path / "a", tmp_path / "b"
    first_cwd.mkdir()
    second_cwd.mkdir()
    env = {"XDG_STATE_HOME": str(xdg)}
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_scaler(database_url, None, first_log, cwd=first_cwd, **env)
    second = None
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "sd-a"}) as c:
            await c.releases.deploy("sd-a", image=APP, machines=1)
            done = await c.releases.wait_rolled_out("sd-a", timeout_s=60)
            assert done.done, done.reason
            _stop(first)  # its machine keeps running, by design
            second = start_scaler(database_url, None, second_log, cwd=second_cwd, **env)

            async def active() -> bool:
                return bool(_said(second_log, "scaler.active"))

            await eventually(active, timeout_s=60, what="the second scaler active")
            await passes_seen(database_url, 4)
            created = await machine_events(database_url, "sd-a", "machine_created")
            assert len(created) == 1, created  # no duplicate started
            said = [_said(log, "scaler.state_dir") for log in (first_log, second_log)]
            dirs = {str(e["state_dir"]) for found in said for e in found}
            assert len(dirs) == 1, dirs  # one folder, whatever the cwd
            (state_dir,) = dirs
            assert Path(state_dir).is_relative_to(xdg / "lane-worker" / "machines")
            assert (Path(state_dir) / f"{created[0]}.json").exists()
            # The second scaler lists it (the machine is not leaked): its pass reports it.
            (holder,) = {e["holder"] for e in _said(second_log, "scaler.active")}
            rows = await fetch(database_url, f"select holder, releases from {SCHEMA}.scaler_state")
            assert [r["holder"] for r in rows] == [holder]
            assert created[0] in str(rows[0]["releases"])
            assert not _said(second_log, "scaler.unlisted_live_workers")
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
        # Wherever a scaler (this one, or one before the fix) put machines.
        for folder in [
            *xdg.glob("lane-worker/machines/*"),
            first_cwd / ".lane-worker/machines",
            second_cwd / ".lane-worker/machines",
        ]:
            if folder.is_dir():
                await destroy_all(folder)


async def test_machine_records_under_the_old_relative_default_are_warned_of(
    database_url: str, tmp_path: Path
) -> None:
    """Records in ./.lane-worker/machines and an empty default: a warning names both."""
    legacy = tmp_path / ".lane-worker" / "machines"
    legacy.mkdir(parents=True)
    record = {"id": "m-0ld0ld00", "lane_worker_release": "gone", "image": APP, "created_at": 0}
    (legacy / "m-0ld0ld00.json").write_text(json.dumps(record))
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, None, log, cwd=tmp_path, XDG_STATE_HOME=str(tmp_path / "x"))
    try:

        async def active() -> bool:
            return bool(_said(log, "scaler.active"))

        await eventually(active, timeout_s=60, what="the scaler active")
        (warned,) = _said(log, "scaler.state_dir_legacy")
        assert warned["level"] == "warning", warned
        assert warned["legacy_dir"] == str(legacy)
        assert str(warned["state_dir"]).startswith(str(tmp_path / "x" / "lane-worker"))
        assert f"--state-dir {legacy}" in str(warned["message"])
        assert (legacy / "m-0ld0ld00.json").exists()  # nothing of it is touched
    finally:
        _stop(scaler)


async def test_live_workers_on_machines_the_backend_does_not_list_are_warned_of_once(
    database_url: str, tmp_path: Path
) -> None:
    """A worker of a deployed release beats on a machine another scaler started: one warning
    per change of that set, naming the release, the machines and the state dir; never acted on."""
    state = tmp_path / "machines"
    log = tmp_path / "scaler.log"
    scaler = start_scaler(database_url, state, log)
    try:
        async with open_client(database_url, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "sd-u"}) as c:
            # Deployed with none: this scaler starts nothing of its own.
            await c.releases.deploy("sd-u", image=APP, machines=0)
            await worker_on(c, "sd-u", "m-f0re1gn1", live=True)

            async def warned() -> list[dict[str, object]]:
                await worker_on(c, "sd-u", "m-f0re1gn1", live=True)  # keeps it live
                return _said(log, "scaler.unlisted_live_workers")

            (first,) = await eventually(warned, timeout_s=60, what="the warning")
            assert first["release_id"] == "sd-u"
            assert first["machines"] == ["m-f0re1gn1"]
            assert str(state) in str(first["where"])
            for _ in range(3):  # more passes, nothing changed: said once
                await worker_on(c, "sd-u", "m-f0re1gn1", live=True)
                await passes_seen(database_url, 1)
            assert len(_said(log, "scaler.unlisted_live_workers")) == 1
            await worker_on(c, "sd-u", "m-f0re1gn2", live=True)

            async def again() -> list[dict[str, object]]:
                for machine in ("m-f0re1gn1", "m-f0re1gn2"):
                    await worker_on(c, "sd-u", machine, live=True)
                found = _said(log, "scaler.unlisted_live_workers")
                return found if len(found) == 2 else []

            second = (await eventually(again, timeout_s=60, what="the second warning"))[1]
            assert second["machines"] == ["m-f0re1gn1", "m-f0re1gn2"]
        acted = await fetch(
            database_url,
            f"select action from {SCHEMA}.deployment_events where action like 'machine_%'",
        )
        assert acted == []  # neither stopped, destroyed nor adopted
    finally:
        _stop(scaler)
        await destroy_all(state)
