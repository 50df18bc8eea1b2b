"""``lane-worker dev --roll``: a rolling deploy, end to end, on one machine.

Its own embedded PostgreSQL, always (a fresh one beside the dev data folder,
removed afterwards: ``WORKFLOW_RUNTIME_POSTGRES`` is never used, since the roll
deploys releases and retires what they supersede), a scaler with the process
backend, and the demo app as two releases: A gets parked and
waiting runs, then B is deployed. The scaler starts B's machine, retires A once
B is ready; B adopts A's parked runs; A drains and its machine is stopped and
removed. Every step is printed; exits 0 when every run completed and A is gone.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import anyio
import click

from worker.client import LaneClient
from worker.config.env import DATABASE_URL_ENV, LOG_FORMAT_ENV
from worker.daemon import logs
from worker.dev.mode import database_for_dev
from worker.scaler.process import ProcessBackend
from worker.scaler.run import Scaler

ROLL_TIMEOUT_S = 180.0


def run_roll(env: Mapping[str, str], app_spec: str, *, data_dir: Path) -> int:
    """Run the rolling-deploy demo; return 0 when it ended as it should."""
    # The roll's releases use the store's default topology: a worktree's suffix
    # would outrank their release ids and put both on one lane.
    values = {
        k: v
        for k, v in env.items()
        if k
        not in (
            "DEEPLINE_ABSURD_QUEUE_SUFFIX",
            "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA",
            "DEEPLINE_RUNTIME_DEPLOY_VERSION",
            DATABASE_URL_ENV,
        )
    }
    values.setdefault(LOG_FORMAT_ENV, "console")
    logs.configure("console")
    if (env.get(DATABASE_URL_ENV) or "").strip():
        _say(
            f"{DATABASE_URL_ENV} is not used: the roll deploys and retires releases, so it "
            "runs on an embedded database of its own"
        )
    # Never the dev database either: the roll's releases would retire a dev
    # worker's release of the same lane family.
    roll_dir = data_dir.parent / f"{data_dir.name}-roll"
    shutil.rmtree(roll_dir, ignore_errors=True)  # a roll cut off earlier
    try:
        with contextlib.ExitStack() as stack:
            values[DATABASE_URL_ENV] = stack.enter_context(database_for_dev(values, roll_dir))
            return anyio.run(_roll, values, app_spec, data_dir)
    finally:
        shutil.rmtree(roll_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            roll_dir.parent.rmdir()  # made for the roll alone (a dev database keeps it)


def _say(text: str) -> None:
    click.echo(f"roll: {text}")


async def _roll(values: dict[str, str], app_spec: str, data_dir: Path) -> int:
    tag = secrets.token_hex(2)
    a, b = f"roll-a-{tag}", f"roll-b-{tag}"
    # The machines' logs and records, beside the database's data.
    machines = ProcessBackend(
        data_dir.parent / f"roll-machines-{tag}", {**values, "LANE_WORKER_LOG_FORMAT": "json"}
    )
    client = await LaneClient.connect(env=values, as_app=False)
    scaler = Scaler(client, machines, health_port=0)
    try:
        await client.migrate()
        ok = False
        async with anyio.create_task_group() as tg:
            tg.start_soon(scaler.run, values[DATABASE_URL_ENV])
            with anyio.CancelScope() as story:

                async def interrupted() -> None:
                    # Ctrl-C (or SIGTERM) reaches the scaler's signal handler: the
                    # story stops too, rather than wait for a rollout nobody drives.
                    await scaler.stop.wait()
                    story.cancel()

                tg.start_soon(interrupted)
                try:
                    ok = await _story(client, values, machines, a, b, app_spec)
                finally:
                    scaler.stop.set()
        if story.cancelled_caught:
            _say("interrupted: the roll's machines and database are removed")
        return 0 if ok else 1
    finally:
        for m in await machines.list():
            await machines.destroy(m)
        shutil.rmtree(machines.state_dir, ignore_errors=True)  # the demo's machines and logs
        await client.close()


async def _ready(client: LaneClient, release: str, want: int) -> None:
    deadline = time.monotonic() + ROLL_TIMEOUT_S
    while time.monotonic() < deadline:
        views, _ = await client.releases.list()
        if any(v.release_id == release and v.ready_workers >= want for v in views):
            return
        await anyio.sleep(0.5)
    raise TimeoutError(f"release {release} had no {want} ready machine(s) in time")


async def _story(
    client: LaneClient,
    values: dict[str, str],
    machines: ProcessBackend,
    a: str,
    b: str,
    app_spec: str,
) -> bool:
    _say(f"deploying release {a} (1 machine, app {app_spec})")
    await client.releases.deploy(a, image=app_spec, machines=1)
    await _ready(client, a, 1)
    _say(f"{a} is ready; submitting work to its lane")
    async with await LaneClient.connect(
        env={**values, "DEEPLINE_RUNTIME_DEPLOY_VERSION": a}, as_app=False
    ) as on_a:
        naps = [(await on_a.submit("nap", {"seconds": 8})).run_id for _ in range(2)]
        waiting = (await on_a.submit("approval", {"order": "R-1"})).run_id
        greeted = (await on_a.submit("greet", {"name": "roll"})).run_id
        await anyio.sleep(2)
        for run_id in [*naps, waiting]:
            _say(f"  run {run_id}: {(await on_a.status(run_id)).status} on {a}")

        _say(f"deploying release {b}: the scaler starts its machine, then retires {a}")
        await client.releases.deploy(b, image=app_spec, machines=1)
        state = await client.releases.wait_rolled_out(b, timeout_s=ROLL_TIMEOUT_S)
        if not state.done:
            _say(f"the rollout did not finish: {state.reason}")
            return False
        _say(f"{b} is ready and current; {a} is retired (draining: parked runs go to {b})")
        await on_a.signal(waiting, "approved", {"by": "dev --roll"})
        ok = True
        for run_id in [*naps, waiting, greeted]:
            final = await on_a.wait(run_id, ROLL_TIMEOUT_S)
            how = (
                f"adopted by {final.adopted_release_id}"
                if final.adopted_release_id
                else f"on {final.release_id}"
            )
            _say(f"  run {run_id}: {final.status} ({how})")
            ok = ok and final.status == "completed"

        deadline = time.monotonic() + ROLL_TIMEOUT_S
        while [m for m in await machines.list() if m.release_id == a]:
            if time.monotonic() > deadline:
                _say(f"{a}'s machine was not removed in time")
                return False
            await anyio.sleep(0.5)
        _say(f"{a} is drained: its machine was stopped and removed. Rolled out to {b}.")
        return ok
