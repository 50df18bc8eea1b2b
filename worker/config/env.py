"""The environment contract's names, and the parsers every value goes through.

Values are refused, never guessed: numbers are ASCII digits within bounds,
yes/no flags take 1/true/yes/on or 0/false/no/off, and a blank value is unset.
A refusal names the variable and quotes at most 100 characters of its value.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

# DATABASE_URL_ENV is re-exported: this module names every variable of the contract.
from worker import lanes
from worker.config.dburl import DATABASE_URL_ENV as DATABASE_URL_ENV
from worker.errors import LaneConfigError, shown
from worker.jsonvalue import is_utf8

_Number = TypeVar("_Number", int, float)

SERVERLESS_ENV = "VERCEL"
CONCURRENCY_ENV = "LANE_WORKER_CONCURRENCY"
CLAIM_TIMEOUT_ENV = "LANE_WORKER_CLAIM_TIMEOUT"
POLL_INTERVAL_ENV = "LANE_WORKER_POLL_INTERVAL"
LISTEN_POLL_INTERVAL_ENV = "LANE_WORKER_LISTEN_POLL_INTERVAL"
DRAIN_SECONDS_ENV = "LANE_WORKER_DRAIN_SECONDS"
PROCESSES_ENV = "LANE_WORKER_PROCESSES"
# Set by a LANE_WORKER_PROCESSES supervisor on each process it starts (its pid):
# the process then takes its stop rules from the supervisor (worker/daemon/processes.py).
SUPERVISOR_PID_ENV = "LANE_WORKER_SUPERVISOR_PID"
HEALTH_PORT_ENV = "LANE_WORKER_HEALTH_PORT"
HEALTH_HOST_ENV = "LANE_WORKER_HEALTH_HOST"
# The operator page's actions (retry, cancel, move): unset, the page is read-only.
PAGE_TOKEN_ENV = "LANE_WORKER_PAGE_TOKEN"  # noqa: S105 (a name, not a token)
# The database URL the worker's pages read (and act) with, when not the daemon's own:
# a login of the viewer's role makes the page read-only in the database (issue 33).
PAGE_URL_ENV = "LANE_WORKER_PAGE_POSTGRES"
# The scaler's process backend: the URL its machines connect with (a worker login),
# when the scaler itself connects as the scaler's role (issue 33).
MACHINE_URL_ENV = "LANE_WORKER_MACHINE_POSTGRES"
BOOT_RETRY_ENV = "LANE_WORKER_BOOT_RETRY"
MAX_ATTEMPTS_ENV = "LANE_WORKER_MAX_ATTEMPTS"
LOG_FORMAT_ENV = "LANE_WORKER_LOG_FORMAT"
EVENT_LOOP_ENV = "LANE_WORKER_EVENT_LOOP"
PGBOUNCER_ENV = "LANE_WORKER_PGBOUNCER"
DEFER_ALERT_AFTER_ENV = "LANE_WORKER_DEFER_ALERT_AFTER"
DEFER_FAIL_AFTER_ENV = "LANE_WORKER_DEFER_FAIL_AFTER"
UNKNOWN_PLAY_GRACE_ENV = "LANE_WORKER_UNKNOWN_PLAY_GRACE"
PRUNE_AFTER_ENV = "LANE_WORKER_PRUNE_AFTER"
# A dev lane (a worktree's) with no live worker and no open run this long is retired by
# maintenance, then pruned as any retired lane (LANE_WORKER_PRUNE_AFTER).
DEV_LANE_IDLE_AFTER_ENV = "LANE_WORKER_DEV_LANE_IDLE_AFTER"
# The machine a worker runs on, as the scaler knows it: Fly sets FLY_MACHINE_ID,
# the scaler's process backend LANE_WORKER_MACHINE_ID.
MACHINE_ID_ENV = "LANE_WORKER_MACHINE_ID"
# `lane-worker scaler`'s own.
SCALER_BACKEND_ENV = "LANE_WORKER_SCALER_BACKEND"
SCALER_STATE_DIR_ENV = "LANE_WORKER_SCALER_STATE_DIR"
FLY_API_URL_ENV = "LANE_WORKER_FLY_API_URL"
# The workers' app, when the scaler runs in an app of its own (FLY_APP_NAME names that one).
FLY_APP_ENV = "LANE_WORKER_FLY_APP"
FLY_MACHINE_ID_ENV = "FLY_MACHINE_ID"
LEDGER_PATH_ENV = "LANE_WORKER_LEDGER_PATH"
LEDGER_CONCURRENCY_ENV = "LANE_WORKER_LEDGER_CONCURRENCY"
LEDGER_PER_ENDPOINT_ENV = "LANE_WORKER_LEDGER_PER_ENDPOINT"
LEDGER_TIMEOUT_ENV = "LANE_WORKER_LEDGER_TIMEOUT"
LEDGER_RETRY_FOR_ENV = "LANE_WORKER_LEDGER_RETRY_FOR"
# Where lane-worker's run-state store lives when it must not be the scheduler schema
# (another system's tables there); the lane rules never read it.
STORE_SCHEMA_ENV = "LANE_WORKER_STORE_SCHEMA"
# Read by the test suite only; listed so doctor does not call it a typo.
TEST_DATABASE_URL_ENV = "LANE_WORKER_TEST_DATABASE_URL"


class Problems:
    """Collects configuration errors and warnings while ``diagnose`` reads the environment."""

    def __init__(self) -> None:
        self.errors: list[LaneConfigError] = []
        self.warnings: list[str] = []

    def refuse(self, variable: str, sentence: str) -> None:
        self.errors.append(LaneConfigError(sentence, variable=variable))


def blank_as_unset(env: Mapping[str, str], name: str) -> str | None:
    """Return the stripped value of ``name``, or None when it is unset or blank."""
    # `NAME=` in an env file means "not set", not "set to nothing".
    value = (env.get(name) or "").strip()
    return value or None


_WHOLE = re.compile(r"[0-9]+")
# An IPv4 or IPv6 address or a host name: what a socket can be bound to.
HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|[0-9A-Fa-f:.]{2,45}")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
# Release ids are git shas or deploy slugs; a longer one is a pasted mistake.
MAX_RELEASE_ID_CHARS = 200


# Far past every bound, and short of int()'s digit limit and float's overflow.
_MAX_DIGITS = 30


def whole_number(raw: str) -> int | None:
    """Parse ASCII digits only: ``int()`` would also take ``1_000``, ``+5`` and fullwidth digits."""
    return int(raw) if len(raw) <= _MAX_DIGITS and _WHOLE.fullmatch(raw) else None


def decimal_number(raw: str) -> float | None:
    """Parse an ASCII decimal (``0.5``, ``2``); no exponents, signs, ``nan`` or ``inf``."""
    return float(raw) if len(raw) <= _MAX_DIGITS and _DECIMAL.fullmatch(raw) else None


def _plain(value: float) -> str:
    """A bound as a user writes it: ``86400``, ``0.5`` (never ``86400.0``)."""
    return f"{value:g}" if value != int(value) else str(int(value))


def number(
    env: Mapping[str, str],
    problems: Problems,
    name: str,
    default: _Number,
    parse: Callable[[str], _Number | None],
    bounds: tuple[_Number, ...],
    meaning: str,
) -> _Number:
    minimum, maximum = bounds
    raw = blank_as_unset(env, name)
    if raw is None:
        return default
    value = parse(raw)
    if value is None or not minimum <= value <= maximum:
        problems.refuse(
            name,
            f"{name}={shown(raw)} is not valid: set it to {meaning} between {_plain(minimum)} "
            f"and {_plain(maximum)} in ASCII digits (default {_plain(default)}), or unset it.",
        )
        return default
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(env: Mapping[str, str], problems: Problems, name: str, meaning: str) -> bool:
    """Read a yes/no variable: 1/true/yes/on, or 0/false/no/off; blank or unset is no."""
    raw = (blank_as_unset(env, name) or "false").lower()
    if raw not in _TRUE + _FALSE:
        problems.refuse(
            name,
            f"{name}={shown(env.get(name) or '')} is not valid: set it to 1 or true {meaning}, "
            "else to 0 or false, or unset it.",
        )
    return raw in _TRUE


def supervised_by_parent(env: Mapping[str, str]) -> bool:
    """Tell whether this process is one a LANE_WORKER_PROCESSES supervisor started.

    Only when the variable names this process's parent: set by hand (or left in
    an environment copied from a supervised process) it changes nothing.
    """
    raw = (env.get(SUPERVISOR_PID_ENV) or "").strip()
    return raw.isascii() and raw.isdigit() and int(raw) == os.getppid()


def supervisor_pid_warnings(env: Mapping[str, str]) -> list[str]:
    """Warn when SUPERVISOR_PID_ENV is set but does not name this process's supervisor."""
    if not (env.get(SUPERVISOR_PID_ENV) or "").strip() or supervised_by_parent(env):
        return []
    return [
        f"{SUPERVISOR_PID_ENV} is set, but this process's parent is not a "
        "LANE_WORKER_PROCESSES supervisor it names; it is ignored (the supervisor sets it "
        "on its own processes: do not set it yourself)."
    ]


