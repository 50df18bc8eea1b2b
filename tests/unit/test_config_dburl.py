"""Hostile passwords in the database URL: refused without an echo, or masked in every spelling.

Issue "hostile input": a generated password holds ``/ # ? @ : %``, spaces or
non-ASCII letters, written into ``WORKFLOW_RUNTIME_POSTGRES`` as is or
percent-encoded, in the user info or as a ``?password=`` parameter. For every
such URL either ``url_problem`` refuses it (and the refusal, ``redact_url``
and doctor show nothing of the password), or it is accepted, and then the
driver reads the very password ``url_secrets`` masks, at the host, port, user
and database meant, and nothing prints any part of it.

The real processes (doctor, every command, the daemon's logs and stored
errors) are covered by ``tests/e2e/test_secrets_shown_nowhere.py``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote, unquote_plus

import asyncpg.connect_utils
import pytest
from click.testing import CliRunner

from worker.cli import cli
from worker.config import dburl
from worker.config.settings import DATABASE_URL_ENV, EXIT_CONFIG, EXIT_OK, diagnose

HOST, PORT, USER, DATABASE = "127.0.0.1", 5432, "u", "db"
NOT_SHOWN = "<malformed URL, not shown>"

# Three characters is too short a fragment to call a leak: the refusal's own hint
# quotes "%2F", "%3F", "%23" and "%40", which are 3-character pieces of every
# percent-encoded password holding '/', '?', '#' or '@' ("S3cret%2FPw"); the
# query-decoded "pl us=eq&amp" has " us", a piece of "the user name"; and "off" (of
# "50%off") is English. Four characters has no such false positive in any output
# these tests read; a password of four characters or fewer must not appear whole.
MIN_FRAGMENT = 4

# The issue's table, plus a generated password mixing every hostile character,
# one with brackets, one with digits before a '?' and one with '+', '=' and '&'.
PASSWORDS = (
    "S3cret/Pw",
    "a#b",
    "a?b",
    "p@ss",
    "p:ss",
    "50%off",
    "100%25",
    "with space",
    "pässwörd✓",
    "p:ss w✓rd",
    "kX9#p/Q?z@Lm:4%w",
    "p[S3cret]w",
    "4821?k=Vx9z",
    "pl+us=eq&amp",
)
# Unencoded, these move the URL's boundaries in the user info: the driver would
# read part of the password as a host, a port or a query ("u:4821?k=Vx9z@h/db" is
# host u, port 4821), or urlsplit refuses it ("p[S3cret]w": ValueError quoting
# 'S3cret', which doctor and every command printed as a traceback).
_BOUNDARY_CHARS = "/#?@[]"

Form = Literal["userinfo", "query"]


@dataclass(frozen=True)
class Case:
    """One password written one way into a database URL."""

    password: str  # as the operator means it
    encoded: bool  # percent-encoded in the URL (urllib.parse.quote(pw, safe=""))
    form: Form  # in the user info, or as a ?password= parameter

    @property
    def written(self) -> str:
        """Return the password as the URL spells it."""
        return quote(self.password, safe="") if self.encoded else self.password

    @property
    def decoded(self) -> str:
        """Return the password the driver decodes from the URL (and sends to the server)."""
        # asyncpg unquotes the user info, and reads the query with parse_qs ('+' is a space).
        return unquote(self.written) if self.form == "userinfo" else unquote_plus(self.written)

    def url(
        self, *, host: str = HOST, port: int = PORT, user: str = USER, db: str = DATABASE
    ) -> str:
        """Return the URL, built by hand: a URL library would encode what the test means raw."""
        if self.form == "userinfo":
            return f"postgresql://{user}:{self.written}@{host}:{port}/{db}"
        return f"postgresql://{user}@{host}:{port}/{db}?password={self.written}"

    @property
    def expect_refused(self) -> bool | None:
        """Return whether url_problem must refuse the URL (None: either is fine)."""
        if self.encoded:
            return False  # nothing is left to misread
        if self.form == "query":
            return True if "#" in self.password else None
        return any(c in self.password for c in _BOUNDARY_CHARS)

    @property
    def id(self) -> str:
        """Return the test id, such as ``userinfo-raw-S3cret/Pw``."""
        return f"{self.form}-{'enc' if self.encoded else 'raw'}-{self.password}"


CASES = tuple(
    Case(password, encoded, form)
    for form in ("userinfo", "query")
    for password in PASSWORDS
    for encoded in (False, True)
)


def _no_marks(case: Case) -> list[pytest.MarkDecorator]:
    return []


def params(cases: tuple[Case, ...] = CASES, *, marks: Any = _no_marks) -> list[Any]:
    """Return ``cases`` as pytest params with readable ids (and ``marks(case)``)."""
    return [pytest.param(case, id=case.id, marks=marks(case)) for case in cases]


# -- the assertion helper --------------------------------------------------------------


def fragments(secret: str, min_len: int = MIN_FRAGMENT) -> set[str]:
    """Return every substring of ``secret`` of ``min_len`` characters (``secret`` if shorter)."""
    if len(secret) <= min_len:
        return {secret} if secret else set()
    return {secret[i : i + min_len] for i in range(len(secret) - min_len + 1)}


def assert_not_shown(
    text: str, *passwords: str, min_len: int = MIN_FRAGMENT, where: str = "output"
) -> None:
    """Fail if ``text`` holds any piece of ``min_len`` characters of any spelling of a password.

    Each password counts as written, percent-decoded and percent-encoded (the
    encoded spelling only whole: its 4-character pieces, "%C3%", are common).
    """
    for password in passwords:
        spellings = {password, unquote(password), unquote_plus(password)}
        for spelling in spellings:
            for piece in sorted(fragments(spelling, min_len)):
                assert piece not in text, (
                    f"{where} shows {piece!r}, a piece of the password {password!r}:\n{text}"
                )
        encoded = quote(unquote(password), safe="")
        assert encoded not in text, f"{where} shows the password {password!r} encoded:\n{text}"


def decoded_json(text: str) -> str:
    """Return JSON text (one document, or one per line) re-rendered without ``\\u`` escapes.

    ``json.dumps`` escapes non-ASCII by default, so "pässwörd✓" prints as
    "p\\u00e4ssw..." and a plain substring check would miss it.
    """
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        pass
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.dumps(json.loads(line), ensure_ascii=False))
        except ValueError:
            lines.append(line)
    return "\n".join(lines)


def driver_view(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, str | None]:
    """Return how asyncpg itself splits ``url``: addresses, user, password, database."""
    addrs, params_ = asyncpg.connect_utils._parse_connect_dsn_and_args(  # type: ignore[attr-defined]
        dsn=url, host=None, port=None, user=None, password=None, passfile=None,
        database=None, ssl=None, service=None, servicefile=None, direct_tls=None,
        server_settings=None, target_session_attrs=None, krbsrvname=None, gsslib=None,
    )  # fmt: skip
    return list(addrs), params_.user, params_.password, params_.database


# -- the helper itself can fail ---------------------------------------------------------


def test_assert_not_shown_catches_every_spelling_and_piece() -> None:
    """The helper fails on a piece, the decoded spelling, the encoded one and a short password."""
    for leak, password in [
        ("user S3cret/Pw", "S3cret/Pw"),
        ("…cret/P…", "S3cret/Pw"),  # a piece of 4
        ("decoded S3cret/Pw", "S3cret%2FPw"),  # written encoded, shown decoded
        ("encoded p%C3%A4ssw%C3%B6rd%E2%9C%93", "pässwörd✓"),
        ("short a#b", "a#b"),
        ("plus a b", "a+b"),  # a query value: '+' is a space
    ]:
        with pytest.raises(AssertionError):
            assert_not_shown(leak, password)
    assert_not_shown("postgresql://u:***@127.0.0.1:5432/db", "S3cret/Pw", "a#b", "pässwörd✓")
    assert decoded_json('{"e": "p\\u00e4ss"}') == '{"e": "päss"}'


def test_the_table_covers_the_issue() -> None:
    """Every character of the issue appears unencoded and encoded, in both URL forms."""
    for char in "/#?@:% ✓":
        for form in ("userinfo", "query"):
            for encoded in (False, True):
                assert any(
                    char in c.password and c.form == form and c.encoded == encoded for c in CASES
                ), (char, form, encoded)


# -- the table -------------------------------------------------------------------------


@pytest.mark.parametrize("case", params())
def test_url_is_refused_unquoted_or_parsed_as_the_driver_does(case: Case) -> None:
    """Refused without quoting the password, or read by the driver exactly as it is masked."""
    url = case.url()
    problem = dburl.url_problem(url)
    if case.expect_refused is not None:
        assert (problem is not None) == case.expect_refused, (url, problem)
    diagnosis = diagnose({DATABASE_URL_ENV: url})
    report = json.dumps(diagnosis.as_json(), ensure_ascii=False)
    assert_not_shown(report, case.written, where="doctor's JSON")
    if problem is not None:
        [error] = [e for e in diagnosis.errors if e.variable == DATABASE_URL_ENV]
        sentence = str(error)
        assert sentence.startswith(f"{DATABASE_URL_ENV} "), sentence
        assert_not_shown(sentence, case.written, where="the refusal")
        assert diagnosis.exit_code == EXIT_CONFIG
        assert diagnosis.database_url_redacted is None
        assert dburl.redact_url(url) == NOT_SHOWN
        # Refused, all of it is secret: a message quoting the URL is masked whole.
        masked = dburl.mask_secrets(f"driver: cannot use {url} here", dburl.url_secrets(url))
        assert masked == "driver: cannot use postgresql://*** here"
        return
    addrs, user, password, database = driver_view(url)
    # Nothing of the password became the host, port, user or database name.
    assert (addrs, user, database) == ([(HOST, PORT)], USER, DATABASE), url
    assert password == case.decoded, url
    assert password in dburl.url_secrets(url), (password, dburl.url_secrets(url))
    redacted = dburl.redact_url(url)
    assert_not_shown(redacted, case.written, where="redact_url")
    assert redacted.startswith(f"postgresql://{USER}")
    assert f"{HOST}:{PORT}/{DATABASE}" in redacted
    assert "***" in redacted
    assert (diagnosis.exit_code, diagnosis.database_url_redacted) == (EXIT_OK, redacted)


def _spelling_marks(case: Case) -> list[pytest.MarkDecorator]:
    # Once a known bug: the written spelling of a ?password= value was not masked.
    return []


ACCEPTED = tuple(c for c in CASES if dburl.url_problem(c.url()) is None)


@pytest.mark.parametrize("case", params(ACCEPTED, marks=_spelling_marks))
def test_text_quoting_the_url_or_password_is_masked(case: Case) -> None:
    """A driver message or a play's error quoting the URL, the password or both is masked.

    This is what the daemon's logs and the stored run errors apply (``mask_secrets``
    with ``url_secrets``); nothing replaces the whole URL first there, as the CLI does.
    """
    url = case.url()
    text = (
        f"could not connect to {url}: password authentication failed "
        f"(password {case.decoded!s}, as written {case.written})"
    )
    masked = dburl.mask_secrets(text, dburl.url_secrets(url))
    assert_not_shown(masked, case.written, where="the masked message")
    assert "***" in masked


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop every variable lane-worker reads from this process's environment."""
    for name in list(os.environ):
        if name.startswith(("LANE_WORKER_", "DEEPLINE_", "WORKFLOW_")) or name == "VERCEL":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case", params())
