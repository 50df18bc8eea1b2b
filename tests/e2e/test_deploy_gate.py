"""`releases deploy --gate` (issue 32 §1): a gate before promotion, driven by the scaler.

Real scaler, real machines (the process backend). A passing gate promotes the
release; a failing gate and a gate that hangs past --gate-timeout never do: the
current release stays current and claiming, the gated release's machines go, and
--wait exits 1 naming the gate run and its error. A bad --gate is refused at once,
nothing recorded.
"""

from __future__ import annotations

import signal
from pathlib import Path

from support.cli import lane_worker, lane_worker_json, one_error_line
from support.db import fetch
from support.machines import destroy_all, store_backend
from support.runtime import SCHEMA, eventually, open_client
from support.scaler import scaler_running, start_scaler
from worker.scaler.gate import GATE_KEY_PREFIX

APP = "support.apps.basic:app"


async def _roles(database_url: str) -> dict[str, str]:
    rows = await fetch(database_url, f"select release_id, role from {SCHEMA}.deployments")
    return {r["release_id"]: r["role"] for r in rows}


async def _lane(database_url: str, release_id: str) -> str | None:
    rows = await fetch(
        database_url,
        f"select l.status from {SCHEMA}.releases l join {SCHEMA}.deployments d"
        f" on d.queue = l.queue where d.release_id = '{release_id}'",
    )
    return rows[0]["status"] if rows else None


async def _gate_runs(database_url: str, release_id: str) -> list[dict[str, object]]:
    return await fetch(
        database_url,
        f"select run_id::text as run_id, status, idempotency_key from {SCHEMA}.runs"
        f" where release_id = '{release_id}' order by created_at",
    )


