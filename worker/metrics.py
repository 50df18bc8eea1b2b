"""Prometheus metrics of one worker process (served on /metrics)."""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from worker.version import VERSION

# `*_created` series double the exposition for no use here.
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client


class Registered(Protocol):
    """What a health server serves on /metrics: a process's own registry."""

    registry: CollectorRegistry


def build_info(registry: CollectorRegistry) -> Gauge:
    """Register ``lane_worker_build_info`` (the worker's and the scaler's): 1, by version."""
    gauge = Gauge(
        "lane_worker_build_info",
        "The running build: always 1, labelled with its version.",
        ["version"],
        registry=registry,
    )
    gauge.labels(_version()).set(1)
    return gauge


class Metrics:
    """The daemon's metrics, in a registry of their own (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.build_info = build_info(self.registry)
        self.claims = Counter(
            "lane_worker_claims",
            "Runs claimed, by loop kind and lane disposition.",
            ["loop", "disposition"],
            registry=self.registry,
        )
        self.attempts = Counter(
            "lane_worker_attempts",
            "Attempts that ended in this worker, by outcome (parked, retrying, deferred, ...).",
            ["outcome"],
            registry=self.registry,
        )
        self.runs = Counter(
            "lane_worker_runs",
            "Runs this worker brought to a terminal status (completed, failed, cancelled).",
            ["status"],
            registry=self.registry,
        )
        # The drain report, as of the last /metrics scrape (refreshed then): lanes
        # by status, and the per-lane series of every lane not drained (a drained
        # lane's are all zero; a week of deploys would otherwise add ~12 series per
        # release to every worker's scrape, for good).
        self.lanes = Gauge(
            "lane_worker_lanes",
            "Lanes by status (claiming, draining, drained, unregistered).",
            ["status"],
            registry=self.registry,
        )
        self.lane_open_runs = Gauge(
            "lane_worker_lane_open_runs",
            "Open runs of a lane, by bucket (fresh, inFlight, retrying, parkedSleep, ...).",
            ["lane", "release", "bucket"],
            registry=self.registry,
        )
        self.lane_live_workers = Gauge(
            "lane_worker_lane_live_workers",
            "Live workers of a lane.",
            ["lane", "release"],
            registry=self.registry,
        )
        self.lane_status = Gauge(
            "lane_worker_lane_status",
            "1 for a lane's status (claiming, draining, drained, unregistered), else absent.",
            ["lane", "release", "status"],
            registry=self.registry,
        )
        self.lane_draining_seconds = Gauge(
            "lane_worker_lane_draining_seconds",
            "Seconds since a lane was retired, while it is draining; 0 in any other status.",
            ["lane", "release"],
            registry=self.registry,
        )
        self.lane_stranded = Gauge(
            "lane_worker_lane_stranded",
            "1 when a lane holds work only its release may run and no live worker of it: "
            "nothing will finish that work until one starts.",
            ["lane", "release"],
            registry=self.registry,
        )
        self.run_duration = Histogram(
            "lane_worker_run_duration_seconds",
            "Time from claim to the attempt's end (completion, park, failure).",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800),
            registry=self.registry,
        )
        self.lease_extensions = Counter(
            "lane_worker_lease_extensions",
            "Lease extensions of running runs.",
            registry=self.registry,
        )
        self.loop_errors = Counter(
            "lane_worker_loop_errors",
            "Errors a claim loop backed off from, by loop kind.",
            ["loop"],
            registry=self.registry,
        )
        # Set at each scrape from the loops' claim health (``worker/run/claim_health.py``).
        self.loop_claim_failing = Gauge(
            "lane_worker_loop_claim_failing",
            "1 while a claim loop does not claim: its claims kept failing (or one has not "
            "returned) for 20 s; then /readyz is 503 and the lanes page says why.",
            ["queue", "loop"],
            registry=self.registry,
        )
        self.loop_claim_failing_seconds = Gauge(
            "lane_worker_loop_claim_failing_seconds",
            "Seconds since a claim loop's first failed claim in a row (or since a claim that "
            "has not returned was sent); 0 once a claim succeeds.",
            ["queue", "loop"],
            registry=self.registry,
        )
        self.maintenance_errors = Counter(
            "lane_worker_maintenance_errors",
            "Queues a maintenance pass could not clean up or reconcile, by queue.",
            ["queue"],
            registry=self.registry,
        )
        self.incompatible_defers = Counter(
            "lane_worker_incompatible_defers",
            "Parked runs a continuation loop did not adopt: this app lacks their play.",
            registry=self.registry,
        )
        self.long_deferrals = Counter(
            "lane_worker_long_deferrals",
            "Runs whose deferral streak outlived LANE_WORKER_DEFER_ALERT_AFTER, by lane queue.",
            ["queue"],
            registry=self.registry,
        )
        self.adoptable_queues = Gauge(
            "lane_worker_adoptable_queues_attached",
            "Continuation loops attached to retired lanes.",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "lane_worker_runs_in_flight",
            "Runs executing in this process now.",
            registry=self.registry,
        )
        self.ledger_delivered = Counter(
            "lane_worker_ledger_delivered",
            "Ledger facts a runtime API accepted (a 2xx).",
            registry=self.registry,
        )
        self.ledger_retries = Counter(
            "lane_worker_ledger_retries",
            "Ledger deliveries to be tried again: connection error, timeout, 408, 429 or 5xx.",
            registry=self.registry,
        )
        self.ledger_given_up = Counter(
            "lane_worker_ledger_given_up",
            "Ledger facts given up, by reason: refused (another 4xx, a redirect, a context no "
            "request can carry), unreadable (the fact or its context cannot be decoded) or expired "
            "(LANE_WORKER_LEDGER_RETRY_FOR passed).",
            ["reason"],
            registry=self.registry,
        )
        self.ledger_pending = Gauge(
            "lane_worker_ledger_pending",
            "Ledger facts of the store waiting for delivery (as this worker last read it).",
            registry=self.registry,
        )
        self.ledger_oldest_undelivered = Gauge(
            "lane_worker_ledger_oldest_undelivered_seconds",
            "Age of the store's oldest ledger fact waiting for delivery (0: none).",
            registry=self.registry,
        )

    def claims_total(self) -> int:
        """Every claim counted so far, whatever its labels (``worker.stopped`` says it)."""
        samples = [s for metric in self.claims.collect() for s in metric.samples]
        return int(sum(s.value for s in samples if s.name.endswith("_total")))

    def attempts_by_outcome(self) -> dict[str, int]:
        """The attempts counted so far, by outcome (``worker.stopped`` says them)."""
        return {
            sample.labels.get("outcome", "?"): int(sample.value)
            for metric in self.attempts.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }


def _version() -> str:
    return VERSION


class Counted:
    """A labelled counter's children, each looked up once.

    ``labels()`` validates and locks on every call, several times per run; a
    counter's children are never removed, so the first one found stays right.
    """

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._children: dict[tuple[str, ...], Counter] = {}

    def inc(self, *values: str) -> None:
        """Add one to the child labelled ``values``."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._counter.labels(*values)
        child.inc()
