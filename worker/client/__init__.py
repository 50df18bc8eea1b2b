"""``LaneClient``: submit, signal, cancel and inspect runs (the app and the CLI use it).

A submit stamps the run with its release, writes the launch row and spawns the
engine task in one transaction, so a run either exists in both or in neither.
A ``NOTIFY lane_worker_<queue>`` goes with every submit and signal (delivered
at commit) so a listening worker starts at once; it is a hint, polling is the
guarantee.

``submit``, ``signal``, ``cancel`` and ``status`` are each one call of the store's
SQL API (``submit_run``, ...: worker/sql/store/0008_sql_api.sql), the same
functions an app in any language calls; what they return is in ``results.py``.
The operator's calls (lanes, their report, the remedies in ``worker/ops``) are
``operator.py``'s ``OperatorCalls``, which ``LaneClient`` inherits.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import asyncpg

from worker import lanes
from worker.client import results
from worker.client.bulk import SubmitRequest as SubmitRequest  # public API
from worker.client.bulk import named_release, submit_items
from worker.client.operator import OperatorCalls
from worker.client.results import AttemptView as AttemptView
from worker.client.results import RunnerReport as RunnerReport
from worker.client.results import RunReport as RunReport  # public API
from worker.client.results import SignalResult as SignalResult
from worker.client.results import StepView as StepView
from worker.client.results import SubmittedRun as SubmittedRun  # public API
from worker.client.results import WorkerRelease as WorkerRelease
from worker.client.schemas import SchemaCalls
from worker.config import settings
from worker.config.dburl import url_problem
from worker.db import engine, role_check
from worker.db.pool import Connection, Database, PoolOptions
from worker.db.store import MigrationReport as MigrationReport  # public API
from worker.db.store import Store
from worker.db.tasks import LANES_CHANNEL as LANES_CHANNEL
from worker.errors import InvalidRequestError, LaneConfigError, shown
from worker.errors import SchemasMissingError as SchemasMissingError  # what check_schemas raises
from worker.errors import UnknownLaneError as UnknownLaneError
from worker.limits import (
    checked_input,
    checked_key,
    checked_max_attempts,
    checked_payload,
    checked_play,
    checked_runtime_api,
)
from worker.ops.lane_view import BUCKETS as BUCKETS
from worker.ops.lane_view import LaneView as LaneView  # re-exported: part of the client's API
from worker.ops.lanes_text import lanes_table as lanes_table
from worker.ops.prune import LanePruning
from worker.ops.releases import Releases
from worker.ops.remedies import Remedies, parse_run_id
from worker.ops.remedy_results import MoveReport as MoveReport  # what the operator's calls return
from worker.ops.remedy_results import RetriedRun as RetriedRun
from worker.ops.remedy_results import RunSummary as RunSummary
from worker.ops.report import read_report as read_report

# The variables every client call depends on; a refusal among them stops connect().
CONNECT_VARIABLES = (
    settings.DATABASE_URL_ENV,
    lanes.SCHEDULER_SCHEMA_ENV,
    settings.STORE_SCHEMA_ENV,
    lanes.QUEUE_SUFFIX_ENV,
    settings.PGBOUNCER_ENV,
    settings.SERVERLESS_ENV,
)
# What a submit on the process's own lane reads besides them.
SUBMIT_VARIABLES = (lanes.RELEASE_ID_ENV, settings.MAX_ATTEMPTS_ENV)

if TYPE_CHECKING:
    from worker.client.results import RunStatus as RunStatus  # deprecated: RunReport


def __getattr__(name: str) -> Any:
    return results.deprecated_name(__name__, name)


class LaneClient(SchemaCalls, OperatorCalls):
    """Submit, signal, cancel and inspect runs on one runtime database."""

    def __init__(
        self,
        db: Database,
        store: Store,
        *,
        env: Mapping[str, str],
        schemas_installed: bool = False,
        diagnosis: settings.Diagnosis | None = None,
    ) -> None:
        """``schemas_installed``: the caller (the daemon, after boot) has migrated both.

        ``diagnosis``: ``env`` as the caller parsed it already (parsed here otherwise).
        """
        self._schemas_installed = schemas_installed
        self.db = db
        self.store = store
        self._env = env
        # One parser for the daemon, the CLI and the client: settings.diagnose, once.
        self._diagnosis = diagnosis if diagnosis is not None else settings.diagnose(env)
        self._max_attempts = self._diagnosis.tuning.max_attempts
        self._ready: dict[str, asyncio.Task[None]] = {}
        self._schemas_ready: asyncio.Task[None] | None = None
        self._schemas_checked: asyncio.Task[None] | None = None
        self.remedies = Remedies(db, store, self.check_schemas)
        self.pruning = LanePruning(db, store, self.check_schemas)
        # The release registry (`lane-worker releases`): deploy, roll back, list, wait.
        self.releases = Releases(db, store, self.check_schemas)

    def _refuse_on(self, variables: tuple[str, ...]) -> None:
        for error in self._diagnosis.errors:
            if error.variable in variables:
                raise error

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        schema: str | None = None,
        env: Mapping[str, str] | None = None,
        retry_for_s: float = 30.0,
        diagnosis: settings.Diagnosis | None = None,
        as_app: bool = True,
    ) -> LaneClient:
        """Connect with ``url`` (default ``WORKFLOW_RUNTIME_POSTGRES``) to store ``schema``.

        Connection errors are retried for ``retry_for_s`` seconds (here and on every call).
        ``diagnosis``: ``env`` as the caller parsed it already (the CLI), used as it is.
        ``as_app``: an app's client, which a deployed release's process should connect
        with the app's role (``db.role_broad`` warns once otherwise); False for the CLI.
        """
        values = dict(os.environ if env is None else env)
        # An explicit url or schema stands for the variable: check it by the same rules.
        if url is not None:
            values[settings.DATABASE_URL_ENV] = url
        if schema is not None:
            values[lanes.SCHEDULER_SCHEMA_ENV] = schema
        if diagnosis is None or url is not None or schema is not None:
            diagnosis = settings.diagnose(values)
        for error in diagnosis.errors:
            if error.variable in CONNECT_VARIABLES:
                if error.variable == settings.DATABASE_URL_ENV and url is not None:
                    problem = url_problem(url.strip()) or "is blank: pass the database's URL"
                    raise LaneConfigError(f"url= {problem}.", variable=error.variable)
                raise error
        db = await Database.open(
            PoolOptions(
                url=values[settings.DATABASE_URL_ENV].strip(),
                max_size=diagnosis.client_pool_size,
                application_name="lane-worker-client",
                pgbouncer=diagnosis.tuning.pgbouncer,
                retry_for_s=retry_for_s,
            )
        )
        store = Store(diagnosis.store_schema)
        if as_app:
            release = lanes.launch_release_id(values)
            try:
                await db.run(
                    lambda c: role_check.warn_if_broad(
                        c, store.schema, part="app", release_id=release
                    )
                )
            except BaseException:
                await db.close()
                raise
        return cls(db, store, env=values, diagnosis=diagnosis)

    async def close(self) -> None:
        """Close the client's pool."""
        await self.db.close()

    async def __aenter__(self) -> LaneClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def ensure_queue(self, queue: str) -> None:
        """Make ``queue`` ready once per process (memoized, evicted on failure)."""
        await self.ensure_schemas()
        record = self.store.lanes.record_created_queue
        await self._memoized(
            queue, lambda: self.db.run(lambda c: engine.ensure_queue(c, queue, record=record))
        )

    async def submit(
        self,
        play: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        queue_suffix: str | None = None,
        runtime_api: Mapping[str, Any] | None = None,
        release_id: str | None = None,
        max_attempts: int | None = None,
    ) -> SubmittedRun:
        """Submit a run of ``play`` on this process's release lane (or a preview suffix's).

        One call of the store's ``submit_run`` (the app's SQL API). ``runtime_api``:
        where the run's ledger facts are delivered (``baseUrl``, ``executorToken``, ...).
        ``release_id``: that release's lane instead (``p_release_id``; not with a
        suffix); ``max_attempts``: this run's attempt budget, 1..1000 (``p_max_attempts``;
        default ``LANE_WORKER_MAX_ATTEMPTS``).
        Raises ``InvalidRequestError`` for an input that is not a JSON object of at
        most 1 MiB, a blank or over-long play or key, a suffix that names no queue or
        an unusable runtime API context; ``IdempotencyConflict`` when the key already
        names a different run.
        """
        play = checked_play(play)
        params = checked_input(input)
        checked_key(idempotency_key, "an idempotency key")
        api = checked_runtime_api(
            dict(runtime_api) if isinstance(runtime_api, Mapping) else runtime_api
        )
        attempts = checked_max_attempts(max_attempts)
        if release_id is None:
            release_id = self._submit_release(queue_suffix)
        else:
            release_id = named_release(release_id, queue_suffix)
        attempts = self._own_max_attempts() if attempts is None else attempts
        await self.ensure_schemas()

        async def submit(conn: Connection) -> dict[str, Any]:
            return await self.store.api.submit(
                conn,
                play=play,
                input=params,
                release_id=release_id,
                idempotency_key=idempotency_key,
                runtime_api=api,
                max_attempts=attempts,
            )

        try:
            made = await self.db.run(submit)
        except asyncpg.UndefinedTableError:
            # `lanes prune` dropped the queue between submit_run's check and its
            # spawn: the next call makes it again (a pruned lane that gets work
            # is a lane again), once.
            made = await self.db.run(submit)
        return SubmittedRun.from_json(made)

    async def submit_many(self, requests: Iterable[SubmitRequest]) -> list[SubmittedRun]:
        """Submit every request in one transaction: all runs are made, or none.

        One call of the store's ``submit_runs``; one ``SubmittedRun`` per request, in
        order. Each request is checked as ``submit`` checks its arguments, and refused
        with the same errors, their message starting ``item <index>: `` (0-based). A
        request whose idempotency key names a run answers that run (``created``
        False); a later request with the key of an earlier one answers the earlier's.
        """
        items = submit_items(
            requests,
            lambda r: (
                named_release(r.release_id, r.queue_suffix)
                if r.release_id is not None
                else self._submit_release(r.queue_suffix)
            ),
            self._own_max_attempts,
        )
        if not items:
            return []
        await self.ensure_schemas()

        async def submit(conn: Connection) -> list[Any]:
            return await self.store.api.submit_many(conn, items)

        try:
            made = await self.db.run(submit)
        except asyncpg.UndefinedTableError:
            made = await self.db.run(submit)  # a queue pruned meanwhile: as submit does
        return [SubmittedRun.from_json(m) for m in made]

    def _submit_release(self, queue_suffix: str | None) -> str:
        """The release a submit goes to: this process's, or the preview ``queue_suffix`` names."""
        if queue_suffix is None:  # LANE_WORKER_MAX_ATTEMPTS is the caller's to check
            self._refuse_on((lanes.RELEASE_ID_ENV,))
            return lanes.launch_release_id(self._env)
        if not isinstance(queue_suffix, str):
            raise InvalidRequestError(
                f"queue_suffix must be a string (or None), not {type(queue_suffix).__name__}."
            )
        if not lanes.normalize_queue_suffix(queue_suffix):
            # Falling back to the process's own lane would put the run elsewhere.
            raise InvalidRequestError(
                f"queue_suffix={shown(queue_suffix)} has no letter, digit or "
                "underscore, so it names no queue: pass the preview's suffix, or None for "
                "this process's lane."
            )
        return lanes.release_id_for_suffix(queue_suffix, self._env)

    def _own_max_attempts(self) -> int | None:
        """This process's ``LANE_WORKER_MAX_ATTEMPTS`` (read only when a submit needs it)."""
        self._refuse_on((settings.MAX_ATTEMPTS_ENV,))
        return self._max_attempts

    async def worker_release_id(
        self, queue_suffix: str | None = None, deploy_version: str | None = None
    ) -> WorkerRelease:
        """The release id a worker started with this suffix / deploy version serves, and its queue.

        One call of the store's ``worker_release_id`` (the lane rules, in SQL, for
        every language): a suffix outranks the deploy version (``dev-<suffix>``);
        else the deploy version as deployed; else ``dev``. ``InvalidRequestError``
        for what such a worker would refuse to boot with.
        """
        for name, value in (("queue_suffix", queue_suffix), ("deploy_version", deploy_version)):
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(
                    f"{name} must be a string (or None), not {type(value).__name__}."
                )
        await self.check_schemas()
        said = await self.db.run(
            lambda c: self.store.api.worker_release(
                c, queue_suffix=queue_suffix, deploy_version=deploy_version
            )
        )
        return WorkerRelease(said["releaseId"], said["queue"])

    async def signal(self, run_id: str, event_key: str, data: Any = None) -> SignalResult:
        """Deliver integration event ``event_key`` to a run; a duplicate is ignored (first wins).

        One call of the store's ``signal_run``: a retried run passes the event on
        to its retry; a failed or cancelled one keeps it for a retry of it.
        """
        checked_key(event_key, "an event key")
        if event_key is None:
            raise InvalidRequestError("signal needs an event key (a non-blank string).")
        checked_payload(data)
        await self.check_schemas()
        run_uuid = parse_run_id(run_id)
        said = await self.db.run(
            lambda c: self.store.api.signal(c, run_id=run_uuid, event_key=event_key, payload=data)
        )
        return SignalResult(
            run_id=said["runId"],
            event_key=event_key,
            duplicate=said["duplicate"],
            run_ended=said["runEnded"],
            delivered_to=said["deliveredTo"],
            kept_for_retry=said["keptForRetry"],
        )

    async def cancel(self, run_id: str, *, reason: str | None = None) -> bool:
        """Cancel a run (the store's ``cancel_run``); return False when it had already ended."""
        return await self.remedies.cancel_run(run_id, reason=reason)

    async def report_runner_result(
        self, run_id: str, runner_attempt: int, result: Any = None
    ) -> RunnerReport:
        """Record what detached runner attempt ``runner_attempt`` of a run came to.

        Wakes the run when it waits for that attempt; a late report (its wait timed
        out, a newer attempt replaced it, the run ended) is recorded and ignored.
        """
        if isinstance(runner_attempt, bool) or not isinstance(runner_attempt, int):
            raise InvalidRequestError("a runner attempt is a whole number (1, 2, ...).")
        checked_payload(result)
        await self.check_schemas()
        run_uuid = parse_run_id(run_id)
        said = await self.db.run(
            lambda c: self.store.api.report_runner(
                c, run_id=run_uuid, runner_attempt=runner_attempt, result=result
            )
        )
        return RunnerReport(
            run_id=said["runId"],
            runner_attempt=said["runnerAttempt"],
            recorded=said["recorded"],
            duplicate=said["duplicate"],
            woke=said["woke"],
            reason=said["reason"],
        )

    async def status(self, run_id: str) -> RunReport:
        """Return a run's status, attempts, steps and result (the store's ``run_status``)."""
        await self.check_schemas()
        run_uuid = parse_run_id(run_id)
        return RunReport.from_json(
            await self.db.run(lambda c: self.store.api.status(c, run_id=run_uuid))
        )

    async def wait(self, run_id: str, timeout: float, *, poll_s: float = 0.2) -> RunReport:  # noqa: ASYNC109 (design API)
        """Wait until the run finishes or ``timeout`` seconds pass; return its last status."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            current = await self.status(run_id)
            if current.finished or asyncio.get_running_loop().time() >= deadline:
                return current
            await asyncio.sleep(poll_s)
