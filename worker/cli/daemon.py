"""`run` and `dev`: the worker daemon, and the same with embedded Postgres and the demo."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from worker.cli.exits import ConfigRefused, daemon_exit
from worker.cli.params import APP_SPEC
from worker.cli.root import cli

DEFAULT_APP = "worker.demo:app"


# Said when `run` is given no --app: a release worker serving the demo's plays
# instead of the app's would claim nothing, or fail the app's runs as unknown plays.
NO_APP = (
    "run needs --app, the App whose plays this worker serves (module:attribute), for "
    "example `lane-worker run --app myproj.plays:app`; only `lane-worker dev` serves "
    f"the built-in demo ({DEFAULT_APP}) without it."
)


@cli.command()
@click.option(
    "--app",
    type=APP_SPEC,
    help=f"The App whose plays to run, as module:attribute (required; the demo is {DEFAULT_APP}).",
)
def run(app: str | None) -> None:
    """Run the worker daemon for this release's lane until SIGTERM.

    With LANE_WORKER_PROCESSES=N above 1, N daemons under one supervisor process.
    """
    if app is None:
        raise ConfigRefused(NO_APP)  # 78, before the environment: nothing else can help
    from worker.daemon.processes import run_processes, wanted_processes

    if wanted_processes(os.environ) > 1:
        sys.exit(run_processes(app, os.environ))
    from worker.daemon.supervisor import (
        run_daemon,  # the daemon's imports stay out of other commands
    )

    sys.exit(daemon_exit(functools.partial(run_daemon, os.environ, app), os.environ))


@cli.command()
@click.option(
    "--app",
    default=DEFAULT_APP,
    show_default=True,
    type=APP_SPEC,
    help="The App whose plays to run; the demo runs are submitted only with the demo app.",
)
@click.option(
    "--exit-after-demo",
    is_flag=True,
    help="Exit 0 once every demo run completed (1 if one did not).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".pg/dev"),
    show_default=True,
    help="Embedded PostgreSQL's data folder, reused across starts.",
)
@click.option(
    "--roll",
    is_flag=True,
    help="Instead: show a rolling deploy end to end (a scaler with local machines, "
    "release A with parked runs, then B); exit 0 when it rolled out.",
)
def dev(app: str, exit_after_demo: bool, data_dir: Path, roll: bool) -> None:
    """Run a worker with the demo runs, on embedded PostgreSQL unless one is configured.

    With WORKFLOW_RUNTIME_POSTGRES set, that database is used instead. Ctrl-C
    drains the worker and stops PostgreSQL. It serves a dev lane: with
    DEEPLINE_RUNTIME_DEPLOY_VERSION set and no DEEPLINE_ABSURD_QUEUE_SUFFIX it refuses (78).
    """
    if roll:
        from worker.dev.roll import run_roll

        sys.exit(
            daemon_exit(functools.partial(run_roll, os.environ, app, data_dir=data_dir), os.environ)
        )
    from worker.dev.mode import run_dev  # embedded Postgres stays out of other commands

    run = functools.partial(
        run_dev, os.environ, app, exit_after_demo=exit_after_demo, data_dir=data_dir
    )
    sys.exit(daemon_exit(run, os.environ))
