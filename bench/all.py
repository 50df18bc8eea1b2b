"""Every speed target in one run (`make bench`): lane-worker against absurd-sdk and the raw loop.

On one Postgres, in one scratch database: the 3,000-run drain in alternating
rounds (raw loop, absurd-sdk's async worker, lane-worker; each round starts with
the next case, so none always runs first), the 30,000-run drain once for the
raw loop and lane-worker, then the wake benchmark (lane-worker, and absurd-sdk's
sync worker as a reference), then the steady load of ``steady.py`` (lane-worker
and absurd-sdk's async worker alternating, at 16 and 64 workers, each case in a
scratch database of its own; ``--steady-rounds 0`` skips it). It prints the
figures of each benchmark, then one table: every target of the speed issue with
what was measured, the ratio it is judged by, and whether it is met. It exits 0
whether or not targets are met (it measures; the README keeps its table), 1 when
a benchmark fails.

Usage: .venv/bin/python bench/all.py [--rounds 2] [--big 30000] [--runs 30] [--steady-rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import drain
import lanes
import steady
import submit
import wake
from common import add_common_args, parse_args, percentile, print_table, run_main, session

DRAIN_CASES = ("raw", "absurd-sdk-async", "lane-worker")
CASES = (*DRAIN_CASES, "absurd-sdk")  # the last one: the wake reference


@dataclass(frozen=True)
class Target:
    """One line of the table: what is measured, the value judged, and the bound."""

    measure: str
    lane: str  # lane-worker's figure, as printed
    sdk: str  # absurd-sdk's
    raw: str  # the raw loop's
    judged: float | None  # None: not measured
    bound: str  # as printed, e.g. ">= 2x"
    holds: Callable[[float], bool]


def verdict(t: Target) -> str:
    if t.judged is None:
        return "not measured"
    return "met" if t.holds(t.judged) else "missed"


def fmt(value: float | None, spec: str = ".0f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


@dataclass
class Measured:
    """Every benchmark's figures."""

    drains: list[drain.Result]
    wakes: list[wake.Wake]
    steady: list[steady.Steady]


async def measure(args: argparse.Namespace, steady_args: argparse.Namespace) -> Measured:
    drains: list[drain.Result] = []
    wakes: list[wake.Wake] = []
    steadies: list[steady.Steady] = []
    async with session(args) as bench:
        for r in range(args.rounds):
            order = DRAIN_CASES[r % len(DRAIN_CASES) :] + DRAIN_CASES[: r % len(DRAIN_CASES)]
            for case in order:
                if case in args.only:
                    result = await drain.run_case(bench, case, args.size, f"_r{r + 1}")
                    if result is not None:
                        drains.append(result)
        if args.big:
            for case in ("raw", "lane-worker"):
                if case in args.only:
                    result = await drain.run_case(bench, case, args.big)
                    if result is not None:
                        drains.append(result)
        if "lane-worker" in args.only:
            print("wake, lane-worker:", flush=True)
            wakes.append(await wake.case_lane(bench))
            if args.attached_window > 0:
                print("idle, lane-worker with two continuation loops attached:", flush=True)
                wakes.append(await wake.case_lane_attached(bench))
        if "absurd-sdk" in args.only and bench.sdk is not None:
            print("wake, absurd-sdk (sync worker, 250 ms poll):", flush=True)
            wakes.append(await wake.case_sdk(bench, bench.sdk))
        if steady_args.rounds > 0:
            steadies = await steady.measure(bench, steady_args)
    return Measured(drains, wakes, steadies)


def median_rate(drains: list[drain.Result], case: str, n: int) -> float | None:
    rates = [r.rate for r in drains if r.case == case and r.backlog == n and not r.timed_out]
    return statistics.median(rates) if rates else None


def median_cpu_ms(drains: list[drain.Result], case: str, n: int) -> float | None:
    """The daemon's CPU per run (ms), median over the rounds."""
    per_run = [1000 * r.worker_cpu_s / r.runs for r in drains if r.case == case and r.backlog == n]
    return statistics.median(per_run) if per_run else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def steady_targets(results: list[steady.Steady], args: argparse.Namespace) -> list[Target]:
    """One line per worker count: lane-worker's jobs/s under steady load over absurd-sdk's."""
    if args.rounds <= 0:
        return []
    unit = " jobs/s"
    return [
        Target(f"steady load, {w} workers: x absurd-sdk-async", fmt(lane, unit=unit),
               fmt(sdk, unit=unit), "", ratio(lane, sdk), ">= 2x", lambda v: v >= 2)
        for w, lane, sdk in steady.medians(results, args.workers)
    ]  # fmt: skip


