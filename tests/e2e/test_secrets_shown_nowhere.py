"""Hostile passwords in WORKFLOW_RUNTIME_POSTGRES, through real processes: shown nowhere.

Issue "hostile input": whatever a generated password holds (``/ # ? @ : %``, a
space, non-ASCII letters) and however the URL spells it (as is, percent-encoded,
in the user info or as ``?password=``), no process prints any piece of it:
doctor (text and ``--json``), every command's error path (a URL that is refused:
exit 78; a server that answers "no such database" or nothing at all: exit 1),
the daemon's boot failure, its JSON logs, and a play's error as stored and as
``status`` shows it.

Unit-level checks of the same table are in ``tests/unit/test_config_dburl.py``. The
daemon runs ``support.apps.leaky:app``, whose play raises quoting the URL.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote, unquote_plus, urlsplit

import asyncpg
import pytest

from support.cli import run_cli_async, said_line
from support.daemon import Daemons
from worker.config.dburl import redact_url, url_problem

MISSING_DB = "no_such_db_xyz"
RUN_ID = "8d7e2c4a-0b1f-4e55-9a6c-3f2d1e0c9b8a"  # no such run: the commands fail first anyway
RELEASE = "rel-mask"  # no piece of a password ("rel-secret" holds "cret")
APP = "support.apps.leaky:app"
# Nothing listens on port 1: a connection is refused at once, and the CLI retries for 10 s.
CLOSED_PORT = 1
# See tests/unit/test_config_dburl.py: 3-character pieces give false positives ("%2F" is in
# the refusal's hint, " us" in English); a password of 4 characters or fewer counts whole.
MIN_FRAGMENT = 4
COMMAND_TIMEOUT_S = 60.0

# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secret:
    """One password written one way into a database URL."""

    password: str
    encoded: bool
    form: Literal["userinfo", "query"]

    @property
    def written(self) -> str:
        """Return the password as the URL spells it."""
        return quote(self.password, safe="") if self.encoded else self.password

    def url(self, user: str, hostport: str, database: str) -> str:
        """Return the URL, built by hand: a URL library would encode what the test means raw."""
        if self.form == "userinfo":
            return f"postgresql://{user}:{self.written}@{hostport}/{database}"
        return f"postgresql://{user}@{hostport}/{database}?password={self.written}"

    @property
    def id(self) -> str:
        """Return the test id, such as ``userinfo-raw-S3cret/Pw``."""
        return f"{self.form}-{'enc' if self.encoded else 'raw'}-{self.password}"


REFUSED = [
    Secret("S3cret/Pw", encoded=False, form="userinfo"),
    Secret("kX9#p/Q?z@Lm:4%w", encoded=False, form="userinfo"),
    Secret("kX9#p/Q?z@Lm:4%w", encoded=False, form="query"),  # '#' ends a URL anywhere
    # urlsplit raised ValueError("'S3cret' does not appear to be an IPv4 or IPv6 address").
    Secret("p[S3cret]w", encoded=False, form="userinfo"),
]
ACCEPTED = [
    Secret("S3cret/Pw", encoded=True, form="userinfo"),
    Secret("kX9#p/Q?z@Lm:4%w", encoded=True, form="userinfo"),
    Secret("p:ss w✓rd", encoded=False, form="userinfo"),
    Secret("50%off", encoded=False, form="userinfo"),
    Secret("S3cret/Pw", encoded=False, form="query"),
    Secret("pässwörd✓", encoded=True, form="query"),
]


def params(secrets: list[Secret]) -> list[Any]:
    """Return ``secrets`` as pytest params with readable ids."""
    return [pytest.param(s, id=s.id) for s in secrets]


ALL = [*params(REFUSED), *params(ACCEPTED)]


# -- helpers -------------------------------------------------------------------------------


def fragments(secret: str) -> set[str]:
    """Return every substring of ``secret`` of MIN_FRAGMENT characters (``secret`` if shorter)."""
    if len(secret) <= MIN_FRAGMENT:
        return {secret}
    return {secret[i : i + MIN_FRAGMENT] for i in range(len(secret) - MIN_FRAGMENT + 1)}


def assert_not_shown(text: str, password: str, *, where: str) -> None:
    """Fail if ``text`` holds a piece of ``password`` as written, decoded, or it whole encoded."""
    for spelling in {password, unquote(password), unquote_plus(password)}:
        for piece in sorted(fragments(spelling)):
            assert piece not in text, (
                f"{where} shows {piece!r}, a piece of the password {password!r}:\n{text}"
            )
    encoded = quote(unquote(password), safe="")
    assert encoded not in text, f"{where} shows the password {password!r} encoded:\n{text}"


def decoded_json(text: str) -> str:
    """Return JSON text (one document, or one per line) re-rendered without ``\\u`` escapes."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        pass
    out = []
    for line in text.splitlines():
        try:
            out.append(json.dumps(json.loads(line), ensure_ascii=False))
        except ValueError:
            out.append(line)
    return "\n".join(out)


