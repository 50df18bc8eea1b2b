"""The one masking rule: what is kept or shown of an answer never carries a secret.

Every outbound client (the ledger relay, the Fly backend, Daytona's cleanup)
keeps a little of what a refusal said, and an auth layer or a debugging proxy
may echo the request's headers in it. So whatever is kept from a response goes
through ``mask_response`` first, with the secrets that client sent (its tokens,
in every spelling ``secret_forms`` knows) and the database passwords
(``config.dburl.url_secrets``): a known secret becomes ``***`` wherever it
stands, and any credential a header carries (``Authorization: ...``,
``Bearer ...``) is masked even when the secret was not known. ``mask`` is the
plain rule the logs apply.

Any case counts (ASCII letters: an echo may upper-case a header; a token with other
letters also wholly upper- or lower-cased), and so does a token with non-ASCII
characters as an endpoint in another encoding sends it back (its UTF-8 read as
Latin-1 or Windows-1252, Latin-1 bytes read as UTF-8 with U+FFFD for each bad
byte: the relay decodes so), in each Unicode normal form, HTML-escaped (entities:
``&#246;``, ``&#xf6;``, ``&ouml;``, ``&amp;``), in each spelling; and its bytes as
Python's ``repr`` of ``bytes`` or hex print them. So does base64 (standard and
URL-safe, padded or not, of the secret and of ``Bearer <secret>``, and the secret's
part of a longer encoded string at each of the three byte alignments). In what is
kept of an answer, a secret of ``FRAGMENT_FROM`` characters or more is also masked
piece by piece (each of its forms too): any run of the text made of its
``FRAGMENT_MIN``-character pieces (a token split over a line, cut by a read or a
limit, or quoted in part) becomes ``***``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from html.entities import codepoint2name
from typing import Any, Literal
from urllib.parse import quote

REDACTED = "***"

# A secret shorter than this is masked only as a whole word: a password such as
# `run` must not turn `runs_rel_a` and `run.started` in every log line into `***s_rel_a`.
WHOLE_WORD_BELOW = 8

# A secret cut by a length limit leaves its beginning at the end of the text: that
# beginning is masked when it is at least this long (shorter says nothing usable).
_CUT_PREFIX = 4

# In what is kept of an answer, any piece of at least FRAGMENT_MIN characters of a secret
# of at least FRAGMENT_FROM is masked wherever it stands (a split, a cut, a partial quote).
# A random token's 8 characters do not turn up in a refusal by chance; a shorter secret
# is masked only whole (a password of words would mask those words).
FRAGMENT_FROM = 16
FRAGMENT_MIN = 8

# ASCII letters folded to lower case, one character for one (positions stay put).
_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(text: str) -> str:
    return text.translate(_FOLD)


# What a header or an echo of it may carry: the scheme's credential, or a header's value.
# A credential after its scheme: at least 8 characters with a digit or a token's
# punctuation in them, so prose ("a bearer token is required") is left as it is.
_SCHEME_CREDENTIAL = re.compile(
    r"(?i)\b(bearer|basic|flyv1)(\s+|\\u0020|%20|\+)"
    r"((?=[^\s\"'\\,;}<>]*[0-9_.~+/=-])[^\s\"'\\,;}<>]{8,})"
)
_AUTH_HEADER = re.compile(
    r"(?i)(\b(?:authorization|proxy-authorization|x-vercel-protection-bypass|x-api-key)"
    r"\\?[\"']?\s*[:=]\s*\\?[\"']?)([^\"'\\\r\n;}<>]+)"
)


def _base64_forms(secret: str) -> set[str]:
    """``secret`` in base64: whole (of it and of ``Bearer <it>``; standard and URL-safe,
    padded or not), and the characters that only it decides inside a longer encoded
    string, at each of the three byte alignments it may start at."""
    raw = secret.encode()
    found: set[str] = set()
    for whole in (raw, b"Bearer " + raw):
        padded = base64.b64encode(whole).decode()
        found |= {padded, padded.rstrip("=")}
    for lead in range(3):
        encoded = binascii.b2a_base64(b"\0" * lead + raw, newline=False).decode().rstrip("=")
        start = -(-4 * lead // 3)  # the first character with none of the lead's bits
        end = len(encoded) - (1 if (lead + len(raw)) % 3 else 0)  # the last may hold a follower's
        found.add(encoded[start:end])
    found |= {f.replace("+", "-").replace("/", "_") for f in found}
    return {f for f in found if len(f) >= WHOLE_WORD_BELOW}


# The encodings an endpoint may read our UTF-8 as, or write its echo in.
_OTHER_CODECS = ("latin-1", "cp1252")


def _misread(part: str) -> set[str]:
    """``part`` as an endpoint in another encoding gives it back, decoded as the relay
    decodes a body (UTF-8, a bad byte as U+FFFD); and wholly upper- or lower-cased, for
    the letters beyond ASCII that matching does not fold. Nothing for ASCII."""
    if part.isascii():
        return set()
    found = {part.upper(), part.lower()}
    for codec in _OTHER_CODECS:
        with contextlib.suppress(UnicodeError):  # a byte the codec leaves undefined
            found.add(part.encode().decode(codec))  # mojibake: "tÃ¶k"
        with contextlib.suppress(UnicodeError):  # a character the codec cannot write
            found.add(part.encode(codec).decode("utf-8", errors="replace"))  # "t\ufffdk"
    found.discard(part)
    return found


# What an HTML writer escapes of ASCII: ``&`` and the brackets always, quotes in attributes.
_HTML_SPECIAL = ("&<>", "&<>\"'")


def _decimal(c: str) -> str:
    return f"&#{ord(c)};"


def _hex(c: str) -> str:
    return f"&#x{ord(c):x};"


def _named(c: str) -> str:
    return f"&{codepoint2name[ord(c)]};" if ord(c) in codepoint2name else _decimal(c)


# Each way of writing a character as an entity: decimal, hex, named (decimal when unnamed).
_HTML_ENTITY: tuple[Callable[[str], str], ...] = (_decimal, _hex, _named)


def _html_forms(text: str) -> set[str]:
    """``text`` HTML-escaped: its ``&<>`` (and quotes) and, or not, its non-ASCII
    characters as entities, one style of entity at a time (``&#246;``, ``&#xf6;``,
    ``&ouml;``); ``'`` also as ``&#x27;`` (Python's ``html.escape``) and ``&apos;``."""
    found: set[str] = set()
    for entity in _HTML_ENTITY:
        for special in ("", *_HTML_SPECIAL):
            for wide in (False, True):
                escaped = (entity(c) if c in special or (wide and c > "\x7f") else c for c in text)
                found.add("".join(escaped))
    if "'" in text:
        found |= {f.replace("&#39;", q) for f in found for q in ("&#x27;", "&apos;")}
    found.discard(text)
    return found


_NORMAL_FORMS: tuple[Literal["NFC", "NFD", "NFKC", "NFKD"], ...] = ("NFC", "NFD", "NFKC", "NFKD")


def _normalised(part: str) -> set[str]:
    """``part`` in each Unicode normal form that differs from it (an endpoint may
    compose or decompose accents, or fold compatibility characters)."""
    if part.isascii():
        return set()
    return {unicodedata.normalize(f, part) for f in _NORMAL_FORMS} - {part}


def _byte_forms(part: str) -> set[str]:
    """``part``'s bytes (UTF-8, and Latin-1 when it can) as Python's ``repr`` of ``bytes``
    prints them (``t\\xc3\\xb6k``) and in hex."""
    found: set[str] = set()
    for codec in ("utf-8", "latin-1"):
        with contextlib.suppress(UnicodeError):
            raw = part.encode(codec)
            found |= {repr(raw)[2:-1], raw.hex()}
    return found


def _spellings(text: str) -> set[str]:
    """``text`` as sent, percent-encoded (UTF-8, and Latin-1 when it can), inside
    ``repr()``, and JSON-escaped (``\\u`` escapes or raw, also with ``/`` as ``\\/``)."""
    found = {text, quote(text, safe=""), repr(text)[1:-1]}
    with contextlib.suppress(UnicodeError):
        found.add(quote(text, safe="", encoding="latin-1"))
    for escaped in (json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
        found |= {escaped, escaped.replace("/", "\\/")}
    return found


# Cached: the relay asks for the forms of a fact's tokens at each refusal it keeps, and
# a non-ASCII token has a hundred or more.
@lru_cache(maxsize=64)
def secret_forms(*secrets: str) -> tuple[str, ...]:
    """Every spelling of ``secrets`` an echo may print, longest first.

    Each spelling (``_spellings``: as sent, percent-encoded, in ``repr()``, JSON-escaped)
    of the secret, of its other Unicode normal forms (``_normalised``), of their
    misreadings in another encoding (``_misread``) and of all those HTML-escaped
    (``_html_forms``); the bytes of the secret and its normal forms (``_byte_forms``), the
    secret in base64 (``_base64_forms``), and all that for each comma-separated part of a
    token made of several (a Fly macaroon token is such a list). ASCII case is not a
    spelling: every match ignores it.
    """
    found: set[str] = set()
    for secret in secrets:
        secret = secret.strip()
        if not secret:
            continue
        parts = [secret, *(p.strip() for p in re.split(r"[,\s]+", secret))]
        for part in parts:
            if len(part) < _CUT_PREFIX:
                continue
            sent = {part, *_normalised(part)}
            for read in sent | {m for n in sent for m in _misread(n)}:
                for spelled in (read, *_html_forms(read)):
                    found |= _spellings(spelled)
            for read in sent:
                found |= _byte_forms(read)
            if len(part) >= WHOLE_WORD_BELOW:
                found |= _base64_forms(part)
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def mask(text: str, secrets: Sequence[str]) -> str:
    """Return ``text`` with each of ``secrets`` replaced by ``***``.

    In any case of its ASCII letters. A secret of ``WHOLE_WORD_BELOW`` characters
    or more is replaced wherever it occurs; a shorter one only where no letter, digit
    or ``_`` touches it (in a URL it is bounded by ``:`` and ``@``). ``doctor`` warns
    about a short password.
    """
    folded = _fold(text)
    for secret in secrets:
        if not secret or _fold(secret) not in folded:
            continue
        found = re.escape(secret)
        if len(secret) < WHOLE_WORD_BELOW:
            found = rf"(?<![0-9A-Za-z_]){found}(?![0-9A-Za-z_])"
        text = re.sub(found, REDACTED, text, flags=re.IGNORECASE | re.ASCII)
        folded = _fold(text)
    return text


@lru_cache(maxsize=64)
def _pieces(secrets: tuple[str, ...]) -> frozenset[str]:
    """Every ``FRAGMENT_MIN``-character piece of each secret of ``FRAGMENT_FROM`` or more."""
    return frozenset(
        folded[i : i + FRAGMENT_MIN]
        for folded in (_fold(s) for s in secrets if len(s) >= FRAGMENT_FROM)
        for i in range(len(folded) - FRAGMENT_MIN + 1)
    )


def _fragments(text: str, secrets: Sequence[str]) -> str:
    """Mask every run of ``text`` made of a long secret's pieces (``FRAGMENT_MIN`` or more
    characters of it: a split, a cut or a partial quote), in any case."""
    pieces = _pieces(tuple(secrets))
    if not pieces or len(text) < FRAGMENT_MIN:
        return text
    folded = _fold(text)
    runs: list[list[int]] = []
    for i in range(len(folded) - FRAGMENT_MIN + 1):
        if folded[i : i + FRAGMENT_MIN] in pieces:
            if runs and i <= runs[-1][1]:
                runs[-1][1] = i + FRAGMENT_MIN
            else:
                runs.append([i, i + FRAGMENT_MIN])
    if not runs:
        return text
    out, at = [], 0
    for start, end in runs:
        out += [text[at:start], REDACTED]
        at = end
    return "".join([*out, text[at:]])


def _credentials(text: str) -> str:
    """Mask what an auth header carries, known secret or not."""
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
    return _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def _cut_prefix(text: str, secrets: Sequence[str]) -> str:
    """Mask a secret's beginning left at the very end of ``text`` (cut by a limit or a read),
    in any case."""
    folded = _fold(text)
    tail = folded[-_CUT_PREFIX:]
    if len(tail) < _CUT_PREFIX:
        return text
    for secret in secrets:
        key = _fold(secret)
        # A beginning the text ends with ends in the text's last characters: try only
        # the lengths where the key holds them (a secret has a hundred forms or more).
        ends, at = [], key.find(tail)
        while at >= 0:
            ends.append(at + _CUT_PREFIX)
            at = key.find(tail, at + 1)
        for n in sorted(ends, reverse=True):
            if n <= min(len(secret) - 1, len(text)) and folded.endswith(key[:n]):
                return text[:-n] + REDACTED
    return text


def mask_response(
    text: str, secrets: Sequence[str], limit: int | None = None, *, cut: bool = False
) -> str:
    """Return what may be kept of a response's ``text``: secrets (whole, and a long one's
    pieces) and credentials masked, then at most ``limit`` characters. A secret's beginning
    left at a cut is masked too: the limit's, or the caller's read when ``cut`` says the
    text was already cut at its end."""
    masked = _credentials(_fragments(mask(text, secrets), secrets))
    if cut:
        masked = _cut_prefix(masked, secrets)
    if limit is not None and len(masked) > limit:
        masked = _cut_prefix(masked[:limit], secrets)
    return masked


def mask_value(value: Any, secrets: Sequence[str]) -> Any:
    """Return a JSON-like ``value`` with ``mask_response`` applied to every string in it."""
    if isinstance(value, str):
        return mask_response(value, secrets)
    if isinstance(value, dict):
        return {mask_response(str(k), secrets): mask_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_value(v, secrets) for v in value]
    return value


def joined(*groups: Iterable[str]) -> tuple[str, ...]:
    """One list of secrets from several, longest first (a secret holding another goes whole)."""
    return tuple(sorted({s for g in groups for s in g if s}, key=len, reverse=True))
