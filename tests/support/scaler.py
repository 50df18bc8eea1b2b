"""A scaler with the process backend as a subprocess, and what it and its machines say.

``start_scaler`` runs `lane-worker scaler --backend process`; its machines are
worker processes whose output goes to ``STATE_DIR/<machine>.log``
(``worker/scaler/machine.py``), where ``machine_health_port`` finds the port
each worker bound.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from support import REPO
from support.daemon import base_env
from support.db import fetch
from support.machines import destroy_all
from support.runtime import SCHEMA, eventually, queue_of
from worker.client import LaneClient


def start_scaler(
    database_url: str, state_dir: Path | None, log: Path, *, cwd: Path = REPO, **env: str
) -> subprocess.Popen[bytes]:
    """Start a scaler whose machines serve with a 3 s drain (``env`` adds or overrides);
    ``state_dir`` None: its default (under ``XDG_STATE_HOME``, which ``env`` should set)."""
    values = {**base_env(database_url, "unused"), "LANE_WORKER_DRAIN_SECONDS": "3", **env}
    values.pop("DEEPLINE_RUNTIME_DEPLOY_VERSION")
    where = [] if state_dir is None else ["--state-dir", str(state_dir)]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "scaler", "--backend", "process",
             *where, "--health-port", "0"],
            cwd=cwd, env=values, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def machine_health_port(state_dir: Path, machine_id: str) -> int | None:
    """The health port a machine's worker logged in ``worker.ready``; None before that."""
    log = state_dir / f"{machine_id}.log"
    if not log.exists():
        return None
    for record in events(log):
        if record.get("event") == "worker.ready":
            return int(record["health_port"])
    return None


def events(log: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a scaler (or machine) log, in order."""
    found = []
    for line in log.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


@contextlib.asynccontextmanager
async def scaler_running(
    database_url: str, state_dir: Path, log: Path, **env: str
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """A scaler for the block; then it is stopped and every machine it left is destroyed."""
    scaler = start_scaler(database_url, state_dir, log, **env)
    try:
        yield scaler
    finally:
        scaler.send_signal(signal.SIGTERM)
        scaler.wait(timeout=30)
        await destroy_all(state_dir)


def start_fly_scaler(
    database_url: str, fly_env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """Start `lane-worker scaler --backend fly` against a fake Machines API (``fly_env``)."""
    values = {**base_env(database_url, "unused"), **fly_env}
    values.pop("DEEPLINE_RUNTIME_DEPLOY_VERSION")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "scaler", "--backend", "fly", "--health-port", "0"],
            cwd=REPO, env=values, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def passes_seen(database_url: str, count: int) -> None:
    """Wait until the active scaler has written ``count`` more passes."""
    beats: set[Any] = set()

    async def enough() -> bool:
        rows = await fetch(database_url, f"select beat_at from {SCHEMA}.scaler_state")
        beats.update(r["beat_at"] for r in rows)
        return len(beats) > count

    await eventually(enough, timeout_s=30 + 5 * count, what=f"{count} scaler passes")


async def machine_events(database_url: str, release_id: str, action: str) -> list[str]:
    """The machines the registry records ``action`` (``machine_created``, ...) for, in order."""
    rows = await fetch(
        database_url,
        f"select detail->>'machine' as machine from {SCHEMA}.deployment_events"
        " where release_id = $1 and action = $2 order by event_id",
        release_id, action,
    )  # fmt: skip
    return [row["machine"] for row in rows]


class Clock:
    """``time.monotonic`` as the reconcile pass reads it, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def worker_on(client: LaneClient, release: str, machine_id: str, *, live: bool) -> None:
    """A ready worker row of ``release`` on ``machine_id``, beating now or ten minutes ago."""
    await client.db.execute(
        f"insert into {SCHEMA}.workers (worker_id, release_id, queue, hostname, pid, concurrency,"
        " machine_id, ready_at, heartbeat_at) values ($1, $2, $3, 'test', 1, 8, $4, now(),"
        " now() - make_interval(mins => $5))"
        " on conflict (worker_id) do update set heartbeat_at = excluded.heartbeat_at",
        f"w-{machine_id}", release, queue_of(release), machine_id, 0 if live else 10,
    )  # fmt: skip