@dataclass(frozen=True)
class Ran:
    """What one command did."""

    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    @property
    def shown(self) -> str:
        """Return everything it printed, JSON decoded (``\\u00e4`` as ``ä``)."""
        return f"{decoded_json(self.stdout)}\n{self.stderr}"

    def __str__(self) -> str:
        return f"lane-worker {' '.join(self.args)} -> exit {self.code}\n{self.shown}"


async def lane_worker(env: dict[str, str], *args: str) -> Ran:
    """Run ``python -m worker ARGS`` with exactly ``env`` (plus PATH); return what it did."""
    try:
        done = await run_cli_async(env, *args, timeout_s=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"lane-worker {' '.join(args)} ran over {COMMAND_TIMEOUT_S} s"
        ) from None
    return Ran(args, done.returncode, done.stdout, done.stderr)


async def run_all(env: dict[str, str], commands: list[tuple[str, ...]]) -> list[Ran]:
    """Run ``commands`` side by side (the slow ones mostly wait on the network)."""
    return list(await asyncio.gather(*(lane_worker(env, *c) for c in commands)))


def command_env(url: str) -> dict[str, str]:
    """Return the environment of a command or daemon on ``url`` (a free health port for run)."""
    return {
        "WORKFLOW_RUNTIME_POSTGRES": url,
        "LANE_WORKER_HEALTH_PORT": "0",
        "LANE_WORKER_LOG_FORMAT": "json",
    }


def one_error_line(ran: Ran) -> str:
    """Return the one ``lane-worker: ...`` line on stderr, failing on anything else."""
    assert "Traceback" not in ran.shown, str(ran)
    lines = [said_line(line) for line in ran.stderr.splitlines()]
    assert len(lines) == 1, str(ran)
    assert lines[0].startswith("lane-worker: "), str(ran)
    return lines[0]


def server_parts(admin_url: str) -> tuple[str, str]:
    """Return the user and ``host:port`` of the test server (its own password dropped)."""
    parts = urlsplit(admin_url)
    return parts.username or "postgres", parts.netloc.rpartition("@")[2]


# Every command that talks to the database; `run` is the daemon's boot.
# One --json variant: the error path is the same with or without it.
DB_COMMANDS: list[tuple[str, ...]] = [
    ("lanes",),
    ("status", RUN_ID, "--json"),
    ("submit", "p"),
    ("signal", RUN_ID, "k"),
    ("cancel", RUN_ID),
    ("lanes", "retire", "r"),
    ("lanes", "activate", "r"),
    ("migrate",),
    ("run", "--app", "worker.demo:app"),
]


