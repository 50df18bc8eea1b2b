"""The database URL: checked before any driver sees it, and never shown with its password.

A generated password often holds ``/``, ``#``, ``?`` or ``@``. Left unencoded they
move the URL's boundaries: the driver then reads part of the password as a host
or a port and echoes it in its error. So ``url_problem`` checks the URL's shape
the way the driver will split it, and refuses it (without quoting any of it)
when the two could disagree; only a URL that passes is ever handed to asyncpg.
"""

from __future__ import annotations

import json
import os
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from worker.jsonvalue import is_utf8
from worker.masking import WHOLE_WORD_BELOW as WHOLE_WORD_BELOW
from worker.masking import mask

DATABASE_URL_ENV = "WORKFLOW_RUNTIME_POSTGRES"
SCHEMES = ("postgres", "postgresql")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_REDACTED = "***"
_NOT_SHOWN = "<malformed URL, not shown>"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,19}")
_PORT = re.compile(r"[0-9]{1,5}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENCODE_HINT = (
    "percent-encode any '/', '?', '#' or '@' in the user name or password "
    "('/' is %2F, '?' is %3F, '#' is %23, '@' is %40)"
)
_FORM = "set it to postgresql://user:password@host:5432/dbname"
_BRACKET_HINT = "percent-encode them ('[' is %5B, ']' is %5D)"


def _port_ok(port: str) -> bool:
    return bool(_PORT.fullmatch(port)) and 1 <= int(port) <= 65_535


def _host_problem(hostspec: str) -> str | None:
    for host in hostspec.split(","):
        if host.startswith("["):  # an IPv6 literal: [::1]:5432
            end = host.find("]")
            rest = host[end + 1 :] if end > 0 else None
            if rest is None or (rest and not (rest[0] == ":" and _port_ok(rest[1:]))):
                return "a host that is not host:port or [ipv6]:port"
        elif host.count(":") > 1:
            return "a host that is not host:port or [ipv6]:port"
        elif ":" in host and not _port_ok(host.partition(":")[2]):
            return "a port that is not a number from 1 to 65535"
    return None


def _query_problem(query: str) -> str | None:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return "a query string that is not key=value pairs joined by '&'"
    for key, value in pairs:
        if key == "sslmode" and value not in SSLMODES:
            return f"an sslmode other than {', '.join(SSLMODES)}"
        if key == "port" and not all(_port_ok(p) for p in value.split(",")):
            return "a port that is not a number from 1 to 65535"
    return None


def url_problem(url: str) -> str | None:
    """Say what makes ``url`` unusable as a database URL, quoting none of it; None if usable."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        named = f"scheme {scheme!r}" if sep and _SCHEME.fullmatch(scheme) else "no scheme"
        return f"is not a postgres:// or postgresql:// URL ({named}): {_FORM}"
    if _CONTROL.search(url) or not is_utf8(url):
        return "holds a control character or invalid text (a line break, a tab?): remove it"
    if "#" in rest:
        return f"holds a '#', which ends a URL: {_ENCODE_HINT}"
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    path, _, query = tail.partition("?")
    userinfo, _, hostspec = authority.rpartition("@")
    if "@" in path or authority.count("@") > 1 or _misplaced_at(query):
        return f"has an '@' where the host should be: {_ENCODE_HINT}"
    if "[" in userinfo or "]" in userinfo:
        return f"has a '[' or ']' in the user name or password: {_BRACKET_HINT}"
    problem = _host_problem(hostspec)
    if problem is not None:
        # Usually a '?' in the password moved the end of the host.
        return f"has {problem}: fix it, or {_ENCODE_HINT}"
    problem = _query_problem(query)
    if problem is not None:
        return f"has {problem}: fix it, or {_ENCODE_HINT}"
    if _key_after_password(query):
        return (
            "has a parameter after password= that is not a connection setting: "
            "percent-encode any '&' in the password as %26"
        )
    try:  # what redact_url and url_secrets will split it with must agree it is a URL
        parts = urlsplit(url)
        if "," not in hostspec:  # a host list has one port each, checked above
            parts.port  # noqa: B018 (the property validates)
    except ValueError:
        return "has a host that is not host:port or [ipv6]:port"
    return None


# Query keys whose values may hold an '@' (a user name like user@tenant). In any
# other key's value an '@' is a password's '?' that moved the query's start.
_AT_KEYS = ("user", "password", "dbname", "database")


# What may follow a password= parameter. Any other key there is most likely the
# rest of a password holding an unencoded '&' (and would be sent as a setting).
_CONNECTION_KEYS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "database",
        "user",
        "password",
        "passfile",
        "options",
        "application_name",
        "fallback_application_name",
        "connect_timeout",
        "client_encoding",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gssencmode",
        "service",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "server_settings",
    }
)


def _key_after_password(query: str) -> bool:
    seen = False
    for part in query.split("&"):
        key = part.partition("=")[0]
        if seen and key not in _CONNECTION_KEYS:
            return True
        seen = seen or key == "password"
    return False


def _misplaced_at(query: str) -> bool:
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if "@" in key or ("@" in value and key not in _AT_KEYS):
            return True
    return False


def redact_url(url: str) -> str:
    """Return ``url`` with any password (userinfo or ``password=`` parameter) replaced.

    A URL ``url_problem`` refuses is not shown at all: where its password ends is
    exactly what cannot be told.
    """
    if url_problem(url) is not None:
        return _NOT_SHOWN
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = f"{userinfo.split(':', 1)[0]}:{_REDACTED}"
        netloc = f"{userinfo}@{host}"
    query = urlencode(
        [
            (key, _REDACTED if key.lower() == "password" else value)
            for key, value in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*/,",
    )
    # Built by hand: urlunsplit drops the `//` of a URL with an empty host.
    rebuilt = f"{parts.scheme}://{netloc}{parts.path}"
    return rebuilt + (f"?{query}" if query else "")


def url_secrets(url: str) -> tuple[str, ...]:
    """Return the secrets in ``url`` that must never be printed: its passwords, both spellings.

    For a URL ``url_problem`` refuses, everything after the scheme counts as secret.
    """
    if url_problem(url) is not None:
        rest = url.partition("://")[2] or url
        return (rest,) if rest else ()
    parts = urlsplit(url)
    found = [parts.password or ""]
    # A query value as written (parse_qsl would already decode %XX and '+').
    found += [
        value
        for key, _, value in (pair.partition("=") for pair in parts.query.split("&"))
        if unquote(key).lower() == "password"
    ]
    # Both spellings are printable: the URL as written, and the driver's decoded value.
    found += [unquote(s) for s in found]
    found += [
        v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k.lower() == "password"
    ]
    # And as an error message may quote them: inside repr() or JSON (escaped).
    found += [repr(s)[1:-1] for s in found] + [json.dumps(s)[1:-1] for s in found]
    # Longest first, so a secret containing another is replaced whole.
    return tuple(sorted({s for s in found if s}, key=len, reverse=True))


_FILE_KEYS = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "passfile")


def unreadable_files(url: str) -> list[str]:
    """Return the ``key=path`` files ``url`` names that cannot be read (cert, key, passfile)."""
    if url_problem(url) is not None:
        return []
    found = []
    for key, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if key in _FILE_KEYS and value and not os.access(os.path.expanduser(value), os.R_OK):
            found.append(f"{key}={value}")
    return found


# The one masking rule lives in worker.masking (every outbound client applies it);
# these names stay for the callers that mask with the URL's secrets.
mask_secrets = mask