@pytest.mark.usefixtures("clean_env")
def test_doctor_shows_nothing_of_the_password(case: Case, as_json: bool) -> None:
    """`lane-worker doctor` (in process) exits 78 or 0 and prints no piece of the password."""
    url = case.url()
    result = CliRunner().invoke(
        cli, ["doctor", *(["--json"] if as_json else [])], env={DATABASE_URL_ENV: url}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a crash (the bracket bug's ValueError), not an exit
    refused = dburl.url_problem(url) is not None
    assert result.exit_code == (EXIT_CONFIG if refused else EXIT_OK), result.output
    shown = decoded_json(result.stdout) + "\n" + result.stderr
    assert_not_shown(shown, case.written, where="doctor")
    if refused and as_json:  # one JSON refusal on stderr
        assert json.loads(result.stderr)["error"]["message"].startswith(f"{DATABASE_URL_ENV} ")
    elif refused:
        assert f"lane-worker: {DATABASE_URL_ENV} " in result.stderr
    else:
        assert dburl.redact_url(url) in shown


@pytest.mark.parametrize("password", ["p[S3cret]w", "S3cret[Pw", "S3cret]Pw"])
def test_a_bracket_in_the_password_is_refused_never_a_crash(password: str) -> None:
    """'[' and ']' are common in generated passwords: refused (78) without a crash or an echo.

    urlsplit raises ValueError for them in the user info ("'S3cret' does not appear
    to be an IPv4 or IPv6 address"): redact_url and url_secrets must never see one.
    """
    url = Case(password, encoded=False, form="userinfo").url()
    assert dburl.url_problem(url) is not None
    diagnosis = diagnose({DATABASE_URL_ENV: url})
    assert diagnosis.exit_code == EXIT_CONFIG
    assert_not_shown(json.dumps(diagnosis.as_json(), ensure_ascii=False), password)
    assert dburl.redact_url(url) == NOT_SHOWN
    assert dburl.mask_secrets(url, dburl.url_secrets(url)) == "postgresql://***"
    # Encoded, the same password is accepted and read back whole.
    encoded = Case(password, encoded=True, form="userinfo").url()
    assert driver_view(encoded)[2] == password
    assert password in dburl.url_secrets(encoded)
    assert_not_shown(dburl.redact_url(encoded), password)
