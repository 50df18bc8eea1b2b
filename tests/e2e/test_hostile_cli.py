"""Hostile and careless input at the command line: one sentence, the documented exit, no change.

Every case runs the real ``lane-worker`` console script (the one ``make install`` puts on
PATH) as a child process, with exactly the environment it gives (plus PATH), and asserts:

* the documented exit code (2 usage, 78 configuration, 1 anything else);
* stderr is one sentence: one ``lane-worker: ...`` line for 1 and 78, click's usage
  error (``Usage:``, ``Try ... --help``, one ``Error:`` line) for 2, naming the problem;
* nothing reaches stdout, no ``Traceback`` anywhere, the URL's password nowhere;
* the database is the same afterwards: its schemas, the row count of every table, the
  lane registry, the runs and the engine's queues (``snapshot``).

A case runs against an *empty* database (the ``empty_database_url`` fixture: no schemas at
all) or a *migrated* one (both schemas, one known lane, one run with an idempotency key).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
import secrets
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import asyncpg
import pytest
from click.testing import CliRunner

from support import pgfixture
from support.cli import one_error_line, run_cli
from support.daemon import Daemons
from support.pgfixture import DatabaseFactory, PgServer
from worker.cli import cli
from worker.client import LaneClient
from worker.limits import MAX_INPUT_BYTES

PASSWORD = "Hunter2-s3cret-pw"
KNOWN_RELEASE = "rel-known"
KEY = "order-42"
RUN_INPUT = {"a": 1}
STORE = "runtime_scheduler"
TYPO_SCHEMA = "runtime_scheduler_typo"
LONG_RELEASE = "a" * 201
LONG_KEY = "k" * 256
FIVE_THOUSAND_DIGITS = "9" * 5000
# `run` needs --app (without it: 78 before the environment is read).
RUN_DEMO = ("run", "--app", "worker.demo:app")
DEEP_3000 = "[" * 3000 + "]" * 3000  # 6 KB of JSON text
MIGRATE_PHRASE = "run `lane-worker migrate` first"
ISOLATED_PHRASE = (
    "is an isolated topology, which needs its own queue: set DEEPLINE_ABSURD_QUEUE_SUFFIX"
)
MIB_PHRASE = f"{MAX_INPUT_BYTES} bytes (1 MiB)"
TIMEOUT_PHRASE = "is not a number of seconds above 0"
KEY_PHRASE = "a key has at most 255 characters and no NUL or unpaired surrogate character"
NO_TLS_PHRASE = "the database server does not accept TLS, but WORKFLOW_RUNTIME_POSTGRES asks for it"
PORT_PHRASE = "WORKFLOW_RUNTIME_POSTGRES has a port that is not a number from 1 to 65535"
SSLMODE_PHRASE = "WORKFLOW_RUNTIME_POSTGRES has an sslmode other than disable, allow, prefer"
QUICK_S = 8.0  # well under the CLI's 10 s connect retry and the daemon's 60 s

# Over 1 MiB of JSON text; and under 1 MiB of text that is over 1 MiB as compact JSON
# (1e15 is written back as 1000000000000000.0).
BIG_TEXT = json.dumps({"k": "x" * MAX_INPUT_BYTES}).encode()
BIG_WHEN_COMPACT = ('{"k": [' + ",".join(["1e15"] * 200_000) + "]}").encode()
SMALL_OBJECT = {"from": "file", "n": [1, 2.5, None, True], "nested": {"k": "v\u00e9"}}


# --- running the CLI --------------------------------------------------------------------


def lane_worker(
    env: Mapping[str, str],
    *args: str | bytes,
    stdin: bytes | None = None,
    timeout: float = 60,
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the ``lane-worker`` script with exactly ``env`` (plus PATH); return it and its time."""
    started = time.monotonic()
    result = run_cli(env, *args, stdin=stdin, timeout=timeout, script=True, errors="replace")
    return result, time.monotonic() - started


def usage_error(stderr: str) -> str:
    """Return the ``Error:`` line of click's usage error, failing on any other shape."""
    lines = stderr.splitlines()
    assert len(lines) == 4, f"not click's usage error:\n{stderr}"
    assert lines[0].startswith("Usage: lane-worker "), stderr
    assert re.fullmatch(r"Try 'lane-worker [a-z -]*--help' for help\.", lines[1]), stderr
    assert lines[2] == "", stderr
    assert lines[3].startswith("Error: "), stderr
    return lines[3]


