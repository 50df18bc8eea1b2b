"""Worker tuning (``LANE_WORKER_*``): each knob with its default and its bounds."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Literal

from worker.config.env import (
    BOOT_RETRY_ENV,
    CLAIM_TIMEOUT_ENV,
    CONCURRENCY_ENV,
    DATABASE_URL_ENV,
    DEFER_ALERT_AFTER_ENV,
    DEFER_FAIL_AFTER_ENV,
    DEV_LANE_IDLE_AFTER_ENV,
    DRAIN_SECONDS_ENV,
    EVENT_LOOP_ENV,
    HEALTH_HOST_ENV,
    HEALTH_PORT_ENV,
    HOST,
    LEDGER_CONCURRENCY_ENV,
    LEDGER_PATH_ENV,
    LEDGER_PER_ENDPOINT_ENV,
    LEDGER_RETRY_FOR_ENV,
    LEDGER_TIMEOUT_ENV,
    LISTEN_POLL_INTERVAL_ENV,
    LOG_FORMAT_ENV,
    MAX_ATTEMPTS_ENV,
    PGBOUNCER_ENV,
    POLL_INTERVAL_ENV,
    PROCESSES_ENV,
    PRUNE_AFTER_ENV,
    UNKNOWN_PLAY_GRACE_ENV,
    Problems,
    blank_as_unset,
    decimal_number,
    flag,
    number,
    whole_number,
)
from worker.errors import shown

LogFormat = Literal["json", "console", "auto"]
EventLoop = Literal["uvloop", "asyncio"]
MAX_PROCESSES = 64


@dataclass(frozen=True)
class Tuning:
    """Worker tuning knobs (``LANE_WORKER_*``), each with the documented default."""

    concurrency: int = 8
    # Daemons of this release on this machine, under one supervisor (worker/daemon/processes.py).
    processes: int = 1
    claim_timeout_s: int = 60
    poll_interval_s: float = 1.0
    # While LISTEN is connected every way a run becomes claimable sends a NOTIFY
    # or has a known due time: the poll is only a safety net (never below the above).
    listen_poll_interval_s: float = 30.0
    drain_s: float = 25.0
    health_port: int = 8080
    health_host: str = "0.0.0.0"  # noqa: S104 (a container's health port: all interfaces)
    max_attempts: int = 5
    log_format: LogFormat = "auto"
    # uvloop costs the daemon less CPU per run than asyncio's own loop (bench/README.md);
    # where it cannot be imported the daemon falls back to asyncio with a warning.
    event_loop: EventLoop = "uvloop"
    pgbouncer: bool = False
    defer_alert_after_s: float = 3600.0
    defer_fail_after_s: float = 0.0  # 0: never fail a run for its deferrals
    # A run of its own lane whose play no machine of the lane ever registered is put back
    # this long (no attempt spent) before it fails for good as an unknown play: a hotfix
    # that adds a play reaches the lane's machines one at a time, and the old ones must
    # not fail its first runs. A typo fails after it too (the submit warns at once).
    unknown_play_grace_s: float = 600.0  # 0: fail at once
    # How long a booting worker waits for the database before it gives up (exit 1).
    boot_retry_s: float = 60.0
    # A retired lane with nothing unfinished left this long is pruned by maintenance
    # (its engine queue dropped, its history kept): a week of deploys does not pile up.
    prune_after_s: float = 86_400.0  # 0: never (`lanes prune` by hand only)
    # A dev lane (release id dev / dev-<suffix>: a worktree's) with no live worker and no
    # open run this long is retired by maintenance (then pruned as above): deleted
    # worktrees do not pile up. Its worker booting again activates it. 7 days: a worktree
    # left over a long weekend keeps its lane.
    dev_lane_idle_after_s: float = 604_800.0  # 0: never
    # Ledger delivery to the app's runtime API (worker/daemon/relay.py).
    ledger_path: str = "/api/runtime/run-ledger"
    ledger_concurrency: int = 16
    ledger_per_endpoint: int = 4
    ledger_timeout_s: float = 10.0
    ledger_retry_for_s: float = 86_400.0


_RUNS, _WHOLE_S, _SECS = (
    "a whole number of runs",
    "a whole number of seconds",
    "a number of seconds",
)
# field, variable, parser, lowest, highest, what the value is (for the refusal)
_NUMBERS: tuple[tuple[str, str, Callable[[str], float | None], float, float, str], ...] = (
    ("concurrency", CONCURRENCY_ENV, whole_number, 1, 1000, _RUNS),
    ("processes", PROCESSES_ENV, whole_number, 1, MAX_PROCESSES, "a whole number of processes"),
    ("claim_timeout_s", CLAIM_TIMEOUT_ENV, whole_number, 5, 86_400, _WHOLE_S),
    ("poll_interval_s", POLL_INTERVAL_ENV, decimal_number, 0.01, 3600.0, _SECS),
    ("listen_poll_interval_s", LISTEN_POLL_INTERVAL_ENV, decimal_number, 0.01, 3600.0, _SECS),
    ("drain_s", DRAIN_SECONDS_ENV, decimal_number, 0.0, 3600.0, _SECS),
    ("health_port", HEALTH_PORT_ENV, whole_number, 0, 65_535, "a TCP port (0: any free)"),
    ("max_attempts", MAX_ATTEMPTS_ENV, whole_number, 1, 1000, "a whole number of attempts"),
    ("defer_alert_after_s", DEFER_ALERT_AFTER_ENV, decimal_number, 1.0, 604_800.0, _SECS),
    (
        "defer_fail_after_s",
        DEFER_FAIL_AFTER_ENV,
        decimal_number,
        0.0,
        2_592_000.0,
        "a number of seconds (0: never)",
    ),
    (
        "unknown_play_grace_s",
        UNKNOWN_PLAY_GRACE_ENV,
        decimal_number,
        0.0,
        604_800.0,
        "a number of seconds (0: fail at once)",
    ),
    ("boot_retry_s", BOOT_RETRY_ENV, decimal_number, 0.0, 3600.0, _SECS),
    (
        "prune_after_s",
        PRUNE_AFTER_ENV,
        decimal_number,
        0.0,
        31_536_000.0,
        "a number of seconds (0: never)",
    ),
    (
        "dev_lane_idle_after_s",
        DEV_LANE_IDLE_AFTER_ENV,
        decimal_number,
        0.0,
        31_536_000.0,
        "a number of seconds (0: never)",
    ),
    (
        "ledger_concurrency",
        LEDGER_CONCURRENCY_ENV,
        whole_number,
        1,
        1000,
        "a whole number of deliveries",
    ),
    (
        "ledger_per_endpoint",
        LEDGER_PER_ENDPOINT_ENV,
        whole_number,
        1,
        1000,
        "a whole number of deliveries",
    ),
    ("ledger_timeout_s", LEDGER_TIMEOUT_ENV, decimal_number, 0.1, 300.0, _SECS),
    ("ledger_retry_for_s", LEDGER_RETRY_FOR_ENV, decimal_number, 1.0, 2_592_000.0, _SECS),
)

# A path on the runtime API's base URL: no scheme, host, query or fragment.
_LEDGER_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*")


def read_tuning(env: Mapping[str, str], problems: Problems) -> Tuning:
    """Read every tuning variable; a refused one is recorded in ``problems`` and defaulted.

    The refusals are recorded in a fixed order (the boot guard says the first):
    log format, event loop, health host, PgBouncer, then the numbers as ``_NUMBERS``
    lists them.
    """
    defaults = Tuning()
    log_format = (blank_as_unset(env, LOG_FORMAT_ENV) or defaults.log_format).lower()
    if log_format not in ("json", "console", "auto"):
        problems.refuse(
            LOG_FORMAT_ENV,
            f"{LOG_FORMAT_ENV}={shown(env.get(LOG_FORMAT_ENV) or '')} is not valid: set it to "
            "json, console or auto (default auto: console on a terminal, json otherwise).",
        )
        log_format = defaults.log_format
    event_loop = (blank_as_unset(env, EVENT_LOOP_ENV) or defaults.event_loop).lower()
    if event_loop not in ("uvloop", "asyncio"):
        problems.refuse(
            EVENT_LOOP_ENV,
            f"{EVENT_LOOP_ENV}={shown(env.get(EVENT_LOOP_ENV) or '')} is not valid: set it to "
            "uvloop or asyncio (default uvloop; asyncio where uvloop cannot be imported).",
        )
        event_loop = defaults.event_loop
    health_host = blank_as_unset(env, HEALTH_HOST_ENV) or defaults.health_host
    if not HOST.fullmatch(health_host):
        problems.refuse(
            HEALTH_HOST_ENV,
            f"{HEALTH_HOST_ENV}={shown(health_host)} is not an address to listen on: set it to "
            "an IP address or host name of this machine (default 0.0.0.0, every interface; "
            "127.0.0.1 keeps the page local), or unset it.",
        )
        health_host = defaults.health_host
    pgbouncer = flag(
        env,
        problems,
        PGBOUNCER_ENV,
        f"when {DATABASE_URL_ENV} goes through PgBouncer transaction pooling",
    )
    values: dict[str, object] = {
        name: number(env, problems, variable, getattr(defaults, name), parse, (low, high), meaning)
        for name, variable, parse, low, high, meaning in _NUMBERS
    }
    ledger_path = blank_as_unset(env, LEDGER_PATH_ENV) or defaults.ledger_path
    if not _LEDGER_PATH.fullmatch(ledger_path):
        problems.refuse(
            LEDGER_PATH_ENV,
            f"{LEDGER_PATH_ENV}={shown(ledger_path)} is not a URL path: set it to the path "
            "ledger facts are POSTed to on the run's runtime API base URL, starting with / "
            f"(default {defaults.ledger_path}), or unset it.",
        )
        ledger_path = defaults.ledger_path
    values.update(
        log_format=log_format,
        event_loop=event_loop,
        health_host=health_host,
        pgbouncer=pgbouncer,
        ledger_path=ledger_path,
    )
    assert set(values) == {f.name for f in fields(Tuning)}
    return Tuning(**values)  # type: ignore[arg-type]  # each value checked above
