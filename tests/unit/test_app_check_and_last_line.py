"""The process backend's deploy-time app check and a dead machine's last line (issue 31)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

from worker.db.store.rows import ScalerState
from worker.scaler.app_check import TRACEBACK_LINES, check_app, refusal_of
from worker.scaler.process import last_line_in, machine_env


def scaler(backend: str, holder: str) -> ScalerState:
    return ScalerState(holder, backend, datetime.now(UTC), 0.0, {})


def test_no_check_without_a_process_backend_scaler() -> None:
    assert check_app("a.b:app", "rel-1", None) is None
    assert check_app("a.b:app", "rel-1", scaler("fly", f"{socket.gethostname()}:1")) is None


def test_a_scaler_elsewhere_or_gone_cannot_be_checked_against() -> None:
    other = check_app("a.b:app", "rel-1", scaler("process", "another-host:123"))
    assert other is not None
    assert other.cannot is not None
    assert "runs on host 'another-host', not here" in other.cannot
    gone = check_app("a.b:app", "rel-1", scaler("process", f"{socket.gethostname()}:0"))
    assert gone is not None
    assert gone.cannot is not None
    assert "is not running here" in gone.cannot
    odd = check_app("a.b:app", "rel-1", scaler("process", f"{socket.gethostname()}:../self"))
    assert odd is not None
    assert odd.cannot is not None


def test_the_last_line_is_the_last_one_printed_cut_short(tmp_path: Path) -> None:
    log = tmp_path / "m.log"
    assert last_line_in(log) is None
    log.write_bytes(
        b"first\n" + b"x" * 10_000 + b"\nlane-worker: LANE_WORKER_CONCURRENCY bad\n\n  \n"
    )
    assert last_line_in(log) == "lane-worker: LANE_WORKER_CONCURRENCY bad"
    log.write_bytes(b"y" * 1000)
    assert last_line_in(log) == "y" * 300


def test_a_machine_gets_the_scalers_environment_but_its_own_settings() -> None:
    env = machine_env(
        {"PATH": "/bin", "LANE_WORKER_HEALTH_PORT": "8081", "DEEPLINE_ABSURD_QUEUE_SUFFIX": "x"},
        "rel-1",
        "m-1",
    )
    assert env == {
        "PATH": "/bin",
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-1",
        "LANE_WORKER_MACHINE_ID": "m-1",
        "LANE_WORKER_HEALTH_PORT": "0",
    }


def test_a_refusal_shows_its_traceback_s_last_lines_masked() -> None:
    """The child's traceback is kept from its first line, at most TRACEBACK_LINES of
    its last lines after it, each masked with the scaler's secrets (its URL's password,
    its API token); so is the reason."""
    password, token = "pw-long-enough-1234", "fm2_token_of_the_scaler_99"
    env = {
        "WORKFLOW_RUNTIME_POSTGRES": f"postgresql://u:{password}@db/x",
        "FLY_API_TOKEN": f"FlyV1 {token}",
    }
    frames = [f'  File "m.py", line {n}, in f{n}' for n in range(40)]
    stderr = "\n".join(
        [
            "a warning first",
            "Traceback (most recent call last):",
            *frames,
            f"RuntimeError: cannot start: {env['WORKFLOW_RUNTIME_POSTGRES']} {token}",
            f"lane-worker: importing m raised RuntimeError: {password} (traceback above)",
            "",
        ]
    )
    outcome = refusal_of(stderr, 2, "/srv", env)
    assert outcome.problem == (
        "importing m raised RuntimeError: *** (traceback above) (checked in /srv)"
    )
    shown = outcome.traceback
    assert len(shown) == TRACEBACK_LINES + 2
    assert shown[0] == "Traceback (most recent call last):"
    assert shown[1] == "  ... (21 lines not shown)"
    assert shown[2:-1] == tuple(frames[-(TRACEBACK_LINES - 1) :])
    assert password not in shown[-1]
    assert token not in shown[-1]
    assert shown[-1].startswith("RuntimeError: cannot start: postgresql://u:***@db/x")
    # No traceback printed (a missing attribute): the reason alone.
    plain = refusal_of("lane-worker: module m has no attribute 'ap'\n", 2, "/srv", env)
    assert plain.traceback == ()
    assert refusal_of("", 1, "/srv", env).problem == "exit 1 (checked in /srv)"
