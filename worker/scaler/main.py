"""Wires the scaler from the environment: the store's client, the backend, logging."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import anyio

from worker.client import LaneClient
from worker.config.env import DATABASE_URL_ENV, PGBOUNCER_ENV, SCALER_STATE_DIR_ENV, Problems
from worker.config.tuning import read_tuning
from worker.daemon import logs
from worker.errors import LaneConfigError
from worker.scaler.backend import Backend, scaler_secrets
from worker.scaler.fly import FlyBackend
from worker.scaler.process import ProcessBackend
from worker.scaler.run import Scaler
from worker.scaler.statedir import resolve_state_dir


def backend_for(name: str, env: Mapping[str, str], state_dir: Path | None) -> Backend:
    if name == "process":
        # Resolved once, here: a relative override or the cwd never counts again.
        folder = resolve_state_dir(state_dir, env)
        try:
            return ProcessBackend(folder, env)
        except OSError as exc:
            raise LaneConfigError(
                f"the scaler cannot use {folder} as its state folder ({exc.strerror or exc}): "
                f"pass --state-dir (or {SCALER_STATE_DIR_ENV}) a folder it may create and write.",
                variable=SCALER_STATE_DIR_ENV,
            ) from exc
    if name == "fly":
        return FlyBackend.from_env(env)
    raise LaneConfigError(
        f"no scaler backend {name!r}: use fly or process.", variable="LANE_WORKER_SCALER_BACKEND"
    )


def run_scaler(
    env: Mapping[str, str], backend: str, state_dir: Path | None, health_port: int
) -> int:
    """Run the scaler until SIGTERM; return its exit code."""
    fmt = (env.get("LANE_WORKER_LOG_FORMAT") or "auto").strip().lower()
    chosen: Literal["json", "console", "auto"] = (
        "json" if fmt == "json" else "console" if fmt == "console" else "auto"
    )
    secrets = scaler_secrets(env)
    logs.configure(chosen, secrets=secrets)
    if read_tuning(env, Problems()).pgbouncer:
        # Its lock is a session advisory lock with an idle-session lease: behind a
        # transaction pooler two scalers could both hold it, or neither.
        raise LaneConfigError(
            f"{PGBOUNCER_ENV} is set: the scaler needs a direct (session) connection to "
            f"PostgreSQL; give it a {DATABASE_URL_ENV} that does not go through PgBouncer "
            "and unset the flag for it.",
            variable=PGBOUNCER_ENV,
        )
    machines = backend_for(backend, env, state_dir)

    async def main() -> int:
        client = await LaneClient.connect(env=env, as_app=False)  # the scaler: its own role
        try:
            await client.check_schemas()
            scaler = Scaler(client, machines, health_port=health_port, secrets=secrets)
            return await scaler.run(client.db.options.url)
        finally:
            await client.close()

    return anyio.run(main)