# -- doctor ----------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ALL)
async def test_doctor_shows_nothing_of_the_password(secret: Secret) -> None:
    """doctor and doctor --json: exit 78 for a refused URL (0 else), no piece of the password."""
    url = secret.url("lane", "db.internal:5432", "runtime")
    refused = url_problem(url) is not None
    text, as_json = await run_all(command_env(url), [("doctor",), ("doctor", "--json")])
    for ran in (text, as_json):
        assert "Traceback" not in ran.shown, str(ran)
        assert ran.code == (78 if refused else 0), str(ran)
        assert_not_shown(ran.shown, secret.written, where=str(ran.args))
    report = json.loads(as_json.stdout)
    if refused:
        assert report["refused"] is True
        assert report["database"] is None
        assert "WORKFLOW_RUNTIME_POSTGRES" in [e["variable"] for e in report["errors"]]
        assert one_error_line(text).startswith("lane-worker: WORKFLOW_RUNTIME_POSTGRES ")
    else:
        # The URL is shown, with its password masked: the check above looked at it.
        assert report["database"] == redact_url(url)
        assert "***" in report["database"]
        assert redact_url(url) in text.stdout


# -- every command's error path ------------------------------------------------------------


@pytest.mark.parametrize("secret", ALL)
async def test_every_command_fails_without_showing_the_password(
    secret: Secret, pg_server: Any
) -> None:
    """Refused: 78 before connecting. Accepted: the server says "no such database", exit 1.

    Either way one sentence on stderr, no traceback, no piece of the password,
    stdout included (where `run` prints its JSON logs).
    """
    user, hostport = server_parts(pg_server.admin_url)
    url = secret.url(user, hostport, MISSING_DB)
    refused = url_problem(url) is not None
    commands = DB_COMMANDS + ([("dev",)] if refused else [])  # dev's exit 1: test_dev_...
    for ran in await run_all(command_env(url), commands):
        line = one_error_line(ran)
        assert_not_shown(ran.shown, secret.written, where=str(ran.args))
        if refused:
            assert ran.code == 78, str(ran)
            assert line.startswith("lane-worker: WORKFLOW_RUNTIME_POSTGRES "), str(ran)
            assert ran.stdout == "", str(ran)
        else:
            assert ran.code == 1, str(ran)
            assert line == (
                f"lane-worker: the runtime database at {redact_url(url)} answered: "
                f'database "{MISSING_DB}" does not exist; create it (createdb, or CREATE '
                "DATABASE) and run lane-worker migrate, or fix the URL's database name."
            ), str(ran)


async def test_every_accepted_url_fails_unreachable_without_showing_the_password() -> None:
    """Nothing listens: after its 10 s of retries each command exits 1 naming the masked URL.

    All cases run side by side (the commands mostly wait), so this takes about 12 s;
    three commands each, as they share one error path (`run` retries for 60 s: not here).
    """
    commands: list[tuple[str, ...]] = [("lanes",), ("status", RUN_ID, "--json"), ("submit", "p")]
    cases = [(s, s.url("postgres", f"127.0.0.1:{CLOSED_PORT}", "runtime")) for s in ACCEPTED]
    results = await asyncio.gather(*(run_all(command_env(url), commands) for _, url in cases))
    for (secret, url), ran_all in zip(cases, results, strict=True):
        for ran in ran_all:
            line = one_error_line(ran)
            assert_not_shown(ran.shown, secret.written, where=f"{secret.id} {ran.args}")
            assert ran.code == 1, str(ran)
            assert line.startswith(
                f"lane-worker: cannot reach the runtime database at {redact_url(url)} ("
            ), str(ran)
    # No bound on the whole (dozens of processes side by side on a shared machine: the
    # total is what load stretches): each command's own limit catches one that hangs.


async def test_dev_with_a_missing_database_fails_in_one_sentence(pg_server: Any) -> None:
    """`lane-worker dev` on a configured URL whose database is missing: exit 1, one sentence."""
    user, hostport = server_parts(pg_server.admin_url)
    secret = ACCEPTED[0]
    ran = await lane_worker(command_env(secret.url(user, hostport, MISSING_DB)), "dev")
    assert_not_shown(ran.shown, secret.written, where="dev")
    assert ran.code == 1, str(ran)
    one_error_line(ran)


# -- the daemon: JSON logs, the stored error, status -------------------------------------------