def the_sentence(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert a refusal's shape (see the module doc) and return its one sentence."""
    assert result.returncode == code, (
        f"exit {result.returncode}, expected {code}\nstdout: {result.stdout}\n"
        f"stderr: {result.stderr}"
    )
    everything = result.stdout + result.stderr
    assert "Traceback" not in everything, everything
    assert PASSWORD not in everything, everything
    assert result.stdout == "", result.stdout
    sentence = usage_error(result.stderr) if code == 2 else one_error_line(result)
    assert len(sentence) < 2000, f"{len(sentence)} characters: {sentence[:300]}..."
    return sentence


# --- the database ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What a refused command must leave as it was."""

    schemas: tuple[str, ...]
    row_counts: tuple[tuple[str, int], ...]
    lanes: tuple[tuple[str, str, tuple[str, ...]], ...]
    runs: tuple[tuple[str, str, str, str, str], ...]
    engine_queues: tuple[str, ...]


async def _snapshot(url: str) -> Snapshot:
    conn = await asyncpg.connect(url, timeout=pgfixture.CONNECT_TIMEOUT)
    try:
        schemas = tuple(
            r["nspname"]
            for r in await conn.fetch(
                "select nspname from pg_namespace where nspname !~ '^pg_' "
                "and nspname <> 'information_schema' order by 1"
            )
        )
        tables = await conn.fetch(
            "select table_schema, table_name from information_schema.tables "
            "where table_type = 'BASE TABLE' and table_schema = any($1::text[]) order by 1, 2",
            list(schemas),
        )
        counts = []
        for t in tables:
            name = f'"{t["table_schema"]}"."{t["table_name"]}"'
            counts.append((name, int(await conn.fetchval(f"select count(*) from {name}"))))
        lanes: list[tuple[str, str, tuple[str, ...]]] = []
        runs: list[tuple[str, str, str, str, str]] = []
        if STORE in schemas:
            lanes = [
                (r["queue"], r["status"], tuple(r["release_ids"]))
                for r in await conn.fetch(
                    f"select queue, status, release_ids from {STORE}.releases order by queue"
                )
            ]
            runs = [
                (str(r["run_id"]), r["play"], r["status"], r["queue"], r["input"])
                for r in await conn.fetch(
                    f"select run_id, play, status, queue, input::text from {STORE}.runs "
                    "order by run_id"
                )
            ]
        queues: tuple[str, ...] = ()
        if "absurd" in schemas:
            queues = tuple(
                r["queue_name"]
                for r in await conn.fetch("select queue_name from absurd.queues order by 1")
            )
        return Snapshot(schemas, tuple(counts), tuple(lanes), tuple(runs), queues)
    finally:
        await conn.close()


def snapshot(url: str) -> Snapshot:
    """Take a snapshot of the database at ``url`` (from sync code)."""
    return pgfixture.run(_snapshot(url))


async def _stored_input(url: str, run_id: str) -> Any:
    conn = await asyncpg.connect(url, timeout=pgfixture.CONNECT_TIMEOUT)
    try:
        text = await conn.fetchval(
            f"select input::text from {STORE}.runs where run_id = $1", uuid.UUID(run_id)
        )
    finally:
        await conn.close()
    return json.loads(text)


async def _prepare(url: str) -> str:
    """Migrate, register one lane, submit one run with an idempotency key; return its id."""
    client = await LaneClient.connect(url, env={})
    try:
        await client.migrate()
        await client.activate_release(KNOWN_RELEASE, force=True)
        run = await client.submit("p", RUN_INPUT, idempotency_key=KEY)
    finally:
        await client.close()
    return run.run_id


async def _lane_known(url: str, release_id: str) -> bool:
    client = await LaneClient.connect(url, env={})
    try:
        return await client.lane_known(release_id)
    finally:
        await client.close()


def with_password(url: str) -> str:
    """Return ``url`` with PASSWORD as its password (the test server trusts, so it is unused)."""
    scheme, _, rest = url.partition("://")
    userinfo, at, hostinfo = rest.partition("@")
    if not at:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:{PASSWORD}@{hostinfo}"


def with_port(url: str, port: str) -> str:
    """Return ``url`` with its TCP port replaced by ``port`` (which may be malformed)."""
    parts = urlsplit(url)
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    host = hostinfo.rsplit(":", 1)[0] if not hostinfo.endswith("]") else hostinfo
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return parts._replace(netloc=netloc).geturl()


def with_query(url: str, extra: str) -> str:
    """Return ``url`` with ``extra`` (``key=value``) added to its query."""
    return f"{url}{'&' if urlsplit(url).query else '?'}{extra}"


@dataclass
class Db:
    """One test's database: its URL, the URL the commands get, the prepared run (if any)."""

    url: str
    kind: Literal["empty", "migrated"]
    run_id: str = ""

    @property
    def cli_url(self) -> str:
        """The URL the commands get: the same database, with a password to leak."""
        return with_password(self.url)


@contextlib.contextmanager
def created_database(server: PgServer, template: str, tag: str) -> Iterator[str]:
    """Create a database from ``template``, yield its name, drop it afterwards."""
    name = f"lane_worker_test_hostile_{tag}_{secrets.token_hex(6)}"
    quoted = pgfixture.quote_ident(name)
    admin = server.admin_url
    pgfixture.run(pgfixture._execute(admin, f"CREATE DATABASE {quoted} TEMPLATE {template}"))
    try:
        yield name
    finally:
        pgfixture.run(pgfixture._execute(admin, f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))


@pytest.fixture(scope="module")
def migrated_template(
    pg_server: PgServer, pg_databases: DatabaseFactory
) -> Iterator[tuple[str, str]]:
    """A prepared database to clone (name, prepared run id): preparing once is much faster."""
    session_template = pgfixture.quote_ident(pg_databases.template)  # migrated already
    with created_database(pg_server, session_template, "tpl") as name:
        run_id = pgfixture.run(_prepare(pg_server.url_for(name)))
        yield name, run_id


@pytest.fixture
def migrated(pg_server: PgServer, migrated_template: tuple[str, str]) -> Iterator[Db]:
    """A migrated database with one known lane and one run (idempotency key KEY)."""
    template, run_id = migrated_template
    with created_database(pg_server, pgfixture.quote_ident(template), "migrated") as name:
        yield Db(pg_server.url_for(name), "migrated", run_id)


def open_db(request: pytest.FixtureRequest, kind: Literal["empty", "migrated"]) -> Db:
    """Return this test's database of ``kind``."""
    if kind == "empty":
        return Db(request.getfixturevalue("empty_database_url"), "empty")
    db: Db = request.getfixturevalue("migrated")
    return db


# --- the table ------------------------------------------------------------------------------


UrlChange = Callable[[str], str]


@dataclass(frozen=True)
class Case:
    """One hostile command line and what it must answer.

    ``args`` may hold ``{run}`` (the prepared run's id) and ``{dir}`` (a temporary folder
    holding ``files``); ``says`` may hold ``{run}`` too.
    """

    id: str
    args: tuple[str | bytes, ...]
    code: int
    says: tuple[str, ...]
    db: Literal["empty", "migrated"] = "migrated"
    env: Mapping[str, str] = field(default_factory=dict)
    url: UrlChange | None = None
    stdin: bytes | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)
    quick: bool = False  # must answer within QUICK_S seconds


