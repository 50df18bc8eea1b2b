"""Who may act from the operator page: ``LANE_WORKER_PAGE_TOKEN``, a signed session, CSRF.

Without the token the page is read-only: no form but the filter is shown, and
every POST is refused. With it, an operator signs in once (a POST of a name and
the token); the answer sets a session cookie signed with a key derived from the
token (HMAC-SHA256), HttpOnly and SameSite=Strict, good for ``SESSION_S``. Each
action form carries a CSRF token derived from the session (HMAC of its random
id): a POST must carry the cookie, that form token and the browser's word that it
came from this page (``same_origin``). No state is kept: a restart, or another
worker behind the same address with the same token, accepts the same session;
changing the token signs every session out. The token itself is never written
into a page, a cookie, a log line or an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

COOKIE = "lane_worker_page"
# Failed sign-ins this process accepts in a window before it refuses every sign-in for
# the rest of it: guessing a token of 16 characters or more is hopeless, and this keeps
# a scanner from trying at the port's speed (and from filling the log).
SIGNIN_FAILURES = 20
SIGNIN_WINDOW_S = 60.0
SESSION_S = 12 * 3600
MAX_WHO_CHARS = 100


@dataclass(frozen=True)
class Session:
    """A signed-in operator: the name given at sign-in, and the session's random id."""

    who: str
    sid: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def checked_who(raw: str | None) -> str:
    """The operator's name as the audit trail records it; ValueError with one sentence."""
    who = " ".join((raw or "").split())
    if not who or len(who) > MAX_WHO_CHARS or not who.isprintable():
        raise ValueError(f"your name is printable text of 1 to {MAX_WHO_CHARS} characters.")
    return who


class PageAuth:
    """Sign-in, sessions and CSRF tokens of one page token (None: the page is read-only)."""

    def __init__(self, token: str | None) -> None:
        # Only digests are kept: the token is compared by its hash, and signs by a derived key.
        self._digest = hashlib.sha256(token.encode()).digest() if token else None
        self._key = (
            hmac.new(token.encode(), b"lane-worker page session v1", hashlib.sha256).digest()
            if token
            else None
        )
        self._length = len(token) if token else 0
        self._failures: deque[float] = deque()

    def holds_token(self, text: str) -> bool:
        """Whether ``text`` holds the page token anywhere (a name pasted with it): each
        stretch of the token's length is compared by its hash, in constant time."""
        if self._digest is None or len(text) < self._length:
            return False
        found = False
        for start in range(len(text) - self._length + 1):
            found |= self.token_matches(text[start : start + self._length])
        return found

    def throttled(self) -> bool:
        """Whether sign-ins are refused now: too many failed in the last window."""
        now = time.monotonic()
        while self._failures and now - self._failures[0] > SIGNIN_WINDOW_S:
            self._failures.popleft()
        return len(self._failures) >= SIGNIN_FAILURES

    def failed(self) -> None:
        """Count a failed sign-in."""
        self._failures.append(time.monotonic())

    @property
    def enabled(self) -> bool:
        """Whether actions are possible at all (the token is set)."""
        return self._key is not None

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the page token (compared in constant time).

        Surrounding whitespace is not part of it (a token has none): a token posted from
        a file (``curl --data-urlencode token@file``) carries the file's last newline.
        """
        if self._digest is None:
            return False
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._digest)

    def _sign(self, purpose: str, text: str) -> str:
        assert self._key is not None
        return _b64(hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).digest())

    def cookie_value(self, who: str, now: float | None = None) -> str:
        """A new session of ``who``, as the cookie's value: payload.signature."""
        expires = int(now if now is not None else time.time()) + SESSION_S
        payload = _b64(json.dumps({"who": who, "sid": secrets.token_urlsafe(18), "exp": expires})
                       .encode())  # fmt: skip
        return f"{payload}.{self._sign('session', payload)}"

    def session(self, request: web.Request) -> Session | None:
        """The request's signed, unexpired session, or None."""
        raw = request.cookies.get(COOKIE)
        if self._key is None or not raw or "." not in raw:
            return None
        payload, _, signature = raw.partition(".")
        if not hmac.compare_digest(signature.encode(), self._sign("session", payload).encode()):
            return None
        try:
            said = json.loads(_unb64(payload))
            session = Session(str(said["who"]), str(said["sid"]), int(said["exp"]))
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        return session if session.expires > time.time() else None

    def csrf(self, session: Session) -> str:
        """The form token of ``session``: every action form carries it."""
        return self._sign("csrf", session.sid)

    def set_cookie(self, response: web.StreamResponse, request: web.Request, who: str) -> None:
        """Sign ``who`` in on ``response``."""
        response.set_cookie(
            COOKIE,
            self.cookie_value(who),
            max_age=SESSION_S,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )

    def refusal(self, request: web.Request, form: dict[str, str], *, signing_in: bool) -> str:
        """Why this POST may not act ('' when it may): token unset, origin, session, CSRF."""
        if not self.enabled:
            return "actions are off on this page: set LANE_WORKER_PAGE_TOKEN on the worker."
        if not same_origin(request):
            return "refused: the form was not posted from this page (Origin)."
        if signing_in:
            return ""
        session = self.session(request)
        if session is None:
            return "sign in first (your session is missing or has expired)."
        if not hmac.compare_digest(form.get("csrf", "").encode(), self.csrf(session).encode()):
            return "refused: the form's token is not this session's (reload the page)."
        return ""


def same_origin(request: web.Request) -> bool:
    """Whether a POST came from a page of this server.

    A browser's ``Sec-Fetch-Site: same-origin`` says so (the browser sets it, a page of
    another site cannot). Else its ``Origin`` must name this host: the request's Host, or
    the ``X-Forwarded-Host`` a proxy that rewrites Host passes on (a cross-site form
    cannot set that header). A request with neither is refused.
    """
    if request.headers.get("Sec-Fetch-Site") == "same-origin":
        return True
    origin = request.headers.get("Origin")
    if not origin:
        return False
    netloc = urlsplit(origin).netloc.lower()
    forwarded = request.headers.get("X-Forwarded-Host", "").split(",")[0].strip().lower()
    return bool(netloc) and netloc in {(request.host or "").lower(), forwarded}