# The families of names lane-worker reads. LANE_WORKER_* is lane-worker's own: every
# name there that it does not read is a mistake. DEEPLINE_* and WORKFLOW_RUNTIME_* are
# shared with the TypeScript app, which reads names of its own there: only a name
# close to one lane-worker reads is called a likely typo.
_OWN_FAMILY = "LANE_WORKER_"
_SHARED_FAMILIES = ("DEEPLINE_", "WORKFLOW_RUNTIME_")
# difflib's ratio at or above which a name in a shared family reads as a misspelling
# (after the prefix: ABSURD_QUEUE_SUFIX to ABSURD_QUEUE_SUFFIX is 0.97).
_TYPO_RATIO = 0.85
# difflib's ratio of whole names (upper-cased) at or above which any other name reads as
# a misspelling of one lane-worker reads: a typo in the prefix (DEEPLNE_ABSURD_QUEUE_SUFFIX
# 0.98, LANEWORKER_CONCURRENCY 0.98), or the right name in the wrong case (1.0). The
# app's own names stay below it (DEEPLINE_RUNTIME_DEPLOY_ENV is 0.90).
_WHOLE_NAME_RATIO = 0.92


def known_variables() -> frozenset[str]:
    """Return every variable name lane-worker reads in the families it warns about."""
    names = {value for key, value in globals().items() if key.endswith("_ENV")}
    names |= {lanes.RELEASE_ID_ENV, lanes.QUEUE_SUFFIX_ENV, lanes.SCHEDULER_SCHEMA_ENV}
    return frozenset(n for n in names if n.startswith((_OWN_FAMILY, *_SHARED_FAMILIES)))


