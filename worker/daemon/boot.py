"""The one boot of a worker process, for ``run`` and ``dev`` alike.

Before the event loop (``prepare``): the environment is parsed once (the boot
guard, 78 before any connection), the logs are configured with the database's
secrets masked, doctor's warnings are logged and the app is loaded (2). In the
event loop, first thing in ``Supervisor.main`` after the health port is bound:
``open_database`` (retrying an unreachable database for
``LANE_WORKER_BOOT_RETRY`` seconds, then 1) and ``install_and_register`` (both
schemas, the lane's queue, the lane's registration; 78 for a schema this build
cannot use or a lane that is retired and drained).

Each refusal is an exception from ``worker.errors``; ``run_worker`` says the one
that ends the process in one sentence on stderr and returns the exit code
``errors.exit_code_for`` gives it. Anything else goes up to the CLI.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import asyncpg
import structlog

from worker import lane_kinds
from worker.app import App, load_app
from worker.config.dburl import url_secrets
from worker.config.settings import Settings
from worker.daemon import logs
from worker.daemon.loops import prepare_queue
from worker.db import engine_schema, role_check
from worker.db.pool import Database, PoolOptions, is_transient
from worker.db.store import Store
from worker.errors import (
    AppLoadError,
    DatabaseUnreachableError,
    EngineSchemaError,
    LaneConfigError,
    LaneDrainedError,
    StoreSchemaError,
    exit_code_for,
    printable,
    sole_error,
)
from worker.lanes import QUEUE_SUFFIX_ENV, RELEASE_ID_ENV
from worker.states import LaneState, LaneStatus

log = structlog.get_logger("lane_worker.boot")

# What boot refuses with, said as written (each is one sentence already).
BOOT_REFUSALS = (
    LaneConfigError,
    AppLoadError,
    DatabaseUnreachableError,
    EngineSchemaError,
    StoreSchemaError,
    LaneDrainedError,
)


def say(sentence: str) -> None:
    """Print ``lane-worker: <sentence>`` on stderr."""
    # An undecodable byte from the environment must not crash the refusal.
    print(printable(f"lane-worker: {sentence}"), file=sys.stderr, flush=True)


def refuse(exc: Exception) -> int:
    """Say why the process cannot go on; return its exit code (``errors.exit_code_for``)."""
    say(str(exc))
    return exit_code_for(exc)


def prepare(env: Mapping[str, str], app_spec: str) -> tuple[Settings, App]:
    """Parse the environment (once), configure the logs, log doctor's warnings, load the app.

    Raises ``LaneConfigError`` (the boot guard) or ``AppLoadError``.
    """
    settings = Settings.from_env(env)
    # The page token is a secret as the database password is: masked wherever a log says it.
    token = (settings.page_token,) if settings.page_token else ()
    page_url = url_secrets(settings.page_database_url) if settings.page_database_url else ()
    secrets = (*url_secrets(settings.database_url), *page_url, *token)
    logs.configure(settings.tuning.log_format, secrets=secrets)
    for warning in settings.warnings:  # what doctor lists, such as a mistyped LANE_WORKER_*
        log.warning("config.warning", message=warning)
    try:
        app = load_app(app_spec)
    except (ImportError, ValueError) as exc:
        raise AppLoadError(f"cannot load the app {app_spec!r}: {exc}") from exc
    return settings, app


def loop_options(wanted: str) -> dict[str, Any]:
    """Return anyio's asyncio backend options for ``LANE_WORKER_EVENT_LOOP``.

    uvloop (libuv's loop, by asyncpg's authors) costs less CPU per run than
    asyncio's own loop. Where it cannot be imported (a platform without a wheel,
    an image built without it) the daemon runs on asyncio's loop and says so.
    """
    if wanted != "uvloop":
        return {"use_uvloop": False}
    try:
        import uvloop  # noqa: F401  # only to know it can be imported
    except ImportError as exc:
        log.warning("event_loop.fallback", wanted="uvloop", using="asyncio", error=str(exc))
        return {"use_uvloop": False}
    return {"use_uvloop": True}


def running_loop() -> str:
    """Name the event loop this process runs on: ``uvloop`` or ``asyncio`` (for worker.ready)."""
    return (
        "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    )


def run_worker(
    env: Mapping[str, str],
    app_spec: str,
    serve: Callable[[Settings, App], Awaitable[int]],
) -> int:
    """Boot from ``env`` and run ``serve`` in the event loop; return the exit code.

    A boot refusal (``BOOT_REFUSALS``), before or inside ``serve``, is said and
    mapped here; any other error is raised for the caller to map.
    """
    try:
        settings, app = prepare(env, app_spec)
        options = loop_options(settings.tuning.event_loop)
        return anyio.run(serve, settings, app, backend="asyncio", backend_options=options)
    except Exception as exc:
        refusal = sole_error(exc)  # a task group wraps the error that ended it
        if not isinstance(refusal, BOOT_REFUSALS):
            raise
        return refuse(refusal)


async def open_database(settings: Settings) -> Database:
    """Open the daemon's pool (2 connections), retrying an unreachable database.

    ``LANE_WORKER_BOOT_RETRY`` is the window, here and for every unit of work after.
    A connect error that is not an outage (a bad password) is raised at once.
    """
    retry_s = settings.tuning.boot_retry_s
    try:
        return await Database.open(
            PoolOptions(
                url=settings.database_url,
                max_size=2,
                application_name=f"lane-worker {settings.release_id}"[:63],
                pgbouncer=settings.tuning.pgbouncer,
                retry_for_s=retry_s,
            )
        )
    except Exception as exc:
        if not is_transient(exc) and not isinstance(exc, OSError):
            raise
        raise DatabaseUnreachableError(
            f"cannot reach the runtime database at {settings.database_url_redacted} "
            f"after {retry_s:g} s ({type(exc).__name__}); check "
            "WORKFLOW_RUNTIME_POSTGRES and that Postgres is up."
        ) from exc


async def install_and_register(db: Database, store: Store, settings: Settings) -> LaneState:
    """Install or upgrade both schemas, make the lane's queue, register the lane as claiming.

    Registration refuses (``LaneConfigError``, 78) a lane that holds a release id of
    the other kind: a worktree on a release's queue, a release on a worktree's.
    Registration never un-retires a release lane: a retired lane boots draining while
    runs only this release may run remain, and refuses (``LaneDrainedError``) once
    drained. A dev lane (a worktree's: every spelling ``dev`` or ``dev-...``) is no
    deploy: retired or pruned (by hand, or by maintenance once idle), its worker
    booting again makes it claim again, its engine queue made again if it was dropped.
    """
    s = settings
    # A deployed worker connecting as a superuser or the owner: said once (issue 33).
    await db.run(
        lambda c: role_check.warn_if_broad(c, store.schema, part="worker", release_id=s.release_id)
    )
    try:
        await db.run(store.refuse_conflicts)  # another system's store there: nothing is made
        await db.run(engine_schema.ensure_engine_schema)
        await db.run(store.migrate)
    except asyncpg.InsufficientPrivilegeError as exc:
        # A worker connecting as its own role (`lane-worker roles`, issue 33) may not
        # install: it runs on schemas the owner migrated, and only on current ones.
        current = await db.run(engine_schema.engine_schema_current) and await db.run(
            store.is_current
        )
        if not current:
            raise StoreSchemaError(
                f"this worker's database role may not install or upgrade the schemas "
                f"({exc.__class__.__name__}), and the engine schema or the store "
                f"{store.schema} is not at this build's version: run `lane-worker migrate` "
                "as the schemas' owner first.",
                found=0,
                known=0,
            ) from None
    # The lane's queue and its NOTIFY trigger (made by the owner for a worker role).
    await db.run(lambda c: prepare_queue(c, s.queue, store.lanes))
    status = await db.run(lambda c: store.lanes.register(c, queue=s.queue, release_id=s.release_id))
    if status is None:
        # A release's queue and a worktree's (same sanitized name) never share workers.
        held = await db.run(lambda c: store.lanes.spellings(c, queue=s.queue))
        raise LaneConfigError(
            lane_kinds.registration_refused(s.queue, s.release_id, held),
            variable=QUEUE_SUFFIX_ENV if lane_kinds.is_dev(s.release_id) else RELEASE_ID_ENV,
        )
    if status != LaneStatus.RETIRED:
        return LaneState.CLAIMING
    if await db.run(lambda c: store.lanes.activate_dev(c, queue=s.queue)):
        # A prune may have dropped the queue between ensure_queue and the activation
        # (it holds only while the lane is retired): make it again, now that it claims.
        await db.run(lambda c: prepare_queue(c, s.queue, store.lanes))
        log.info("lane.dev_activated", queue=s.queue, release_id=s.release_id)
        return LaneState.CLAIMING
    # Draining: its workers may boot (an orchestrator restarts a crashed machine
    # mid-drain) and finish what only they may run. Drained: no.
    if not await db.run(lambda c: store.lanes.draining_work(c, queue=s.queue)):
        raise LaneDrainedError(
            f"release lane {s.queue} ({s.release_id}) is retired and drained (nothing on "
            "it that only this release may run), so this worker will not start; run "
            f"`lane-worker lanes activate {s.release_id}` first if this release "
            "must take work again."
        )
    return LaneState.DRAINING