async def test_a_gate_promotes_only_a_release_whose_gate_runs_complete(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    async with scaler_running(database_url, state, tmp_path / "scaler.log"):
        backend = await store_backend(database_url, state)
        first = await lane_worker(
            database_url, "releases", "deploy", "gate-a", "--image", APP, "--wait",
            "--timeout", "120",
        )  # fmt: skip
        assert first.returncode == 0, first.stderr

        # A passing gate: B becomes current only after its gate run completed on B.
        passed = await lane_worker(
            database_url, "releases", "deploy", "gate-b", "--image", APP,
            "--gate", 'plain={"check": 1}', "--wait", "--timeout", "120",
        )  # fmt: skip
        assert passed.returncode == 0, (passed.stdout, passed.stderr)
        assert "is the candidate" in passed.stdout, passed.stdout
        assert "current until it passes: gate-a." in passed.stdout, passed.stdout
        assert (await _roles(database_url))["gate-b"] == "current"
        [run] = await _gate_runs(database_url, "gate-b")
        assert run["status"] == "completed", run
        assert str(run["idempotency_key"]).startswith(f"{GATE_KEY_PREFIX}gate-b:"), run
        actions = await fetch(
            database_url,
            f"select release_id, action from {SCHEMA}.deployment_events"
            " where release_id in ('gate-a', 'gate-b') order by event_id",
        )
        said = [(a["release_id"], a["action"]) for a in actions]
        # Promoted before what it supersedes was retired.
        assert said.index(("gate-b", "gate_passed")) < said.index(("gate-a", "retired")), said

        # A failing gate: C is never current; B stays current and claiming; C's machines go.
        failed = await lane_worker(
            database_url, "releases", "deploy", "gate-c", "--image", APP,
            "--gate", "flaky", "--wait", "--timeout", "120",
        )  # fmt: skip
        assert failed.returncode == 1, (failed.stdout, failed.stderr)
        [bad] = await _gate_runs(database_url, "gate-c")
        line = one_error_line(failed)
        assert "its gate failed, so it never became current" in line, line
        assert f"gate run {bad['run_id']} (flaky) failed: " in line, line
        assert "upstream is down" in line, line
        roles = await _roles(database_url)
        assert (roles["gate-b"], roles["gate-c"]) == ("current", "retired"), roles
        assert await _lane(database_url, "gate-b") == "claiming"
        report = await lane_worker_json(database_url, "releases")
        [c] = [r for r in report["releases"] if r["releaseId"] == "gate-c"]
        assert c["gate"]["outcome"] == "failed", c
        assert c["gate"]["run"] == bad["run_id"], c
        listed = await lane_worker(database_url, "releases")
        assert "gate-c: gate failed, never current: gate run " in listed.stdout, listed.stdout

        async def c_gone() -> bool:
            return not [m for m in await backend.list() if m.release_id == "gate-c"]

        await eventually(c_gone, timeout_s=90, what="gate-c's machines destroyed")

        # A gate that hangs: timed out, its run cancelled, D never current.
        hung = await lane_worker(
            database_url, "releases", "deploy", "gate-d", "--image", APP,
            "--gate", 'sleeper={"seconds": 600}', "--gate-timeout", "3",
            "--wait", "--timeout", "120",
        )  # fmt: skip
        assert hung.returncode == 1, (hung.stdout, hung.stderr)
        [slept] = await _gate_runs(database_url, "gate-d")
        line = one_error_line(hung)
        assert f"gate run {slept['run_id']} (sleeper) did not complete within 3 s" in line, line
        assert slept["status"] == "cancelled", slept
        roles = await _roles(database_url)
        assert (roles["gate-b"], roles["gate-d"]) == ("current", "retired"), roles
        assert await _lane(database_url, "gate-b") == "claiming"

        async def d_gone() -> bool:
            return not [m for m in await backend.list() if m.release_id == "gate-d"]

        await eventually(d_gone, timeout_s=90, what="gate-d's machines destroyed")
        running = {m.release_id for m in await backend.list()}
        assert running == {"gate-b"}, running


async def test_a_bad_gate_is_refused_and_nothing_recorded(database_url: str) -> None:
    for spec in ("", "=", 'plain={"x": ', "plain=[1]", "plain=NaN"):
        refused = await lane_worker(
            database_url, "releases", "deploy", "gate-x", "--image", APP, "--gate", spec,
            "--skip-app-check",
        )  # fmt: skip
        assert refused.returncode == 2, (spec, refused.stdout, refused.stderr)
        assert "gate" in one_error_line(refused), refused.stderr
    zero = await lane_worker(
        database_url, "releases", "deploy", "gate-x", "--image", APP, "--gate", "plain",
        "--machines", "0", "--skip-app-check",
    )  # fmt: skip
    assert zero.returncode == 2, zero.stderr
    assert "1 or more" in one_error_line(zero)
    assert await fetch(database_url, f"select 1 from {SCHEMA}.deployments") == []


async def _beats_after(database_url: str, passes: int) -> None:
    """Wait until the active scaler has written ``passes`` more passes (each runs its gates
    after reconciling, then beats)."""
    seen: list[object] = []

    async def beat() -> bool:
        [row] = await fetch(database_url, f"select beat_at from {SCHEMA}.scaler_state")
        if not seen or seen[-1] != row["beat_at"]:
            seen.append(row["beat_at"])
        return len(seen) > passes

    await eventually(beat, timeout_s=60, what=f"{passes} scaler passes")


async def test_a_gate_waits_out_a_hold_and_a_killed_scaler_submits_nothing_twice(
    database_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "machines"
    scaler = start_scaler(database_url, state, tmp_path / "scaler.log")
    try:
        first = await lane_worker(
            database_url, "releases", "deploy", "hold-a", "--image", APP, "--wait",
            "--timeout", "120",
        )  # fmt: skip
        assert first.returncode == 0, first.stderr
        await lane_worker_json(database_url, "releases", "hold")
        forced = await lane_worker(
            database_url, "releases", "deploy", "hold-b", "--image", APP,
            "--gate", "waiter", "--force",
        )  # fmt: skip
        assert forced.returncode == 0, forced.stderr

        async def b_ready() -> bool:
            rows = await fetch(
                database_url,
                f"select 1 from {SCHEMA}.workers where release_id = 'hold-b'"
                " and ready_at is not null and stopped_at is null",
            )
            return bool(rows)

        await eventually(b_ready, timeout_s=90, what="hold-b's machine ready")
        await _beats_after(database_url, 2)
        # Held: its machines run, yet no gate run is submitted and nothing is promoted.
        assert await _gate_runs(database_url, "hold-b") == []
        assert (await _roles(database_url))["hold-b"] == "candidate"
        await lane_worker_json(database_url, "releases", "resume")

        async def submitted() -> list[dict[str, object]]:
            return await _gate_runs(database_url, "hold-b")

        [run] = await eventually(submitted, timeout_s=60, what="the gate run submitted")
        # The scaler is killed mid-gate; the next one finds the same run, submits none.
        scaler.send_signal(signal.SIGKILL)
        scaler.wait(timeout=30)
        scaler = start_scaler(database_url, state, tmp_path / "scaler2.log")
        await _beats_after(database_url, 2)
        assert (await _roles(database_url))["hold-b"] == "candidate"
        async with open_client(database_url) as client:
            await client.signal(str(run["run_id"]), "go", {"by": "test"})

        async def promoted() -> bool:
            return (await _roles(database_url)).get("hold-b") == "current"

        await eventually(promoted, timeout_s=60, what="hold-b promoted")
        assert [r["run_id"] for r in await _gate_runs(database_url, "hold-b")] == [run["run_id"]]
        passed = await fetch(
            database_url,
            f"select 1 from {SCHEMA}.deployment_events where action = 'gate_passed'",
        )
        assert len(passed) == 1
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await destroy_all(state)
