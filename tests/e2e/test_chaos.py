"""Deploy-day chaos: three releases rolled over one database under random SIGKILLs.

Releases chaos-a, chaos-b and chaos-c are deployed one after another, two daemons
each, by the shared design's runbook: start the new release, retire the old one,
keep the old one's workers up while runs that only it may execute are left
(fresh, retrying, in flight, handed back mid-step: the lane is "draining"), then
SIGTERM them. New runs always go to the newest release. Meanwhile a random live
daemon is stopped every few seconds (mostly SIGKILL, sometimes SIGTERM, which
hands back steps still running after its 1 s drain window) and restarted, and
signals arrive at random moments (some before the run reaches its wait, some
twice, some held until two releases claim while their predecessor is retired).

Everything is then judged from the tables: the store (runs, attempts, ledger),
the engine's run rows and ``chaos_exec``, where every step execution leaves a
row (``support/apps/chaos.py``). ``LANE_WORKER_CHAOS_SEED`` replays a seed;
``LANE_WORKER_CHAOS_REPORT`` names a file that receives the figures table.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from support.apps.chaos import EXEC_TABLE_SQL, FAIL_ONCE_ERROR
from support.daemon import Daemon, Daemons
from support.runtime import open_client
from worker import lanes
from worker.client import LaneClient

RELEASES = ("chaos-a", "chaos-b", "chaos-c")  # as deployed (launch stamps), oldest first
# How the workers name their release (attempts, steps): as deployed (issue 31 §1).
CANON = {r: r for r in RELEASES}
RANK = {spelling: i for i, r in enumerate(RELEASES) for spelling in (r, CANON[r])}
WORKERS_PER_RELEASE = 2
TOTAL_RUNS = 300
PHASE_S = 14.0  # new runs go to each release for this long before the next one is deployed
BOTH_CLAIM_S = 6.0  # B and C both claim (A retired) before B retires: B's adopted runs wake then
KILL_EVERY_S = (2.5, 5.0)
TERM_P = 0.25  # of the stops, SIGTERM (drain, hand back) instead of SIGKILL
DRAIN_TIMEOUT_S = 60.0  # a retired lane drains within this (room for one 30 s defer)
FINAL_TIMEOUT_S = 40.0
FAIL_ONCE_P = 0.12
LINGER_P = 0.3
LONG_LINGER_P = 0.05  # longer than the drain window: a SIGTERM hands such a step back
EARLY_SIGNAL_P = 0.35  # sent at once: usually before the run reaches its wait
TWICE_P = 0.2
LATE_SIGNAL_P = 0.3  # held until B and C both claim (A retired): B's adopted runs wake then
SIGNALS_DONE_S = 4.0  # every signal is sent by this long after the last submit
# Killed runs come back within seconds; a SIGTERM hands back whatever is not done in 1 s.
WORKER_ENV = {"LANE_WORKER_CLAIM_TIMEOUT": "5", "LANE_WORKER_DRAIN_SECONDS": "1"}
# High enough that lease expiries after SIGKILLs never fail a run for good.
CLIENT_MAX_ATTEMPTS = "25"
SCHEMA = "runtime_scheduler"
TERMINAL = ("completed", "failed", "cancelled")


def make_plan(rng: random.Random) -> list[dict[str, Any]]:
    """Return a random plan: steps around at most one durable sleep and one event wait."""
    shape = rng.choices(["steps", "sleep", "wait", "sleep+wait"], weights=[25, 30, 25, 20])[0]
    plan: list[dict[str, Any]] = []

    def step() -> dict[str, Any]:
        """Return the next step of the plan."""
        linger_s = round(rng.uniform(0.05, 0.8), 2) if rng.random() < LINGER_P else 0
        linger_s = round(rng.uniform(1.5, 3), 2) if rng.random() < LONG_LINGER_P else linger_s
        name = f"s{sum(op['op'] == 'step' for op in plan)}"
        return {"op": "step", "name": name, "fail_once": rng.random() < FAIL_ONCE_P,
                "linger_s": linger_s}  # fmt: skip

    plan.append(step())
    if shape == "steps":
        plan.extend(step() for _ in range(rng.randint(1, 2)))
    if "sleep" in shape:
        plan += [{"op": "sleep", "id": "nap", "seconds": round(rng.uniform(1, 4), 2)}, step()]
    if "wait" in shape:
        plan += [{"op": "wait", "id": "gate", "key": "go", "timeout_s": 600}, step()]
    return plan


@dataclass
class Submitted:
    """One submitted run and the first signal it was sent."""

    run_id: str
    release: str
    plan: list[dict[str, Any]]
    first_signal: str | None = None


@dataclass
class Chaos:
    """One chaos run: the daemons per release, the kills, the findings and the figures."""

    pool: Daemons
    db: asyncpg.Pool
    rng: random.Random
    seed: int
    newest: str  # the release new runs go to
    live: dict[str, list[Daemon]] = field(default_factory=dict)
    killed_pids: set[int] = field(default_factory=set)
    stopped_pids: set[int] = field(default_factory=set)
    problems: dict[str, list[tuple[str | None, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    figures: Counter[str] = field(default_factory=Counter)
    drain_times: dict[str, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    t0: float = field(default_factory=time.monotonic)
    both_claim: asyncio.Event = field(default_factory=asyncio.Event)
    signals: list[asyncio.Task[None]] = field(default_factory=list)
    drains: list[asyncio.Task[None]] = field(default_factory=list)

    def flag(self, category: str, message: str, run_id: str | None = None) -> None:
        """Record one finding under ``category``, naming its run when there is one."""
        self.problems[category].append((run_id, message))

    def spawn(self, release: str) -> Daemon:
        """Start one daemon of ``release`` running the chaos app."""
        name = f"{release}/{next(self.serial)}"
        return self.pool.start(release, name=name, app="support.apps.chaos:app", **WORKER_ENV)

    async def deploy(self, release: str) -> None:
        """Start a release's workers and wait until each is ready."""
        daemons = [self.spawn(release) for _ in range(WORKERS_PER_RELEASE)]
        for daemon in daemons:
            await daemon.ready(timeout_s=60)
        async with self.lock:
            self.live[release] = daemons

    async def kill_loop(self, until: asyncio.Event) -> None:
        """Stop a random ready daemon every few seconds (mostly SIGKILL) and start another."""
        while not until.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), self.rng.uniform(*KILL_EVERY_S))
            if until.is_set():
                return
            async with self.lock:
                await self._reap()
                ready = [
                    (release, d)
                    for release, daemons in sorted(self.live.items())
                    for d in daemons
                    if d.running and d.events("worker.ready")
                ]
                if not ready:
                    continue
                release, victim = self.rng.choice(ready)
                if self.rng.random() < TERM_P:
                    self.stopped_pids.add(victim.pid)
                    victim.terminate()
                    code = await victim.wait_exit(timeout_s=45)
                    self.figures["SIGTERMs"] += 1
                    if code != 0:
                        self.flag("SIGTERM did not exit 0", f"{victim.name}: exit {code}")
                else:
                    self.killed_pids.add(victim.pid)
                    victim.kill()
                    await victim.wait_exit(timeout_s=15)
                    self.figures["SIGKILLs"] += 1
                self.live[release].remove(victim)
                self.live[release].append(self.spawn(release))
                self.figures["restarts"] += 1

    async def _reap(self) -> None:
        """Forget daemons that exited by themselves; flag those whose lane still needed them."""
        for release, daemons in self.live.items():
            for daemon in [d for d in daemons if not d.running]:
                daemons.remove(daemon)
                code = await daemon.wait_exit()
                self.figures["restarts that exited"] += 1
                needs = await self.only_release_may_run(release)
                if code == 78 and not needs:
                    continue  # a drained lane refuses boot: the design's rule
                said = (daemon.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
                self.flag(
                    "a restarted worker did not stay up",
                    f"{daemon.name} (pid {daemon.pid}) exited {code} while {len(needs)} run(s) "
                    f"only {release} may execute were open (design: a worker of a draining "
                    f"lane may boot): {said}",
                )

    async def only_release_may_run(self, release: str) -> list[asyncpg.Record]:
        """Return the open runs that only ``release`` may execute: while any is left it drains."""
        return await self.db.fetch(
            f"""select run_id, status, attempts, current_wait, adopted_release_id
                  from {SCHEMA}.runs
                 where coalesce(adopted_release_id, release_id) = any($1::text[])
                   and (status in ('queued', 'running', 'retrying')
                        or (status = 'waiting' and current_wait is null))
                 order by created_at""",
            [release, CANON[release]],
        )

    async def drain_then_stop(self, release: str, client: LaneClient) -> None:
        """Retire ``release``, wait until nothing only it may execute is left, SIGTERM it."""
        await client.retire_release(release)
        retired_at = time.monotonic()
        needs: list[asyncpg.Record] = []
        quiet = 0
        while time.monotonic() - retired_at < DRAIN_TIMEOUT_S:
            needs = await self.only_release_may_run(release)
            quiet = 0 if needs else quiet + 1
            if quiet >= 2:  # twice in a row, so not a run caught between two of its writes
                break
            await asyncio.sleep(0.5)
        waited_s = time.monotonic() - retired_at
        if needs:
            defers = await self.db.fetchval(
                f"select count(*) from {SCHEMA}.attempts where disposition = 'defer' "
                "and run_id = any($1::uuid[])",
                [r["run_id"] for r in needs],
            )
            self.flag(
                "a retired lane never drained",
                f"{release}: {waited_s:.0f} s after `lanes retire`, {len(needs)} run(s) only it "
                f"may execute are still open, deferred {defers} times by newer releases' "
                "continuation loops meanwhile: " + "; ".join(describe(r) for r in needs[:12]),
            )
        self.drain_times[release] = f"{waited_s:.1f} s" + (" (gave up)" if needs else "")
        await self.stop(release)

    async def stop(self, release: str) -> None:
        """SIGTERM every worker of ``release``; each must drain and exit 0."""
        async with self.lock:
            await self._reap()
            daemons = self.live.pop(release, [])
        for daemon in daemons:
            self.stopped_pids.add(daemon.pid)
            daemon.terminate()
        for daemon in daemons:
            code = await daemon.wait_exit(timeout_s=45)
            # A daemon that is still booting has nothing to drain: SIGTERM ends it at once.
            if code != 0 and daemon.events("worker.ready"):
                self.flag("SIGTERM did not exit 0", f"{daemon.name}: exit {code}")


def describe(row: asyncpg.Record) -> str:
    """Return a store run row in a few words."""
    wait = (row["current_wait"] or {}).get("kind")
    return f"{row['run_id']} {row['status']} attempts={row['attempts']} current_wait={wait}"


async def poll_until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    """Await ``check`` every half second until it holds (True) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    return True


async def send_signals(
    chaos: Chaos,
    client: LaneClient,
    run: Submitted,
    delay_s: float,
    again_s: float | None,
    late: asyncio.Event | None,
) -> None:
    """Signal ``go`` ``delay_s`` after ``late`` is set (or now); again ``again_s`` later."""
    if late is not None:
        await late.wait()
    await asyncio.sleep(delay_s)
    run.first_signal = f"first:{run.run_id[:8]}"
    first = await client.signal(run.run_id, "go", {"by": run.first_signal})
    chaos.figures["signals sent"] += 1
    if not first.delivered:
        chaos.flag("a first signal was not delivered", str(first), run.run_id)
    if again_s is not None:
        await asyncio.sleep(again_s)
        second = await client.signal(run.run_id, "go", {"by": f"second:{run.run_id[:8]}"})
        chaos.figures["signals sent"] += 1
        chaos.figures["duplicate signals ignored"] += second.duplicate
        if second.delivered:
            chaos.flag("a second signal was delivered", str(second), run.run_id)


async def json_codecs(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """Decode json and jsonb columns."""
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def roll(chaos: Chaos, clients: dict[str, LaneClient], t0: float) -> None:
    """Deploy each newer release on time; retire, drain and stop the one before it."""
    for i, release in enumerate(RELEASES[1:], start=1):
        await asyncio.sleep(max(0.0, t0 + i * PHASE_S - time.monotonic()))
        await chaos.deploy(release)
        chaos.newest = release
        if i == len(RELEASES) - 1:
            chaos.both_claim.set()
            await asyncio.sleep(BOTH_CLAIM_S)
        old = RELEASES[i - 1]
        chaos.drains.append(asyncio.create_task(chaos.drain_then_stop(old, clients[old])))


async def submit_runs(
    chaos: Chaos, clients: dict[str, LaneClient], t0: float, seed: int
) -> list[Submitted]:
    """Submit every run to the newest release at a steady pace; schedule its signals."""
    plan_rng, signal_rng = random.Random(f"{seed}:plan"), random.Random(f"{seed}:signal")  # noqa: S311
    submit_s = PHASE_S * len(RELEASES)
    signals_done_at = t0 + submit_s + SIGNALS_DONE_S
    runs = []
    for index in range(TOTAL_RUNS):
        await asyncio.sleep(max(0.0, t0 + index * submit_s / TOTAL_RUNS - time.monotonic()))
        plan, release = make_plan(plan_rng), chaos.newest
        submitted = await clients[release].submit("chaos", {"plan": plan})
        run = Submitted(submitted.run_id, release, plan)
        runs.append(run)
        if not any(op["op"] == "wait" for op in plan):
            continue
        late = release != RELEASES[-1] and signal_rng.random() < LATE_SIGNAL_P
        early = signal_rng.random() < EARLY_SIGNAL_P
        delay_s = signal_rng.uniform(0, 0.8) if early else signal_rng.uniform(1, 14)
        delay_s = min(delay_s, max(0.5, signals_done_at - time.monotonic()))
        if late:
            delay_s = signal_rng.uniform(0, BOTH_CLAIM_S - 1)
        again_s = signal_rng.uniform(0.2, 3) if signal_rng.random() < TWICE_P else None
        signal = send_signals(chaos, clients[release], run, delay_s, again_s,
                              chaos.both_claim if late else None)  # fmt: skip
        chaos.signals.append(asyncio.create_task(signal))
    return runs


@pytest.mark.chaos
@pytest.mark.timeout(480)
async def test_deploy_day_chaos(database_url: str) -> None:
    """Three releases rolled under SIGKILLs: every run completes once, on the right code."""
    seed = int(os.environ.get("LANE_WORKER_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    print(f"\nchaos seed {seed} (replay: LANE_WORKER_CHAOS_SEED={seed})")
    started = time.monotonic()
    setup = await asyncpg.connect(database_url)
    try:
        await setup.execute(EXEC_TABLE_SQL)
    finally:
        await setup.close()
    async with (
        Daemons(database_url) as pool,
        asyncpg.create_pool(database_url, min_size=1, max_size=3, init=json_codecs) as db,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = {}
        for release in RELEASES:
            env = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": release,
                   "LANE_WORKER_MAX_ATTEMPTS": CLIENT_MAX_ATTEMPTS}  # fmt: skip
            clients[release] = await stack.enter_async_context(open_client(database_url, env))
        chaos = Chaos(pool, db, random.Random(f"{seed}:kill"), seed, newest=RELEASES[0])  # noqa: S311
        await chaos.deploy(RELEASES[0])
        stop_kills = asyncio.Event()
        killer = asyncio.create_task(chaos.kill_loop(stop_kills))
        t0 = time.monotonic()
        roller = asyncio.create_task(roll(chaos, clients, t0))
        try:
            runs = await submit_runs(chaos, clients, t0, seed)
            await roller
            await asyncio.gather(*chaos.signals)
            stop_kills.set()
            await killer
            await asyncio.gather(*chaos.drains)
        finally:
            # A failure above must not leave tasks behind that touch the daemons.
            for task in [roller, killer, *chaos.signals, *chaos.drains]:
                task.cancel()

        async def all_terminal() -> bool:
            """Tell whether every run reached a terminal store status."""
            open_runs = await db.fetchval(
                f"select count(*) from {SCHEMA}.runs where status <> all($1::text[])", TERMINAL
            )
            return open_runs == 0

        await poll_until(all_terminal, FINAL_TIMEOUT_S)
        await chaos.stop(RELEASES[-1])
        report, findings = await judge(chaos, runs, time.monotonic() - started)
        print(report)
        if os.environ.get("LANE_WORKER_CHAOS_REPORT"):
            await asyncio.to_thread(
                Path(os.environ["LANE_WORKER_CHAOS_REPORT"]).write_text, report + "\n"
            )
        assert not findings, f"chaos seed {seed}: the tables show defects\n{report}\n{findings}"


# -- judging from the tables ---------------------------------------------------


def pid_of(worker_id: Any) -> int | None:
    """Return the pid in a worker id (``<release>@<host>:<pid>[:<queue>:continuations]``)."""
    try:
        return int(str(worker_id).split("@", 1)[1].split(":")[1])
    except (IndexError, ValueError):
        return None


async def read_tables(db: asyncpg.Pool) -> dict[str, Any]:
    """Read the store, the engine's run rows and ``chaos_exec`` in one snapshot, by run."""
    async with db.acquire() as conn, conn.transaction(isolation="repeatable_read"):
        store = await conn.fetch(f"select * from {SCHEMA}.runs")
        attempts = await conn.fetch(f"select * from {SCHEMA}.attempts order by attempt_id")
        facts = await conn.fetch(
            f"select run_id, type from {SCHEMA}.ledger where type = any($1::text[]) "
            "order by fact_id",
            [f"run.{t}" for t in TERMINAL],
        )
        execs = await conn.fetch("select * from chaos_exec order by id")
        lanes_rows = await conn.fetch(f"select queue, retired_at from {SCHEMA}.releases")
        engine = []
        for queue in sorted({r["queue"] for r in store}):
            engine += await conn.fetch(
                "select task_id, attempt, state, failure_reason, available_at"
                f' from absurd."r_{queue}" order by attempt, created_at'
            )
    retired_at = {lane["queue"]: lane["retired_at"] for lane in lanes_rows}
    tables: dict[str, Any] = {
        "runs": {str(r["run_id"]): r for r in store},
        "retired_at": {CANON[r]: retired_at.get(lanes.queue_name_for_release(r)) for r in RELEASES},
    }
    grouping = {"attempts": (attempts, "run_id"), "facts": (facts, "run_id"),
                "execs": (execs, "run_id"), "engine": (engine, "task_id")}  # fmt: skip
    for name, (rows, key) in grouping.items():
        grouped: dict[str, list[asyncpg.Record]] = defaultdict(list)
        for row in rows:
            grouped[str(row[key])].append(row)
        tables[name] = grouped
    return tables


def judge_run(chaos: Chaos, run: Submitted, tables: dict[str, Any]) -> None:
    """Check one run against every invariant and add up its figures."""
    rid, flag, fig = run.run_id, chaos.flag, chaos.figures
    row = tables["runs"].get(rid)
    if row is None:
        flag("a submitted run has no store row", rid, rid)
        return
    attempts, execs = tables["attempts"][rid], tables["execs"][rid]
    engine_runs = tables["engine"][str(row["task_id"])]
    claims = ", ".join(f"{a['release_id']}:{a['disposition']}/{a['outcome']}" for a in attempts)
    completed = row["status"] == "completed"
    fig["runs completed"] += completed
    if not completed:
        last_engine = engine_runs[-1] if engine_runs else {}
        flag("a run did not complete", f"{describe(row)} stamped={row['release_id']} "
             f"adopted={row['adopted_release_id']} claims=[{claims}] engine="
             f"{last_engine.get('state')}#{last_engine.get('attempt')} due "
             f"{last_engine.get('available_at')}", rid)  # fmt: skip
    facts = [f["type"] for f in tables["facts"][rid]]
    if facts != ([f"run.{row['status']}"] if row["status"] in TERMINAL else []):
        flag("not exactly one terminal fact", f"{rid} {row['status']}: ledger has {facts}", rid)

    # A committed step is the last execution of its step, and every later step saw its token.
    committed = (row["output"] or {}).get("tokens", {}) if completed else {}
    fig["step executions"] += len(execs)
    fig["run again after a deliberate failure"] += sum(e["raised"] for e in execs)
    for op in (op for op in run.plan if op["op"] == "step" and completed):
        done = [e for e in execs if e["step"] == op["name"]]
        token = committed.get(op["name"])
        fig["steps committed"] += 1
        fig["run again after a loss mid-step"] += sum(not e["raised"] for e in done[:-1])
        if not done or str(done[-1]["token"]) != token or done[-1]["raised"]:
            fig["committed steps executed again"] += 1
            history = ", ".join(
                f"#{e['id']} {e['release_id']} pid {e['pid']} attempt {e['attempt']}"
                + (" raised" if e["raised"] else "")
                + (" <- committed" if str(e["token"]) == token else "")
                for e in done
            )
            flag("a committed step was executed again", f"{rid} {op['name']}: {history}", rid)
    for e in execs if completed else ():
        stale = {k: v for k, v in e["seen"].items() if committed.get(k) != v}
        if stale:
            flag("a step saw an earlier step's result that is not the committed one",
                 f"{rid} execution #{e['id']} of {e['step']} saw {stale}", rid)  # fmt: skip

    # Releases: the stamped one or an adopter, never back to an older one, one per segment.
    adopters = {a["release_id"] for a in attempts if a["disposition"] == "adopt"}
    allowed = {CANON[run.release], row["adopted_release_id"], *adopters}
    path = [e["release_id"] for e in execs]
    if not set(path) <= allowed:
        flag("a step ran on a release that neither launched nor adopted the run",
             f"{rid} stamped {run.release}; adopters {sorted(adopters)}; steps ran on {path}; "
             f"claims [{claims}]", rid)  # fmt: skip
    if any(RANK.get(b, 99) < RANK.get(a, 99) for a, b in itertools.pairwise(path)):
        flag("a run went back to an older release",
             f"{rid} steps ran on {path}; claims [{claims}]", rid)  # fmt: skip
    segments: dict[int, set[str]] = defaultdict(set)
    for e in execs:
        segments[e["segment"]].add(e["release_id"])
    mixed = {k: sorted(v) for k, v in segments.items() if len(v) > 1}
    if mixed:
        flag("a run changed release between two durable points",
             f"{rid} segments {mixed}; claims [{claims}]", rid)  # fmt: skip
    for op in (op for op in run.plan if op["op"] == "wait" and completed):
        got = (row["output"].get("waits") or {}).get(op["id"]) or {}
        if not got.get("resumed") or got.get("timed_out") or got.get("by") != run.first_signal:
            flag("a wait did not resume with the first signal",
                 f"{rid} got {got}, first signal {run.first_signal}", rid)  # fmt: skip

    # Attempts: every engine attempt after the first is explained by a failed engine run.
    fig["adoptions"] += len([a for a in attempts if a["disposition"] == "adopt"])
    defers = len([a for a in attempts if a["disposition"] == "defer"])
    fig["defers"] += defers
    fig["most defers of one run"] = max(fig["most defers of one run"], defers)
    fig["hand-backs"] += len([a for a in attempts if a["outcome"] == "handed_back"])
    for a in (a for a in attempts if a["disposition"] == "refuse"):
        fig["refusals"] += 1
        flag("a run was refused in a normal roll", f"{rid} by {a['worker_id']}", rid)
    # While the run's effective release (its adopter, else its stamp) claims, no other
    # release may adopt, defer or refuse it; in a race it may only give it back at once.
    effective = CANON[run.release]
    for a in attempts:
        retired = tables["retired_at"].get(effective)
        if (rid, a["worker_id"]) in tables["left_to_adopter"] and a["disposition"] == "defer":
            fig["left to the adopter at once (claim race)"] += 1
        elif a["release_id"] != effective and (retired is None or a["claimed_at"] < retired):
            when = f"{a['claimed_at']:%H:%M:%S.%f}"
            flag("another release took a run while the run's own release still claimed",
                 f"{rid} {a['disposition']} by {a['worker_id']} at {when}, while {effective} "
                 f"claimed (retired at {retired}); claims [{claims}]", rid)  # fmt: skip
        if a["disposition"] == "adopt":
            effective = a["release_id"]
    for a in attempts:
        if a["outcome"] is None and pid_of(a["worker_id"]) not in chaos.killed_pids:
            flag("a claim was neither finished nor handed back by a live or SIGTERMed worker",
                 f"{rid} {a['disposition']} by {a['worker_id']}: [{claims}]", rid)  # fmt: skip
    numbers = [e["attempt"] for e in engine_runs]
    if numbers != list(range(1, len(numbers) + 1)):
        flag("engine attempts are not one engine run each, 1..N", f"{rid}: {numbers}", rid)
    for e in (e for e in engine_runs if e["state"] == "failed"):
        reason = e["failure_reason"] or {}
        pid = pid_of(reason.get("workerId"))
        if reason.get("name") == FAIL_ONCE_ERROR:
            fig["attempts spent by deliberate failures"] += 1
        elif reason.get("name") == "$ClaimTimeout" and pid in chaos.killed_pids:
            fig["attempts spent by lease expiry after SIGKILL"] += 1
        else:
            fig["attempts spent by anything else"] += 1
            holder = ("a SIGTERMed worker" if pid in chaos.stopped_pids
                      else "a worker that was never killed" if pid else "no worker")  # fmt: skip
            flag("an attempt was spent by neither a deliberate failure nor a SIGKILL",
                 f"{rid} engine attempt {e['attempt']} failed, held by {holder}: "
                 f"{json.dumps(reason)[:300]}; claims [{claims}]", rid)  # fmt: skip
    if completed and (not engine_runs or engine_runs[-1]["state"] != "completed"):
        flag("the engine does not show the run completed", f"{rid}: {numbers}", rid)


def timeline(chaos: Chaos, run_id: str, limit: int = 30) -> list[str]:
    """Return every daemon's log lines about ``run_id``, in time order."""
    bound = {"event", "level", "timestamp", "release_id", "queue", "run_id", "task_id"}
    lines = []
    for daemon in chaos.pool.started:
        for r in daemon.events(run_id=run_id):
            loop = "cont" if str(r.get("worker_id", "")).endswith(":continuations") else "own"
            extra = {k: v for k, v in r.items() if k not in bound | {"_mono", "worker_id"}}
            text = json.dumps(extra, default=str)[:160]
            at_s = r["_mono"] - chaos.t0
            lines.append(
                (at_s, f"    {at_s:7.2f}s {daemon.name:<11} {loop:<4} {r['event']} {text}")
            )
    return [text for _, text in sorted(lines)][:limit]


async def judge(chaos: Chaos, runs: list[Submitted], wall_s: float) -> tuple[str, str]:
    """Judge every run from the tables; return the figures table and the findings ("" if none)."""
    tables = await read_tables(chaos.db)
    # The log names the quiet give-back the design allows when a claim races an adopter.
    tables["left_to_adopter"] = {
        (r["run_id"], r["worker_id"])
        for daemon in chaos.pool.started
        for r in daemon.events("run.left_to_adopter")
    }
    for run in runs:
        judge_run(chaos, run, tables)
    fig = chaos.figures
    rows: list[tuple[str, Any]] = [
        ("seed", chaos.seed),
        (f"releases rolled ({WORKERS_PER_RELEASE} workers each)", " -> ".join(RELEASES)),
        ("runs submitted", len(runs)),
        ("runs completed", fig["runs completed"]),
        ("steps committed", fig["steps committed"]),
        ("step executions", fig["step executions"]),
        ("  run again after a deliberate fail-once", fig["run again after a deliberate failure"]),
        ("  run again after SIGKILL/hand-back mid-step", fig["run again after a loss mid-step"]),
        ("  committed steps executed again (must be 0)", fig["committed steps executed again"]),
        ("SIGKILLs", fig["SIGKILLs"]),
        ("SIGTERMs of a live worker", fig["SIGTERMs"]),
        ("restarts (of which exited by themselves)",
         f"{fig['restarts']} ({fig['restarts that exited']})"),
        ("signals sent (duplicates ignored)",
         f"{fig['signals sent']} ({fig['duplicate signals ignored']})"),
        ("adoptions", fig["adoptions"]),
        ("defers (of which given back at once to the adopter)",
         f"{fig['defers']} ({fig['left to the adopter at once (claim race)']})"),
        ("most defers of one run", fig["most defers of one run"]),
        ("hand-backs", fig["hand-backs"]),
        ("refusals (must be 0)", fig["refusals"]),
        ("attempts spent by deliberate failures", fig["attempts spent by deliberate failures"]),
        ("attempts spent by lease expiry after SIGKILL",
         fig["attempts spent by lease expiry after SIGKILL"]),
        ("attempts spent by defer/hand-back (must be 0)", fig["attempts spent by anything else"]),
        *((f"drain of {r} (retire -> SIGTERM)", t) for r, t in sorted(chaos.drain_times.items())),
        ("wall time", f"{wall_s:.0f} s"),
    ]  # fmt: skip
    width = max(len(label) for label, _ in rows)
    report = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
    findings = []
    for category, items in chaos.problems.items():
        findings.append(f"== {category}: {len(items)}")
        findings += [f"  {message}" for _, message in items[:10]]
        for run_id in list(dict.fromkeys(r for r, _ in items if r))[:2]:
            findings.append(f"  log lines of run {run_id}:")
            findings += timeline(chaos, run_id)
    return report, "\n".join(findings)
