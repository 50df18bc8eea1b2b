"""LANE_WORKER_PROCESSES: N daemons of one release under one supervisor, real processes.

The supervisor is what an orchestrator starts and signals: its SIGTERM drains
every process, one process that dies takes the machine down whole (the others
drain), a supervisor SIGKILLed leaves no worker behind, and a bad value is
refused as every other variable is (exit 78, naming it).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support.daemon import Daemon, Daemons
from support.runtime import eventually, open_client
from worker.client import LaneClient

RELEASE = "rel-procs"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
TWO = {"LANE_WORKER_PROCESSES": "2"}


async def both_ready(d: Daemon) -> None:
    """Wait until both processes logged ``worker.ready``."""

    async def ready() -> bool:
        return len(d.events("worker.ready")) == 2

    await eventually(ready, timeout_s=60, what="two worker.ready lines")


def pid_of(worker_id: str) -> int:
    """The process id in a worker id (``release@host:pid:nonce``)."""
    return int(worker_id.split(":")[-2])


def alive(pid: int) -> bool:
    """Tell whether ``pid`` runs (an exited process its new parent has not reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def busy_on_both(d: Daemon, client: LaneClient, tmp_path: Path, seconds: float) -> list[str]:
    """Submit slow runs until both processes run some; return the run ids.

    Enough that both take some: each claims at most its concurrency, 8.
    """
    workers = {r["worker_id"] for r in d.events("worker.ready")}
    runs = []
    for i in range(12):
        (tmp_path / str(i)).mkdir()
        run = await client.submit("slow", {"dir": str(tmp_path / str(i)), "seconds": seconds})
        runs.append(run.run_id)

    async def both_busy() -> bool:
        return {r["worker_id"] for r in d.events("run.started")} == workers

    await eventually(both_busy, timeout_s=30, what="runs started on both processes")
    return runs


async def draining(d: Daemon, workers: set[str]) -> None:
    """Wait until each of ``workers`` logged the signal that started its drain."""

    async def all_signalled() -> bool:
        return workers <= {r["worker_id"] for r in d.events("worker.signal")}

    await eventually(all_signalled, timeout_s=10, what=f"{len(workers)} processes draining")


@pytest.mark.timeout(120)
async def test_two_processes_run_the_lane_and_a_sigterm_drains_both(
    database_url: str, tmp_path: Path
) -> None:
    """Two workers of the release; runs in flight on each finish before both exit 0."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="20", **TWO)

        await both_ready(d)
        workers = {r["worker_id"] for r in d.events("worker.ready")}
        assert len(workers) == 2
        assert len({pid_of(w) for w in workers} | {d.pid}) == 3
        ports = {r["health_port"] for r in d.events("worker.ready")}
        assert len(ports) == 2  # the second serves its own, free port

        runs = await busy_on_both(d, client, tmp_path, seconds=3)
        d.terminate()
        assert await d.wait_exit(60) == 0
        assert {r["worker_id"] for r in d.events("worker.signal")} == workers
        assert {r["worker_id"] for r in d.events("worker.stopped")} == workers
        # What was in flight finished in the drain; nothing ran on a spent attempt.
        statuses = [await client.status(run_id) for run_id in runs]
        done = [s for s in statuses if s.status == "completed"]
        assert done
        assert all(s.status in ("completed", "queued") for s in statuses)
        assert all(len(s.attempts) <= 1 for s in statuses)


@pytest.mark.timeout(120)
async def test_one_process_that_dies_stops_the_machine_whole(database_url: str) -> None:
    """SIGKILL one worker: the supervisor drains the other and exits 128 + 9."""
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, **TWO)

        await both_ready(d)
        victim, other = (r["worker_id"] for r in d.events("worker.ready"))
        os.kill(pid_of(victim), 9)
        assert await d.wait_exit(60) == 128 + 9
        assert d.events("worker.stopped", worker_id=other)
        assert not alive(pid_of(other))


@pytest.mark.timeout(120)
async def test_the_machines_sigterm_after_a_process_died_does_not_cut_the_others_drain(
    database_url: str, tmp_path: Path
) -> None:
    """One process dies, the supervisor drains the other; the orchestrator's SIGTERM then
    must not reach it as a second stop (an exit without a drain, its runs' attempts spent)."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="20", **TWO)
        await both_ready(d)
        await busy_on_both(d, client, tmp_path, seconds=3)
        victim, other = (r["worker_id"] for r in d.events("worker.ready"))
        os.kill(pid_of(victim), signal.SIGKILL)

        await draining(d, {other})
        d.terminate()
        assert await d.wait_exit(60) == 128 + 9
        assert not d.events("worker.exit_now")
        assert d.events("worker.stopped", worker_id=other)
        # Its runs finished in its drain: none was left to a lease's end.
        mine = {r["run_id"] for r in d.events("run.started", worker_id=other)}
        finished = {r["run_id"] for r in d.events("run.completed", worker_id=other)}
        assert mine
        assert mine == finished


@pytest.mark.timeout(120)
async def test_a_supervisor_killed_mid_drain_leaves_its_processes_draining(
    database_url: str, tmp_path: Path
) -> None:
    """Their death signal (SIGHUP) drains, and never turns a drain under way into an exit."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="20", **TWO)
        await both_ready(d)
        runs = await busy_on_both(d, client, tmp_path, seconds=3)
        workers = [r["worker_id"] for r in d.events("worker.ready")]
        d.terminate()

        await draining(d, set(workers))
        d.kill()

        async def all_gone() -> bool:
            return not any(alive(pid_of(w)) for w in workers)

        await eventually(all_gone, timeout_s=60, what="both workers to finish their drain")
        assert not d.events("worker.exit_now")
        assert {r["worker_id"] for r in d.events("worker.stopped")} == set(workers)
        statuses = {(await client.status(run_id)).status for run_id in runs}
        assert statuses <= {"completed", "queued"}, statuses  # finished, or handed back


@pytest.mark.timeout(120)
async def test_a_stop_sent_to_the_supervisor_and_its_processes_at_once_is_one_drain(
    database_url: str, tmp_path: Path
) -> None:
    """systemd's control-group kill (and pkill) signal every process of the machine at once:
    each process still drains once and hands its runs back, and the machine exits 0."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="1", **TWO)
        await both_ready(d)
        runs = await busy_on_both(d, client, tmp_path, seconds=30)
        workers = [r["worker_id"] for r in d.events("worker.ready")]
        for pid in (d.pid, *(pid_of(w) for w in workers)):
            os.kill(pid, signal.SIGTERM)
        assert await d.wait_exit(60) == 0
        assert not d.events("worker.exit_now")
        assert {r["worker_id"] for r in d.events("worker.stopped")} == set(workers)
        for run_id in runs:  # handed back at the drain's end: no attempt spent
            status = await client.status(run_id)
            assert status.status == "queued", status
            assert len(status.attempts) <= 1, status


@pytest.mark.timeout(120)
async def test_a_sighup_to_the_supervisor_drains_the_machine(database_url: str) -> None:
    """A hang-up is a stop like SIGTERM (it died at once, leaving its processes behind)."""
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, **TWO)
        await both_ready(d)
        workers = {r["worker_id"] for r in d.events("worker.ready")}
        os.kill(d.pid, signal.SIGHUP)
        assert await d.wait_exit(60) == 0
        assert {r["worker_id"] for r in d.events("worker.stopped")} == workers


@pytest.mark.timeout(120)
async def test_a_second_sigterm_to_the_supervisor_still_exits_at_once(
    database_url: str, tmp_path: Path
) -> None:
    """The operator who asks twice gets out now (each process: worker.exit_now, exit 1)."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_DRAIN_SECONDS="30", **TWO)
        await both_ready(d)
        await busy_on_both(d, client, tmp_path, seconds=30)
        workers = {r["worker_id"] for r in d.events("worker.ready")}
        d.terminate()

        await draining(d, workers)
        d.terminate()
        assert await d.wait_exit(20) == 1
        assert {r["worker_id"] for r in d.events("worker.exit_now")} == workers


@pytest.mark.timeout(120)
async def test_a_supervisor_pid_set_by_hand_changes_nothing_and_is_warned_of(
    database_url: str, tmp_path: Path
) -> None:
    """A lone daemon with LANE_WORKER_SUPERVISOR_PID set keeps its own stop rules (a second
    SIGTERM exits at once) and says the variable is ignored; it took the supervised rules."""
    async with Daemons(database_url) as pool, open_client(database_url, ENV) as client:
        d = pool.start(RELEASE, LANE_WORKER_SUPERVISOR_PID="999999")
        await d.ready()
        (tmp_path / "run").mkdir()
        run_id = (await client.submit("slow", {"dir": str(tmp_path / "run"), "seconds": 30})).run_id

        async def started() -> bool:
            return bool(d.events("run.started", run_id=run_id))

        await eventually(started, timeout_s=30, what="the run started")
        d.terminate()

        await draining(d, {r["worker_id"] for r in d.events("worker.ready")})
        d.terminate()
        assert await d.wait_exit(20) == 1
        assert d.events("worker.exit_now")
        warned = [str(r.get("message", "")) for r in d.events("config.warning")]
        assert any("LANE_WORKER_SUPERVISOR_PID" in w for w in warned), warned


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(c) for c in text.split()]


@pytest.mark.timeout(180)
async def test_a_sigterm_while_the_processes_start_stops_every_one(database_url: str) -> None:
    """A stop that lands while the supervisor starts its processes reaches the ones after it.

    The signal handler could run inside ``Popen``, before the new process was in
    the supervisor's list: that one never heard of the stop, and the supervisor
    waited for it for good. A process the stop reaches before its own handler is
    installed ends by the signal; it claimed nothing, so the machine exits 0.
    """
    async with Daemons(database_url) as pool:
        for attempt in range(6):
            d = pool.start(RELEASE, name=f"starting-{attempt}", LANE_WORKER_PROCESSES="4")

            async def first_started(pid: int = d.pid) -> bool:
                return bool(children_of(pid))

            await eventually(first_started, timeout_s=30, what="the first process")
            d.terminate()
            assert await d.wait_exit(30) == 0
            assert not children_of(d.pid)


@pytest.mark.timeout(120)
async def test_a_stopped_process_is_continued_to_drain(database_url: str) -> None:
    """A SIGSTOPped worker gets the SIGTERM and a SIGCONT: the machine still stops, exit 0."""
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, **TWO)

        await both_ready(d)
        workers = [r["worker_id"] for r in d.events("worker.ready")]
        os.kill(pid_of(workers[0]), signal.SIGSTOP)
        d.terminate()
        assert await d.wait_exit(60) == 0
        assert {r["worker_id"] for r in d.events("worker.stopped")} == set(workers)


@pytest.mark.timeout(120)
async def test_a_sigkilled_supervisor_leaves_no_worker_running(database_url: str) -> None:
    """Its processes are told to stop when it dies (they drain, then exit)."""
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, **TWO)

        await both_ready(d)
        pids = [pid_of(r["worker_id"]) for r in d.events("worker.ready")]
        d.kill()
        await d.wait_exit(30)

        async def all_gone() -> bool:
            return not any(alive(p) for p in pids)

        await eventually(all_gone, timeout_s=30, what="both workers to exit")


@pytest.mark.parametrize("value", ["0", "two", "65", "2_0"])
@pytest.mark.timeout(60)
async def test_a_bad_process_count_is_refused_naming_it(database_url: str, value: str) -> None:
    async with Daemons(database_url) as pool:
        d = pool.start(RELEASE, LANE_WORKER_PROCESSES=value)
        assert await d.wait_exit(30) == 78
        assert "LANE_WORKER_PROCESSES" in d.stderr + "".join(map(str, d.records))