def targets(
    args: argparse.Namespace, drains: list[drain.Result], wakes: list[wake.Wake]
) -> list[Target]:
    lane = median_rate(drains, "lane-worker", args.size)
    sdk = median_rate(drains, "absurd-sdk-async", args.size)
    raw = median_rate(drains, "raw", args.size)
    lane_big = median_rate(drains, "lane-worker", args.big) if args.big else None
    raw_big = median_rate(drains, "raw", args.big) if args.big else None
    w = next((x for x in wakes if x.case == "lane-worker"), None)
    attached = next((x for x in wakes if x.case.startswith("lane-worker +")), None)
    idle = attached.idle_mean_xacts_per_s if attached else None

    def latency(metric: str, q: float) -> float | None:
        values = w.latencies.get(metric) if w else None
        return percentile([v * 1000 for v in values], q) if values else None

    started50, started95 = (latency("call -> run.started", q) for q in (0.5, 0.95))
    resumed50 = latency("signal -> resumed run.started", 0.5)
    direct95 = latency("engine-direct -> run.started", 0.95)
    cpu = median_cpu_ms(drains, "lane-worker", args.size)
    size, big = f"{args.size:,}", f"{args.big:,}"
    runs_s = " runs/s"
    return [
        Target(f"drain {size}: x absurd-sdk-async", fmt(lane, unit=runs_s),
               fmt(sdk, unit=runs_s), fmt(raw, unit=runs_s), ratio(lane, sdk), ">= 2.5x",
               lambda v: v >= 2.5),
        Target(f"drain {size}: x raw loop", fmt(lane, unit=runs_s), "",
               fmt(raw, unit=runs_s), ratio(lane, raw), ">= 1.2x", lambda v: v >= 1.2),
        Target(f"drain {big} / drain {size}", fmt(lane_big, unit=runs_s), "",
               fmt(raw_big, unit=runs_s), ratio(lane_big, lane), ">= 0.9", lambda v: v >= 0.9),
        Target("submit to run.started p50 (ms)", fmt(started50, ".1f"), "", "", started50,
               "< 3", lambda v: v < 3),
        Target("submit to run.started p95 (ms)", fmt(started95, ".1f"), "", "", started95,
               "< 10", lambda v: v < 10),
        Target("signal to resume p50 (ms)", fmt(resumed50, ".1f"), "", "", resumed50,
               "< 10", lambda v: v < 10),
        Target("engine-direct submit to run.started p95 (ms)", fmt(direct95, ".1f"), "", "",
               direct95, "< 50",
               lambda v: v < 50),
        Target(f"daemon CPU per run, drain {size} (ms)", fmt(cpu, ".3f"), "", "", cpu,
               "<= 0.3", lambda v: v <= 0.3),
        Target("idle transactions/s (own + 2 continuation loops)", fmt(idle, ".2f"), "", "",
               idle, "<= 0.5", lambda v: v <= 0.5),
        Target("RSS idle (MiB)", fmt(w.rss_idle_mb if w else None), "", "",
               w.rss_idle_mb if w else None, "< 60", lambda v: v < 60),
        Target("boot to ready (s)", fmt(w.boot_s if w else None, ".2f"), "", "",
               w.boot_s if w else None, "< 1", lambda v: v < 1),
    ]  # fmt: skip


def report(args: argparse.Namespace, steady_args: argparse.Namespace, m: Measured) -> None:
    drain.report(m.drains)
    if m.wakes:
        wake.report(m.wakes, args)
    if m.steady:
        steady.report(m.steady, steady_args)
    rows = targets(args, m.drains, m.wakes) + steady_targets(m.steady, steady_args)
    print(f"\nspeed targets ({args.rounds} rounds of the {args.size:,} drain,"
          f" {steady_args.rounds} of the steady load; medians):")  # fmt: skip
    print_table(
        ["measure", "lane-worker", "absurd-sdk-async", "raw loop", "judged", "target", ""],
        [[t.measure, t.lane, t.sdk, t.raw, fmt(t.judged, ".2f"), t.bound, verdict(t)]
         for t in rows],
    )  # fmt: skip


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, CASES)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the drain (2)")
    parser.add_argument("--size", type=int, default=3000, help="the drain's backlog (3000)")
    parser.add_argument("--big", type=int, default=30000, help="the large backlog (0: skip)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain (600)")
    parser.add_argument("--runs", type=int, default=30, help="wake: runs one at a time (30)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="wake: daemon's poll")
    parser.add_argument("--idle-window", type=float, default=20.0, help="wake: idle seconds")
    wake.add_attached_window(parser)
    parser.add_argument("--steady-rounds", type=int, default=2, help="steady load (0: skip)")
    steady.add_args(parser, prefix="steady-")
    lanes.add_args(parser)
    parser.add_argument("--submit-runs", type=int, default=20_000,
                        help="submit.py: runs per batched case (0: skip)")  # fmt: skip
    args = parse_args(parser, CASES)
    args.profile = None
    args.statements = False
    steady_args = steady.steady_args(args, prefix="steady-")
    steady_args.rounds = args.steady_rounds
    report(args, steady_args, await measure(args, steady_args))
    if "lane-worker" in args.only and args.steps:
        # Its own scratch database: a thousand engine queues must not slow the others.
        print("\nlanes: a worker facing many engine queues", flush=True)
        lane_args = argparse.Namespace(**vars(args))
        lane_args.steps = [int(s) for s in args.steps.split(",")]
        lane_args.only = ["lane-worker"]
        steps = await lanes.measure(lane_args)
        print("\nmany-lanes targets:")
        print_table(
            ["measure", "figure", "target", ""],
            [[m, f, b, "met" if ok else "missed"] for m, f, b, ok in lanes.verdicts(steps)],
        )
    if "lane-worker" in args.only and args.submit_runs:
        # Its own scratch database too: a backlog of bulk submits must not slow the others.
        print("\nsubmit: one submit_run a call against submit_runs", flush=True)
        submit.report(await submit.measure(args.url, args.submit_runs, [100, 1000]))
    return 0


if __name__ == "__main__":
    run_main(main)