def read_variables() -> frozenset[str]:
    """Return every variable name lane-worker reads, in any family or none."""
    names = {value for key, value in globals().items() if key.endswith("_ENV")}
    return frozenset(names | known_variables())


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """Warn of every set variable that looks meant for lane-worker but is not read.

    In lane-worker's families (the prefix in any case), each warning names the
    closest name lane-worker reads (a typo such as DEEPLINE_ABSURD_QUEUE_SUFIX
    silently served the shared lane). Any other name is warned when its whole
    name, upper-cased, is close to one lane-worker reads: a typo in the prefix
    (DEEPLNE_ABSURD_QUEUE_SUFFIX) or a name in the wrong case.
    """
    known = known_variables()
    every = read_variables()
    said = []
    for name in sorted(env):
        if name in every:
            continue
        upper = name.upper()
        family = next((f for f in (_OWN_FAMILY, *_SHARED_FAMILIES) if upper.startswith(f)), None)
        near: list[str] = []
        if family is not None:
            # Compared without the family's prefix, which every candidate shares.
            tails = {k[len(family) :]: k for k in known if k.startswith(family)}
            cutoff = 0.6 if family == _OWN_FAMILY else _TYPO_RATIO
            tail = upper[len(family) :]
            near = [tails[t] for t in difflib.get_close_matches(tail, tails, 1, cutoff)]
        if not near:
            near = difflib.get_close_matches(upper, sorted(every), 1, _WHOLE_NAME_RATIO)
        if near and near[0] == upper:
            said.append(
                f"{name} is set but lane-worker does not read it (names are case-sensitive: "
                f"{near[0]}?); it is ignored."
            )
        elif near and near[0].startswith(_OWN_FAMILY):
            said.append(
                f"{name} is set but lane-worker does not read it (a typo of {near[0]}?); "
                "it is ignored."
            )
        elif near:
            said.append(
                f"{name} is set but lane-worker does not read it (a typo of {near[0]}?); it is "
                "ignored (a name only the app reads is no typo: then ignore this warning)."
            )
        elif family == _OWN_FAMILY:
            said.append(f"{name} is set but lane-worker does not read it (a typo?); it is ignored.")
    return said


PAGE_TOKEN_CHARS = (16, 256)
_PAGE_TOKEN = re.compile(r"[\x21-\x7e]+")


def page_token(env: Mapping[str, str], problems: Problems) -> str | None:
    """Read LANE_WORKER_PAGE_TOKEN (None: unset, the page is read-only); refuse a weak one.

    The refusal never quotes the value: it is a secret.
    """
    raw = blank_as_unset(env, PAGE_TOKEN_ENV)
    if raw is None:
        return None
    low, high = PAGE_TOKEN_CHARS
    if not low <= len(raw) <= high or not _PAGE_TOKEN.fullmatch(raw):
        problems.refuse(
            PAGE_TOKEN_ENV,
            f"{PAGE_TOKEN_ENV} is not a usable page token: set it to {low} to {high} printable "
            "ASCII characters without spaces (openssl rand -hex 32 makes one), or unset it to "
            "keep the page read-only.",
        )
        return None
    return raw


def plain_text(value: str) -> bool:
    """Tell whether ``value`` has no control character and encodes as UTF-8 (it is stored)."""
    return value.isprintable() and is_utf8(value)
