"""``lane-worker dev``: embedded Postgres, a worker and the demo runs, watched in a terminal."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import anyio
import click

from worker import demo, lanes
from worker.app import App
from worker.client import LaneClient, RunReport, lanes_table
from worker.config.env import DATABASE_URL_ENV, HEALTH_PORT_ENV, LOG_FORMAT_ENV, blank_as_unset
from worker.config.settings import Settings
from worker.daemon import boot
from worker.daemon.supervisor import Supervisor
from worker.dev.embedded import embedded_postgres, other_users
from worker.errors import EXIT_FAILURE, LaneConfigError, shown

DEMO_APP = "worker.demo:app"
DEMO_TIMEOUT_S = 120.0
_WATCH_EVERY_S = 0.25


def run_dev(env: Mapping[str, str], app_spec: str, *, exit_after_demo: bool, data_dir: Path) -> int:
    """Run embedded Postgres (unless a URL is set), a worker and the demo; return the exit code."""
    refusal = release_lane_refusal(env)
    if refusal is not None:  # before embedded PostgreSQL starts: nothing to stop
        return boot.refuse(refusal)
    values = dict(env)
    # A second worktree's dev worker must not collide on the health port.
    # Blank counts as unset, as everywhere, so it gets dev's default.
    for name, default in ((HEALTH_PORT_ENV, "0"), (LOG_FORMAT_ENV, "console")):
        if blank_as_unset(values, name) is None:
            values[name] = default
    embedded = not (values.get(DATABASE_URL_ENV) or "").strip()
    with contextlib.ExitStack() as stack:
        try:
            values[DATABASE_URL_ENV] = stack.enter_context(database_for_dev(values, data_dir))
        except RuntimeError as exc:  # embedded Postgres is not installed, or did not start
            return boot.refuse(exc)

        async def serve(settings: Settings, app: App) -> int:
            return await _dev_main(settings, app, values, exit_after_demo, embedded)

        # The boot `run` does, on these values; inside the stack, so a refusal is said
        # before PostgreSQL stops.
        return boot.run_worker(values, app_spec, serve)


def release_lane_refusal(env: Mapping[str, str]) -> LaneConfigError | None:
    """Refuse a deploy version without a queue suffix: it names a release's lane, not a dev one.

    A leftover DEEPLINE_RUNTIME_DEPLOY_VERSION (a shell that deployed) would make this
    dev worker serve the release's queue on a shared database, adopt its parked runs and
    send the demo runs to its machines.
    """
    version = blank_as_unset(env, lanes.RELEASE_ID_ENV)
    if version is None or blank_as_unset(env, lanes.QUEUE_SUFFIX_ENV) is not None:
        return None  # a suffix outranks the deploy version: a dev lane all the same
    return LaneConfigError(
        f"lane-worker dev serves a dev lane, but {lanes.RELEASE_ID_ENV}={shown(version)} is "
        f"set without {lanes.QUEUE_SUFFIX_ENV} and names that release's lane: unset it (or "
        f"set {lanes.QUEUE_SUFFIX_ENV}), or use `lane-worker run` to serve the release.",
        variable=lanes.RELEASE_ID_ENV,
    )


def _say_where(supervisor: Supervisor, embedded: bool) -> None:
    """Tell how to reach this dev worker: its lanes page, and the database for a second terminal."""
    settings = supervisor.settings
    click.echo(f"dev: lanes page at http://127.0.0.1:{supervisor.health_port}/")
    suffix = (
        f"DEEPLINE_ABSURD_QUEUE_SUFFIX={settings.queue_suffix} " if settings.queue_suffix else ""
    )
    if embedded:
        # The embedded server takes no password (a unix socket only): safe to show.
        where = f"WORKFLOW_RUNTIME_POSTGRES='{settings.database_url}' {suffix}"
    else:
        where = f"{suffix}(with your WORKFLOW_RUNTIME_POSTGRES) "
    click.echo(f"dev: from another terminal: {where}lane-worker submit PLAY | status RUN | lanes")


@contextlib.contextmanager
def database_for_dev(values: dict[str, str], data_dir: Path) -> Iterator[str]:
    url = (values.get(DATABASE_URL_ENV) or "").strip()
    if url:
        yield url
        return
    click.echo(f"dev: starting embedded PostgreSQL in {data_dir} ...")
    with embedded_postgres(data_dir) as embedded_url:
        sharing = other_users(data_dir)
        click.echo(
            f"dev: PostgreSQL is up, shared with {_pids(sharing)} (it stops when the last "
            "of them exits)"
            if sharing
            else "dev: PostgreSQL is up (it stops when lane-worker dev exits)"
        )
        yield embedded_url
    # The server stops only when its last user leaves (issue 31: a second dev said
    # "stopped" of the server the first one still used).
    left = other_users(data_dir)
    click.echo(
        f"dev: PostgreSQL left running for {_pids(left)}, which still uses it"
        if left
        else "dev: PostgreSQL stopped"
    )


def _pids(pids: list[int]) -> str:
    return ("process " if len(pids) == 1 else "processes ") + ", ".join(map(str, pids))


async def _dev_main(
    settings: Settings, app: App, env: dict[str, str], exit_after_demo: bool, embedded: bool
) -> int:
    supervisor = Supervisor(settings, app, dev=True)
    outcome = {"demo": 0}
    async with anyio.create_task_group() as tg:

        async def demo_then_maybe_stop() -> None:
            outcome["demo"] = await _demo(supervisor, app, env, embedded)
            if exit_after_demo:
                supervisor.request_stop()

        tg.start_soon(demo_then_maybe_stop)
        code = await supervisor.main()
        tg.cancel_scope.cancel()
    if code == 0 and exit_after_demo:
        return outcome["demo"]
    return code


async def _demo(supervisor: Supervisor, app: App, env: dict[str, str], embedded: bool) -> int:
    """Submit the demo runs, signal their waits, print their progress; 0 when all completed."""
    await supervisor.ready.wait()
    _say_where(supervisor, embedded)
    if app is not demo.app:
        # The demo's inputs are for the demo's plays: an app's own `greet` or `approval`
        # must never run on them (nor be signalled as the demo's approval is).
        click.echo(
            f"dev: the demo runs are submitted only with the demo app ({DEMO_APP}); "
            "this worker serves your app, nothing submitted"
        )
        return 0
    runs = demo.DEMO_RUNS
    # The environment boot parsed, as it parsed it.
    diagnosis = supervisor.settings.diagnosis
    async with await LaneClient.connect(env=env, diagnosis=diagnosis, as_app=False) as client:
        submitted = [(play, (await client.submit(play, params)).run_id) for play, params in runs]
        click.echo(f"dev: submitted {len(submitted)} demo runs to {supervisor.settings.queue}")
        last: dict[str, str] = {}
        signalled: set[str] = set()
        deadline = time.monotonic() + DEMO_TIMEOUT_S
        while True:
            statuses = [await client.status(run_id) for _, run_id in submitted]
            for (play, run_id), status in zip(submitted, statuses, strict=True):
                if last.get(run_id) != status.status:
                    last[run_id] = status.status
                    click.echo(_progress_line(play, status))
                waiting = status.status == "waiting" and run_id not in signalled
                if waiting and play in demo.DEMO_SIGNALS:
                    key, data = demo.DEMO_SIGNALS[play]
                    await client.signal(run_id, key, data)
                    signalled.add(run_id)
                    click.echo(f"dev: signalled {key!r} to {play} ({run_id})")
            if all(s.finished for s in statuses) or time.monotonic() > deadline:
                break
            await anyio.sleep(_WATCH_EVERY_S)
        click.echo("\n".join(lanes_table(await client.lanes())))
    failed = [s for s in statuses if s.status != "completed"]
    if failed:
        click.echo(f"dev: {len(failed)} demo run(s) did not complete", err=True)
        return EXIT_FAILURE
    click.echo("dev: every demo run completed")
    return 0


def _progress_line(play: str, status: RunReport) -> str:
    detail = ""
    if status.status == "completed":
        detail = f" -> {status.output}"
    elif status.status in ("failed", "retrying") and status.error:
        detail = f" ({status.error.get('message')})"
    return f"dev: {play:<11} {status.run_id}  {status.status}{detail}"
