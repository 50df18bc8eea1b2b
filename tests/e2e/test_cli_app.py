"""`lane-worker run --app`: the real command refuses to guess the app and says what is wrong.

No test here reaches the database: every refusal comes before the first connection,
so the URL points at a port nothing listens on (a boot that went further would
retry it and exit 1, failing the test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import one_error_line, run_cli

NOWHERE = "postgresql://u:pw@127.0.0.1:1/x"
BOOTABLE = {
    "WORKFLOW_RUNTIME_POSTGRES": NOWHERE,
    "DEEPLINE_RUNTIME_DEPLOY_VERSION": "app-check",
    "LANE_WORKER_HEALTH_PORT": "0",
    "LANE_WORKER_BOOT_RETRY": "0",
}


@pytest.mark.parametrize(
    "env",
    [
        {},
        BOOTABLE,
        {**BOOTABLE, "LANE_WORKER_PROCESSES": "2"},
        {"WORKFLOW_RUNTIME_POSTGRES": NOWHERE},  # the dev lane: still no demo
    ],
    ids=["no-environment", "release", "two-processes", "dev-lane"],
)
def test_run_without_app_refuses_with_78_naming_the_flag(env: dict[str, str]) -> None:
    """`run` with no --app exits 78 in one sentence naming --app and an example, serving nothing."""
    result = run_cli(env, "run")
    assert result.returncode == 78, result.stderr
    line = one_error_line(result)
    assert line.startswith("lane-worker: run needs --app"), line
    assert "for example `lane-worker run --app myproj.plays:app`" in line
    assert "worker.demo:app" in line  # where the demo went
    assert result.stdout == ""  # no log line: the worker never began


def test_run_help_says_app_is_required() -> None:
    """`run --help` says --app is required and names the demo's spec."""
    result = run_cli({}, "run", "--help")
    assert result.returncode == 0, result.stderr
    assert "required; the demo is worker.demo:app" in " ".join(result.stdout.split())


def write_acme(root: Path, plays: str) -> dict[str, str]:
    """Write package ``acme`` with module ``plays`` under ``root``; return the env finding it."""
    (root / "acme").mkdir()
    (root / "acme" / "__init__.py").write_text("")
    (root / "acme" / "plays.py").write_text(plays)
    return {**BOOTABLE, "PYTHONPATH": str(root)}


TWO_APPS = """\
from worker import App

app = App()
admin = App()


def helper():
    return 1


@app.play("hi")
async def hi(ctx, params):
    return "hi"
"""


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            "acme.plays:ap",
            "module acme.plays has no attribute 'ap'; it has App objects: admin, app",
        ),
        (
            "acme.plays:helper",
            "acme.plays:helper is not a lane-worker App (found function); "
            "it has App objects: admin, app",
        ),
    ],
)
def test_a_wrong_attribute_names_the_apps_the_module_has(
    tmp_path: Path, spec: str, says: str
) -> None:
    """--app naming no App in a module that imports: exit 2, naming the module's App objects."""
    result = run_cli(write_acme(tmp_path, TWO_APPS), "run", "--app", spec)
    assert result.returncode == 2, result.stderr
    assert one_error_line(result) == f"lane-worker: cannot load the app {spec!r}: {says}"


def test_a_module_without_an_app_says_so(tmp_path: Path) -> None:
    """A module with no App at all says how to make one."""
    result = run_cli(write_acme(tmp_path, "x = 1\n"), "run", "--app", "acme.plays:app")
    assert result.returncode == 2, result.stderr
    assert one_error_line(result).endswith(
        "module acme.plays has no attribute 'app'; it has no App object (make one with "
        "`app = App()`)"
    )


def test_a_sync_play_is_refused_when_the_app_is_imported(tmp_path: Path) -> None:
    """A plain `def` play fails the import (exit 2) in one line: the rule, the play's file
    and line (its decorator's), and no traceback around it (the sentence says all there is)."""
    plays = 'from worker import App\n\napp = App()\n\n\n@app.play("x")\ndef x(ctx, params):\n'
    result = run_cli(
        write_acme(tmp_path, plays + "    return 1\n"), "run", "--app", "acme.plays:app"
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert one_error_line(result) == (
        "lane-worker: cannot load the app 'acme.plays:app': importing acme.plays: play 'x': "
        f"plays must be async def (got a plain function x at {tmp_path}/acme/plays.py line 6); "
        "write it as `async def ...(ctx, params)`"
    ), result.stderr


def test_a_module_that_fails_to_import_says_so(tmp_path: Path) -> None:
    """An import error inside the module is named (not taken for a missing module)."""
    env = write_acme(tmp_path, "import no_such_dependency_xyz\n")
    result = run_cli(env, "run", "--app", "acme.plays:app")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "lane-worker: cannot load the app 'acme.plays:app': importing acme.plays failed: "
        "No module named 'no_such_dependency_xyz' (traceback above)"
    ), result.stderr