def _cases() -> Iterator[Case]:
    some_run = str(uuid.uuid4())
    read_and_operate = [
        ("lanes", ("lanes",)),
        ("lanes-json", ("lanes", "--json")),
        ("status", ("status", some_run)),
        ("signal", ("signal", some_run, "approved", "--data", '{"by": "ops"}')),
        ("cancel", ("cancel", some_run)),
        ("retire", ("lanes", "retire", "rel-a")),
        ("activate", ("lanes", "activate", "rel-a")),
        ("retire-force", ("lanes", "retire", "rel-a", "--force")),
        ("activate-force", ("lanes", "activate", "rel-a", "--force")),
    ]
    # Read and operator commands never install schemas.
    for name, args in read_and_operate:
        yield Case(f"no-schemas-{name}", args, 1, (MIGRATE_PHRASE,), db="empty")
    # ... nor a store schema next to an installed engine schema.
    preview = {
        "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "preview_x",
        "DEEPLINE_ABSURD_QUEUE_SUFFIX": "x",
    }
    for name, args in read_and_operate:
        yield Case(
            f"no-store-{name}", args, 1, (MIGRATE_PHRASE, "run-state store preview_x"), env=preview
        )

    # A mistyped store schema is an isolated topology without a suffix: every command refuses.
    typo = {"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": TYPO_SCHEMA}
    for name, args in [
        *read_and_operate,
        ("submit", ("submit", "p")),
        ("submit-suffix", ("submit", "p", "--queue-suffix", "pr-1")),
        ("migrate", ("migrate",)),
        ("run", RUN_DEMO),
    ]:
        yield Case(f"typo-schema-{name}", args, 78, (f"'{TYPO_SCHEMA}'", ISOLATED_PHRASE), env=typo)

    # A release no lane ever had is a typo; an over-long one is no release id at all.
    for verb in ("retire", "activate"):
        yield Case(
            f"unknown-lane-{verb}",
            ("lanes", verb, "rel-typo"),
            1,
            (
                "no lane has ever had release 'rel-typo' (queue runs_rel_typo)",
                f"known lanes: {KNOWN_RELEASE}",
                "pass --force to create it anyway",
            ),
        )
        for extra in ((), ("--force",)):
            yield Case(
                f"long-release-{verb}{''.join(extra)}",
                ("lanes", verb, LONG_RELEASE, *extra),
                2,
                ("'RELEASE_ID'", "a release id has at most 200 characters (this one has 201)"),
            )
        yield Case(
            f"no-lane-release-{verb}",
            ("lanes", verb, "..."),
            2,
            ("release id '...' has no letter, digit or underscore, so it names no lane",),
        )

    # --input: a JSON object only, storable, at most 1 MiB, inline, @FILE or stdin.
    not_an_object = "a run's input must be a JSON object (a dict), not"
    for name, text, says in [
        ("list", "[1]", f"{not_an_object} list"),
        ("string", '"s"', f"{not_an_object} str"),
        ("number", "5", f"{not_an_object} int"),
        ("float", "2.5", f"{not_an_object} float"),
        ("boolean", "true", f"{not_an_object} bool"),
        ("nan", '{"a": NaN}', "NaN is not JSON"),
        ("infinity", '{"a": Infinity}', "Infinity is not JSON"),
        ("minus-infinity", '{"a": [-Infinity]}', "-Infinity is not JSON"),
        ("bare-nan", "NaN", "NaN is not JSON"),
        ("overflowing-float", '{"a": 1e999}', "a non-finite float (inf) at $.a"),
        ("nul-in-string", '{"a": "x\\u0000y"}', "a string with a NUL character (\\u0000) at $.a"),
        ("nul-in-key", '{"\\u0000": 1}', "a key with a NUL character (\\u0000) at $"),
        ("nul-in-nested-key", '{"a": {"b\\u0000": 1}}', "a key with a NUL character"),
        ("lone-surrogate", '{"a": "\\ud800"}', "a string with a lone surrogate"),
        ("not-json", "{not json", "--input is not valid JSON"),
        ("trailing-garbage", '{"a": 1} x', "--input is not valid JSON (Extra data"),
        ("empty", "", "--input is not valid JSON"),
        # What JSON.stringify writes and no worker could read back (issue 29 §3).
        ("3000-deep", '{"a": ' + DEEP_3000 + "}", "--input is nested too deeply"),
        ("513-deep", '{"a": ' + "[" * 513 + "]" * 513 + "}", "nests deeper than 512 levels"),
        ("5001-digits", '{"a": ' + "1" * 5001 + "}", "an integer with more than 4300 digits"),
    ]:
        yield Case(f"input-{name}", ("submit", "p", "--input", text), 2, ("'--input'", says))
    yield Case(
        "input-file-missing",
        ("submit", "p", "--input", "@{dir}/missing.json"),
        2,
        ("cannot read --input from", "missing.json", "No such file or directory"),
    )
    yield Case(
        "input-file-not-an-object",
        ("submit", "p", "--input", "@{dir}/list.json"),
        2,
        (f"{not_an_object} list",),
        files={"list.json": b"[1, 2]"},
    )
    yield Case(
        "input-file-not-utf8",
        ("submit", "p", "--input", "@{dir}/latin1.json"),
        2,
        ("--input is not UTF-8 text",),
        files={"latin1.json": b'{"a": "caf\xe9"}'},
    )
    yield Case(
        "input-file-nul-under-a-long-key",
        ("submit", "p", "--input", "@{dir}/long-key.json"),
        2,
        ("'--input'", "a string with a NUL character"),
        files={"long-key.json": json.dumps({"k" * 100_000: "\u0000"}).encode()},
    )
    yield Case(
        "input-file-over-1mib",
        ("submit", "p", "--input", "@{dir}/big.json"),
        2,
        ("'--input'", MIB_PHRASE),
        files={"big.json": BIG_TEXT},
    )
    yield Case(
        "input-stdin-over-1mib", ("submit", "p", "--input", "-"), 2, ("'--input'", MIB_PHRASE),
        stdin=BIG_TEXT,
    )  # fmt: skip
    yield Case(
        "input-file-over-1mib-compact",
        ("submit", "p", "--input", "@{dir}/floats.json"),
        2,
        ("the run's input is", MIB_PHRASE, "store large data elsewhere"),
        files={"floats.json": BIG_WHEN_COMPACT},
    )
    yield Case(
        "input-stdin-nan", ("submit", "p", "--input", "-"), 2, ("NaN is not JSON",),
        stdin=b'{"a": NaN}',
    )  # fmt: skip
    yield Case(
        "data-nan",
        ("signal", "{run}", "approved", "--data", '{"by": NaN}'),
        2,
        ("'--data'", "NaN is not JSON"),
    )
    for name, args in [
        ("data-3000-deep", ("signal", "{run}", "approved", "--data", DEEP_3000)),
        ("runner-result-3000-deep", ("runner-result", "{run}", "1", "--data", DEEP_3000)),
    ]:
        yield Case(name, args, 2, ("'--data'", "is nested too deeply"))
    yield Case(
        "data-5001-digits",
        ("signal", "{run}", "approved", "--data", "1" * 5001),
        2,
        ("'--data'", "an integer with more than 4300 digits"),
    )
    yield Case(
        "data-nul",
        ("signal", "{run}", "approved", "--data", '"\\u0000"'),
        2,
        ("'--data'", "a string with a NUL character"),
    )

    # Idempotency keys: a repeat that asks for something else names the existing run.
    conflict = ("idempotency key 'order-42' already names run {run}", "use another key")
    for name, args, env, differs in [
        ("input", ("submit", "p", "--input", '{"a": 2}'), {}, "input"),
        ("no-input", ("submit", "p"), {}, "input"),
        ("play", ("submit", "q", "--input", '{"a": 1}'), {}, "play"),
        ("boolean-for-number", ("submit", "p", "--input", '{"a": true}'), {}, "input"),
        (
            "lane-release",
            ("submit", "p", "--input", '{"a": 1}'),
            {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-b"},
            "lane",
        ),
        (
            "lane-suffix",
            ("submit", "p", "--input", '{"a": 1}', "--queue-suffix", "pr-9"),
            {},
            "lane",
        ),
    ]:
        yield Case(
            f"idempotency-conflict-{name}",
            (*args, "--idempotency-key", KEY),
            1,
            (*conflict, f"differs in its {differs}"),
            env=env,
        )
    # Keys are checked before the database sees them.
    for name, args in [
        ("idempotency-key", ("submit", "p", "--idempotency-key", LONG_KEY)),
        ("event-key", ("signal", "{run}", LONG_KEY)),
    ]:
        yield Case(f"long-{name}", args, 2, (KEY_PHRASE, "'" + "k" * 100 + "...'"))
    yield Case(
        "idempotency-key-not-utf8",
        ("submit", "p", "--idempotency-key", b"order-\xff"),
        2,
        (KEY_PHRASE,),
    )
    yield Case("event-key-not-utf8", ("signal", "{run}", b"approved\xff"), 2, (KEY_PHRASE,))
    yield Case(
        "blank-idempotency-key",
        ("submit", "p", "--idempotency-key", "   "),
        2,
        ("an idempotency key must be a non-blank string",),
    )
    yield Case(
        "blank-event-key", ("signal", "{run}", " "), 2, ("an event key must be a non-blank string",)
    )
    yield Case("long-play", ("submit", "p" * 201), 2, ("a play name has at most 200 characters",))

    # --timeout: a finite number of seconds above 0, only with --wait.
    for value in ("nan", "inf", "-inf", "-1", "0", "0.0", "1e3", "", " "):
        yield Case(
            f"timeout-{value.strip() or ('spaces' if value else 'empty')}",
            ("submit", "p", "--wait", "--timeout", value),
            2,
            ("'--timeout'", f"{value!r} {TIMEOUT_PHRASE}"),
        )
    yield Case(
        "timeout-without-wait",
        ("submit", "p", "--timeout", "5"),
        2,
        ("--timeout only applies together with --wait",),
    )

    # A --queue-suffix that names no queue never falls back to the process's own lane.
    for value in ("---", "   ", "", "..."):
        yield Case(
            f"queue-suffix-{value.strip() or ('spaces' if value else 'empty')}",
            ("submit", "p", "--queue-suffix", value),
            2,
            ("'--queue-suffix'", f"{value!r} names no queue"),
        )

    # The configuration every client call uses, and what submit adds.
    for name, args, env, says in [
        ("vercel", ("lanes",), {"VERCEL": "maybe"}, "VERCEL='maybe' is not valid"),
        (
            "pgbouncer",
            ("status", "{run}"),
            {"LANE_WORKER_PGBOUNCER": "sometimes"},
            "LANE_WORKER_PGBOUNCER='sometimes' is not valid",
        ),
        (
            "max-attempts",
            ("submit", "p"),
            {"LANE_WORKER_MAX_ATTEMPTS": "abc"},
            "LANE_WORKER_MAX_ATTEMPTS='abc' is not valid",
        ),
        (
            "max-attempts-suffix",
            ("submit", "p", "--queue-suffix", "pr-1"),
            {"LANE_WORKER_MAX_ATTEMPTS": "5000"},
            "between 1 and 1000 in ASCII digits",
        ),
        (
            "max-attempts-5000-digits",
            ("submit", "p"),
            {"LANE_WORKER_MAX_ATTEMPTS": FIVE_THOUSAND_DIGITS},
            "LANE_WORKER_MAX_ATTEMPTS=",
        ),
        (
            "concurrency-5000-digits-run",
            RUN_DEMO,
            {"LANE_WORKER_CONCURRENCY": FIVE_THOUSAND_DIGITS},
            "LANE_WORKER_CONCURRENCY=",
        ),
        (
            "deploy-version-DEV-submit",
            ("submit", "p"),
            {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "DEV"},
            "unset it to serve the dev lane",
        ),
        (
            "deploy-version-dev-run",
            RUN_DEMO,
            {"DEEPLINE_RUNTIME_DEPLOY_VERSION": " dev "},
            "unset it to serve the dev lane",
        ),
        (
            "deploy-version-too-long-submit",
            ("submit", "p"),
            {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "r" * 201},
            "has 201 characters, more than the 200 a release id may have",
        ),
        (
            "suffix-names-no-queue",
            ("lanes",),
            {"DEEPLINE_ABSURD_QUEUE_SUFFIX": "---"},
            "names no queue",
        ),
    ]:
        yield Case(f"env-{name}", args, 78, (says,), env=env)

    # A malformed URL: the same exit from the daemon and every command, quoting none of it.
    for name, change, says in [
        ("port-99999", lambda u: with_port(u, "99999"), PORT_PHRASE),
        ("port-abc", lambda u: with_port(u, "abc"), PORT_PHRASE),
        ("sslmode-bogus", lambda u: with_query(u, "sslmode=bogus"), SSLMODE_PHRASE),
    ]:
        for command in (("lanes",), ("submit", "p"), ("migrate",), RUN_DEMO):
            yield Case(
                f"url-{name}-{command[0]}", command, 78, (says,), url=change, quick=True,
            )  # fmt: skip
    # A server without TLS and sslmode=require: a configuration refusal, at once.
    for command in (("lanes",), ("status", "{run}"), ("submit", "p"), ("migrate",), RUN_DEMO):
        yield Case(
            f"url-sslmode-require-{command[0]}",
            command,
            78,
            (NO_TLS_PHRASE, "set sslmode=prefer or disable"),
            url=lambda u: with_query(u, "sslmode=require"),
            quick=True,
        )


CASES = list(_cases())


def _server_has_no_tls(url: str) -> bool:
    async def ssl_off() -> bool:
        conn = await asyncpg.connect(url, timeout=pgfixture.CONNECT_TIMEOUT)
        try:
            return bool(await conn.fetchval("show ssl") == "off")
        finally:
            await conn.close()

    return pgfixture.run(ssl_off())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_command_line_is_refused(
    case: Case, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each case: its exit code, one sentence naming the problem, and no change anywhere."""
    db = open_db(request, case.db)
    url = db.cli_url
    if case.url is not None:
        if "sslmode=require" in case.url(url):
            query = dict(parse_qsl(urlsplit(url).query))
            if "host" in query or not _server_has_no_tls(db.url):
                pytest.skip("needs a TCP server without TLS")
        url = case.url(url)
    for name, content in case.files.items():
        (tmp_path / name).write_bytes(content)

    def fill(value: str | bytes) -> str | bytes:
        if isinstance(value, bytes):
            return value
        return value.replace("{run}", db.run_id).replace("{dir}", str(tmp_path))

    env = {"WORKFLOW_RUNTIME_POSTGRES": url, **case.env}
    if case.args[0] == "run":
        env.setdefault("LANE_WORKER_HEALTH_PORT", "0")  # in case it boots after all
    before = snapshot(db.url)
    result, elapsed = lane_worker(env, *map(fill, case.args), stdin=case.stdin)
    after = snapshot(db.url)

    sentence = the_sentence(result, case.code)
    for phrase in case.says:
        assert str(fill(phrase)) in sentence
    assert after == before
    if db.kind == "empty":
        assert after.schemas == ("public",)  # neither absurd nor the store
    if "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA" in case.env:
        assert case.env["DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"] not in after.schemas
    if case.quick:
        assert elapsed < QUICK_S, f"took {elapsed:.1f} s"


# --- what is accepted, and what it changes ----------------------------------------------------


def ok_json(env: Mapping[str, str], *args: str, stdin: bytes | None = None) -> Any:
    """Run a command with --json that must succeed; return its one object."""
    result, _ = lane_worker(env, *args, "--json", stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert PASSWORD not in result.stdout
    return json.loads(result.stdout)


@pytest.mark.parametrize("how", ["file", "stdin", "inline"])
def test_input_from_a_file_stdin_or_inline_is_stored_as_given(
    migrated: Db, tmp_path: Path, how: str
) -> None:
    """--input @FILE, - and inline JSON each store exactly that object as the run's input."""
    text = json.dumps(SMALL_OBJECT, ensure_ascii=False, indent=2).encode()
    (tmp_path / "input.json").write_bytes(text)
    arg, stdin = {
        "file": (f"@{tmp_path / 'input.json'}", None),
        "stdin": ("-", text),
        "inline": (text.decode(), None),
    }[how]
    env = {"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}
    report = ok_json(env, "submit", "p", "--input", arg, stdin=stdin)
    assert report["created"] is True
    assert pgfixture.run(_stored_input(migrated.url, report["runId"])) == SMALL_OBJECT


@pytest.mark.parametrize("args", [(), ("--input", "null"), ("--input", "{}")])
def test_absent_or_null_input_is_the_empty_object(migrated: Db, args: tuple[str, ...]) -> None:
    """No --input, and JSON null (None), store {} (limits.checked_input: None is {})."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}
    report = ok_json(env, "submit", "p", *args)
    assert pgfixture.run(_stored_input(migrated.url, report["runId"])) == {}


def test_inline_input_over_1_mib_is_a_usage_error(migrated: Db) -> None:
    """Inline --input over 1 MiB exits 2 naming the limit (in process if argv cannot hold it)."""
    text = BIG_TEXT.decode()
    env = {"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}
    before = snapshot(migrated.url)
    result: subprocess.CompletedProcess[str] | None = None
    try:
        result, _ = lane_worker(env, "submit", "p", "--input", text)
    except OSError as exc:  # Linux caps one argument at 128 KiB (MAX_ARG_STRLEN)
        if exc.errno != errno.E2BIG:
            raise
    if result is not None:
        error = the_sentence(result, 2)
    else:
        invoked = CliRunner().invoke(
            cli, ["submit", "p", "--input", text], env=env, prog_name="lane-worker"
        )
        assert invoked.exit_code == 2, invoked.output
        assert isinstance(invoked.exception, SystemExit)
        error = usage_error(invoked.stderr)
    assert "'--input'" in error
    assert MIB_PHRASE in error
    assert snapshot(migrated.url) == before


def test_the_same_key_and_request_returns_the_same_run(migrated: Db) -> None:
    """A repeat of the prepared submit (spelled differently) returns its run, created: false."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}
    before = snapshot(migrated.url)
    report = ok_json(env, "submit", "p", "--input", '{ "a" : 1 }', "--idempotency-key", KEY)
    assert report == {
        "runId": migrated.run_id,
        "releaseId": "dev",
        "queue": "runs",
        "created": False,
        "served": False,  # no worker serves dev here (migration 0029)
        "warning": report["warning"],
    }
    assert snapshot(migrated.url) == before


@pytest.mark.parametrize("verb", ["retire", "activate"])
def test_force_creates_an_unknown_lane_and_its_engine_queue(migrated: Db, verb: str) -> None:
    """--force creates the lane row and the engine queue of a release no lane ever had."""
    env = {"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}
    before = snapshot(migrated.url)
    report = ok_json(env, "lanes", verb, "rel-new", "--force")
    after = snapshot(migrated.url)
    status = "retired" if verb == "retire" else "claiming"
    assert (report["queue"], report["status"]) == ("runs_rel_new", status)
    if verb == "retire":
        assert report["known"] is False
    assert set(after.lanes) - set(before.lanes) == {("runs_rel_new", status, ("rel-new",))}
    assert set(after.engine_queues) - set(before.engine_queues) == {"runs_rel_new"}
    assert after.runs == before.runs


def test_unknown_lane_lists_lanes_known_by_their_queue_only(migrated: Db) -> None:
    """The listing names every lane retire would accept, also one only a submit used."""
    # The prepared run went to the dev lane (queue runs); no worker registered it.
    assert pgfixture.run(_lane_known(migrated.url, "dev"))
    env = {"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}
    result, _ = lane_worker(env, "lanes", "retire", "rel-typo")
    sentence = the_sentence(result, 1)
    listed = sentence.partition("known lanes: ")[2].partition(". Check")[0].split(", ")
    assert "dev" in listed, sentence


# --- the daemon -------------------------------------------------------------------------------


async def answered(port: int, path: str, *, timeout_s: float) -> None:
    """Wait until the daemon's health server answers ``path`` with 200."""
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=2)
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(f"http://127.0.0.1:{port}{path}") as response,
            ):
                if response.status == 200:
                    return
        assert time.monotonic() < deadline, f"{path} did not answer 200 within {timeout_s} s"
        await asyncio.sleep(0.05)


async def test_daemon_logs_an_unknown_lane_worker_variable_as_a_warning(
    database_url: str,
) -> None:
    """A typo'd LANE_WORKER_* variable boots, with one config.warning JSON line naming it."""
    async with Daemons(database_url) as pool:
        daemon = pool.start("rel-warn", LANE_WORKER_CONCURENCY="4")
        warning = await daemon.wait_for("config.warning", timeout_s=30)
        await daemon.ready()
        # worker.ready is logged before the SIGTERM handler is installed (see the report);
        # a request the health server answered means the event loop has moved on since.
        await answered(daemon.health_port, "/readyz", timeout_s=20)
        daemon.terminate()
        assert await daemon.wait_exit() == 0, daemon.tail()
    assert warning["level"] == "warning"
    assert "LANE_WORKER_CONCURENCY is set but lane-worker does not read it" in warning["message"]
    assert daemon.index_of("config.warning") < daemon.index_of("worker.ready")
    assert [w["message"] for w in daemon.events("config.warning")] == [warning["message"]]
    assert daemon.malformed_lines() == []
    assert "Traceback" not in daemon.stderr


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("DEEPLINE_ABSURD_QUEUE_SUFIX", "a typo of"),
        ("DEEPLNE_ABSURD_QUEUE_SUFFIX", "a typo of"),
        ("deepline_absurd_queue_suffix", "names are case-sensitive:"),
    ],
)
async def test_daemon_warns_of_a_misspelt_queue_suffix_naming_the_variable_meant(
    database_url: str, name: str, why: str
) -> None:
    """A misspelt suffix (one F, a letter missing in the prefix, lower case) boots on the
    shared lane: its log says so at once."""
    async with Daemons(database_url) as pool:
        # A dev worktree: no deploy version, so the worker serves the shared `runs` lane.
        daemon = pool.start("dev", DEEPLINE_RUNTIME_DEPLOY_VERSION=None, **{name: "my_branch"})
        warning = await daemon.wait_for("config.warning", timeout_s=30)
        await daemon.ready()
        daemon.terminate()
        assert await daemon.wait_exit() == 0, daemon.tail()
    assert warning["level"] == "warning"
    assert warning["message"].startswith(
        f"{name} is set but lane-worker does not read it ({why} DEEPLINE_ABSURD_QUEUE_SUFFIX?)"
    )
    assert daemon.index_of("config.warning") < daemon.index_of("worker.ready")


def test_refusals_print_before_connecting_even_when_nothing_listens() -> None:
    """A refused configuration answers at once, also when the database never answers."""
    # A server that accepts but never answers: a command that tried it first would hang
    # there (its limit fails the test), and its connection stays queued to be counted.
    # Judged on that count, not on wall time.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        env = {
            "WORKFLOW_RUNTIME_POSTGRES": f"postgresql://u:{PASSWORD}@127.0.0.1:{port}/x",
            "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": TYPO_SCHEMA,
        }
        result, _ = lane_worker(env, "lanes")
        assert ISOLATED_PHRASE in the_sentence(result, 78)
        with pytest.raises(BlockingIOError):
            server.accept()  # no connection came


def test_the_snapshot_sees_what_a_command_changes(migrated: Db) -> None:
    """The snapshot is not blind: a submit that goes through changes it."""
    before = snapshot(migrated.url)
    ok_json({"WORKFLOW_RUNTIME_POSTGRES": migrated.cli_url}, "submit", "p")
    assert snapshot(migrated.url) != before
