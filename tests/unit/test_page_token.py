"""LANE_WORKER_PAGE_TOKEN: refused at boot when weak (never quoted), kept out of repr and
doctor; the page's sessions and CSRF tokens signed with a key derived from it."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web

from worker.config.settings import PAGE_TOKEN_ENV, Settings, diagnose
from worker.daemon.page_auth import COOKIE, SESSION_S, PageAuth, checked_who
from worker.errors import LaneConfigError

DB = "postgresql://postgres@127.0.0.1:5432/postgres"
GOOD = "0123456789abcdef-page-token"


@pytest.mark.parametrize("bad", ["short-token", "has a space in it..", "é" * 20, "x" * 257])
def test_a_weak_token_is_refused_naming_the_variable_and_not_the_value(bad: str) -> None:
    with pytest.raises(LaneConfigError) as caught:
        Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB, PAGE_TOKEN_ENV: bad})
    assert caught.value.variable == PAGE_TOKEN_ENV
    assert str(caught.value).startswith(f"{PAGE_TOKEN_ENV} is not a usable page token")
    assert bad not in str(caught.value)


def test_the_token_is_in_no_repr_and_doctor_says_only_whether_it_is_set() -> None:
    env = {"WORKFLOW_RUNTIME_POSTGRES": DB, PAGE_TOKEN_ENV: GOOD}
    settings = Settings.from_env(env)
    assert settings.page_token == GOOD
    assert GOOD not in repr(settings)
    assert diagnose(env).warnings == ()  # a name lane-worker reads: no typo warning
    said = diagnose(env).as_json()
    assert said["pageActions"] is True
    assert GOOD not in repr(said)
    assert diagnose({"WORKFLOW_RUNTIME_POSTGRES": DB}).as_json()["pageActions"] is False
    assert (
        Settings.from_env({"WORKFLOW_RUNTIME_POSTGRES": DB, PAGE_TOKEN_ENV: " "}).page_token is None
    )


def request_with(cookie: str | None) -> web.Request:
    return cast(web.Request, SimpleNamespace(cookies={COOKIE: cookie} if cookie else {}))


def test_sessions_are_signed_expire_and_carry_their_csrf_token() -> None:
    auth = PageAuth(GOOD)
    value = auth.cookie_value("ana")
    assert GOOD not in value
    session = auth.session(request_with(value))
    assert session is not None
    assert session.who == "ana"
    payload, _, signature = value.partition(".")
    assert auth.session(request_with(payload + "." + signature[:-1] + "A")) is None
    assert auth.session(request_with(payload[:-2] + "." + signature)) is None
    assert PageAuth(GOOD + "x").session(request_with(value)) is None  # a new token signs out
    expired = auth.cookie_value("ana", now=time.time() - SESSION_S - 1)
    assert auth.session(request_with(expired)) is None
    other = auth.session(request_with(auth.cookie_value("ana")))
    assert other is not None
    assert auth.csrf(session) != auth.csrf(other)  # per session
    assert GOOD not in auth.csrf(session)
    assert PageAuth(None).session(request_with(value)) is None
    assert not PageAuth(None).enabled
    assert auth.token_matches(GOOD)
    assert not auth.token_matches(GOOD[:-1])
    # Posted from a file made by `openssl rand -hex 24 > f` (its newline), or pasted.
    assert auth.token_matches(GOOD + "\n")
    assert auth.token_matches(f"  {GOOD}\r\n")
    assert not auth.token_matches(GOOD + "x\n")


@pytest.mark.parametrize("who", ["", " ", "x" * 101, "a\x00b"])
def test_a_name_is_printable_text(who: Any) -> None:
    with pytest.raises(ValueError, match="your name is printable text"):
        checked_who(who)
