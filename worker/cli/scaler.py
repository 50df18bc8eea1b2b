"""`scaler`: keeps each release's machines exactly as long as its lane needs them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from worker.cli.exits import daemon_exit
from worker.cli.root import cli
from worker.config.env import SCALER_BACKEND_ENV as BACKEND_ENV
from worker.config.env import SCALER_STATE_DIR_ENV as STATE_DIR_ENV


@cli.command()
@click.option(
    "--backend",
    type=click.Choice(["process", "fly"]),
    envvar=BACKEND_ENV,
    default="process",
    show_default=True,
    help=f"Where machines run (also {BACKEND_ENV}): local `lane-worker run` "
    "processes, or Fly Machines.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=STATE_DIR_ENV,
    default=None,
    show_default="$XDG_STATE_HOME (~/.local/state)/lane-worker/machines/<dbname>-<hash>",
    help=f"Where the process backend records its machines (also {STATE_DIR_ENV}); "
    "the default is the same from any directory and names the database (host, port, "
    "dbname, store schema); a relative path is resolved once, at start.",
)
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    envvar="LANE_WORKER_HEALTH_PORT",
    default=8081,
    show_default=True,
    help="/healthz, /readyz and /metrics (0 picks a free port, logged).",
)
def scaler(backend: str, state_dir: Path | None, health_port: int) -> None:
    """Run the scaler until SIGTERM: start, replace and remove release machines.

    One is active per database (a second waits as a standby). Every few seconds it
    reads the release registry (`lane-worker releases`), the drain report and the
    backend's machines, and acts on the difference.
    """
    from worker.scaler.main import run_scaler  # the scaler's imports stay out of other commands

    sys.exit(
        daemon_exit(lambda: run_scaler(os.environ, backend, state_dir, health_port), os.environ)
    )
