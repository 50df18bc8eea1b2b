"""The gate before promotion (issue 32 §1), driven by the active scaler each pass.

A gated deploy records its release as the ``candidate`` (store migration 0050): the
current release stays current while the plan starts the candidate's machines. Once
they are all ready, each gate run is submitted on the candidate's lane (stamped with
its release id, one attempt) and awaited across passes:

- every gate run completed: the candidate becomes current (``gate_passed``); the
  plan then retires what it supersedes, as for any deploy;
- one failed or was cancelled, or the gate's timeout passed (its clock starts, in
  the store, when its runs are first submitted): the unfinished ones are cancelled,
  then the candidate is retired (``gate_failed``): its lane drains and its machines
  go, the current release untouched.

Nothing here is kept in memory: a scaler SIGKILLed at any step and started again (or
a standby taking over) finds the same runs, because each run's idempotency key is
derived from the deployment (release and deployed_at) and the gate's index and play
(``lane-worker-gate:...``: the run list tells gate runs apart by it), and every
decision in the store is conditional on that deployment being still an undecided
candidate. A held registry (``releases hold``) decides nothing: the gate waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from worker.client import LaneClient
from worker.client.results import RunReport, SubmittedRun
from worker.db.store.rows import Deployment
from worker.errors import InvalidRequestError
from worker.states import RunStatus

GATE_KEY_PREFIX = "lane-worker-gate:"

log = structlog.get_logger("lane_worker.scaler")


def gate_key(d: Deployment, index: int, play: str) -> str:
    """The idempotency key of gate run ``index`` of deployment ``d``: the same on every
    pass and every scaler, a new one for each deploy (its deployed_at)."""
    stamp = f"{d.deployed_at.timestamp():.6f}"
    return f"{GATE_KEY_PREFIX}{d.release_id}:{stamp}:{index}:{play}"


class Gates:
    """Decides each undecided candidate's gate, one step per pass."""

    def __init__(
        self, client: LaneClient, *, actor: str, guard: Callable[[], Awaitable[object]]
    ) -> None:
        self.client, self.actor, self.guard = client, actor, guard

    async def once(self) -> None:
        db, registry = self.client.db, self.client.store.registry
        for d in await db.run(registry.deployments):
            if d.role == "candidate" and d.gate_outcome is None and d.gate:
                await self._step(d)

    async def _step(self, d: Deployment) -> None:
        db, registry = self.client.db, self.client.store.registry
        if d.ready_workers < max(d.desired, 1):
            return  # its machines first: `releases` says it waits for them
        await self.guard()  # only the active scaler submits or decides
        age = await db.run(lambda c: registry.gate_begun(c, d))
        if age is None:
            return  # held, or no longer this undecided candidate
        runs: list[tuple[str, RunReport]] = []
        for index, gate in enumerate(d.gate or []):
            play = str(gate.get("play"))
            try:
                submitted = await self._submit(d, index, play)
            except InvalidRequestError as exc:
                # The store refuses it for good (its lane, its input): no pass would do better.
                await self._fail(d, "", f"gate run of {play} was refused: {exc}")
                return
            if submitted.created:
                log.info("scaler.gate_submitted", release=d.release_id, run=submitted.run_id,
                         play=play)  # fmt: skip
            runs.append((play, await self._status(submitted.run_id)))
        unfinished = [(p, r) for p, r in runs if not RunStatus(r.status).terminal]
        timeout_s = float(d.gate_timeout_s or 0)
        if unfinished and age > timeout_s:
            # Cancelled before the verdict is recorded: a scaler killed in between
            # finds them cancelled and the clock still past the timeout.
            for _, r in unfinished:
                await self.guard()
                await self._cancel(r.run_id)
            play, first = unfinished[0]
            await self._fail(
                d,
                first.run_id,
                f"gate run {first.run_id} ({play}) did not complete within {timeout_s:g} s "
                "(cancelled)",
            )
            return
        bad = [(p, r) for p, r in runs if r.status in (RunStatus.FAILED, RunStatus.CANCELLED)]
        if bad:
            play, run = bad[0]
            # Its error stays the run's: the registry, which the viewer reads, names the run
            # (`releases deploy --wait` shows the error to whoever may read it).
            await self._fail(d, run.run_id, f"gate run {run.run_id} ({play}) {run.status}")
            return
        if unfinished:
            return
        await self.guard()
        ids = [r.run_id for _, r in runs]
        if await db.run(lambda c: registry.gate_passed(c, actor=self.actor, d=d, runs=ids)):
            log.info("scaler.gate_passed", release=d.release_id, runs=ids)

    # The gate's runs go through the store's gate functions (0051): the scaler's role may
    # call no SQL API, and these take only the candidate's own gate and the runs it made.
    async def _submit(self, d: Deployment, index: int, play: str) -> SubmittedRun:
        key = gate_key(d, index, play)
        said = await self.client.db.run(
            lambda c: self.client.store.registry.gate_submit_run(c, d=d, index=index, key=key)
        )
        return SubmittedRun.from_json(said)

    async def _cancel(self, run_id: str) -> None:
        await self.client.db.run(
            lambda c: self.client.store.registry.gate_cancel_run(
                c, run_id=run_id, reason="its deploy gate timed out"
            )
        )

    async def _status(self, run_id: str) -> RunReport:
        said = await self.client.db.run(
            lambda c: self.client.store.registry.gate_run_status(c, run_id=run_id)
        )
        return RunReport.from_json(said)

    async def _fail(self, d: Deployment, run_id: str, reason: str) -> None:
        db, registry = self.client.db, self.client.store.registry
        await self.guard()
        failed = await db.run(
            lambda c: registry.gate_failed(c, actor=self.actor, d=d, run_id=run_id, reason=reason)
        )
        if failed:
            log.warning("scaler.gate_failed", release=d.release_id, run=run_id, reason=reason)