async def store_text(database_url: str) -> str:
    """Return every row of every table of the store and the engine, as text, one per line."""
    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetch(
            "select table_schema, table_name from information_schema.tables"
            " where table_schema in ('runtime_scheduler', 'absurd') and table_type = 'BASE TABLE'"
        )
        rows = []
        for schema, table in tables:
            ident = f'"{schema}"."{table}"'
            rows += [r[0] for r in await conn.fetch(f"select t::text from {ident} t")]
        return "\n".join(rows)
    finally:
        await conn.close()


def daemon_secret_case(secret: Secret, mark: Any = ()) -> Any:
    """Return ``secret`` as a param of the daemon test."""
    return pytest.param(secret, id=secret.id, marks=mark)


@pytest.mark.parametrize(
    "secret",
    [
        daemon_secret_case(Secret("S3cret/Pw", encoded=True, form="userinfo")),
        daemon_secret_case(Secret("p:ss w✓rd", encoded=False, form="userinfo")),
        daemon_secret_case(Secret("S3cret/Pw", encoded=True, form="query")),
    ],
)
async def test_a_play_error_quoting_the_url_is_masked_in_logs_store_and_status(
    secret: Secret, database_url: str
) -> None:
    """A play raises with the URL and its password in the message; the run fails.

    Neither the daemon's JSON logs (stdout and stderr), nor `status` (text and
    --json), nor any row of the store or the engine holds a piece of the password;
    the message is there, with ``***`` where the password was.
    """
    parts = urlsplit(database_url)
    user = parts.username or "postgres"
    url = secret.url(user, parts.netloc.rpartition("@")[2], parts.path.lstrip("/"))
    if parts.query:
        url += ("&" if "?" in url else "?") + parts.query
    assert url_problem(url) is None, url
    try:  # the password reaches the server only if it checks one: this needs trust auth
        conn = await asyncpg.connect(url)
    except asyncpg.InvalidPasswordError:
        pytest.skip("the test server checks passwords; this test needs trust authentication")
    try:
        assert await conn.fetchval("select current_database()") == parts.path.lstrip("/")
    finally:
        await conn.close()
    env = {
        **command_env(url),
        "DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE,
        "LANE_WORKER_MAX_ATTEMPTS": "1",  # fail at once, no backoff
    }
    async with Daemons(database_url) as pool:
        daemon = pool.start(RELEASE, app=APP, **env)
        await daemon.ready()
        submitted = await lane_worker(env, "submit", "leak-url", "--json")
        assert submitted.code == 0, str(submitted)
        run_id = json.loads(submitted.stdout)["runId"]
        failed = await daemon.wait_for("run.failed", run_id=run_id, timeout_s=30)
        status_json, status_text = await run_all(
            env, [("status", run_id, "--json"), ("status", run_id)]
        )
        stored = await store_text(database_url)
        daemon.terminate()
        assert await daemon.wait_exit() == 0, daemon.tail()
        logs = "\n".join(
            json.dumps({k: v for k, v in r.items() if k != "_mono"}, ensure_ascii=False)
            for r in daemon.records
        )
        logs += "\n" + daemon.stderr

    assert failed["error"]["name"] == "RuntimeError", failed
    report = json.loads(status_json.stdout)
    assert (status_json.code, report["status"]) == (0, "failed"), str(status_json)
    assert status_text.code == 0, str(status_text)

    assert_not_shown(logs, secret.written, where="the daemon's logs")
    assert_not_shown(status_json.shown, secret.written, where="status --json")
    assert_not_shown(status_text.shown, secret.written, where="status")
    assert_not_shown(stored, secret.written, where="the stored rows")

    # The play did raise with the URL and it was masked, else the checks above prove nothing.
    assert "cannot connect to postgresql://" in failed["error"]["message"], failed
    assert "***" in failed["error"]["message"], failed
    assert "***" in report["error"]["message"], str(status_json)
    assert "***" in status_text.stdout, str(status_text)
    assert "RuntimeError" in stored
    assert "***" in stored
