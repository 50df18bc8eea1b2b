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
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

REDACTED = "***"

# A secret shorter than this is masked only as a whole word: a password such as
# `run` must not turn `runs_rel_a` and `run.started` in every log line into `***s_rel_a`.
WHOLE_WORD_BELOW = 8

# A secret cut by a length limit leaves its beginning at the end of the text: that
# beginning is masked when it is at least this long (shorter says nothing usable).
_CUT_PREFIX = 4

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


def secret_forms(*secrets: str) -> tuple[str, ...]:
    """Every spelling of ``secrets`` an echo may print, longest first.

    As sent, percent-encoded (a query or form echo), inside ``repr()`` and JSON
    (escaped, also with ``/`` as ``\\/``), and each comma-separated part of a
    token made of several (a Fly macaroon token is such a list).
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
            escaped = json.dumps(part)[1:-1]
            found |= {part, quote(part, safe=""), repr(part)[1:-1], escaped}
            found.add(escaped.replace("/", "\\/"))
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def mask(text: str, secrets: Sequence[str]) -> str:
    """Return ``text`` with each of ``secrets`` replaced by ``***``.

    A secret of ``WHOLE_WORD_BELOW`` characters or more is replaced wherever it
    occurs; a shorter one only where no letter, digit or ``_`` touches it (in a
    URL it is bounded by ``:`` and ``@``). ``doctor`` warns about a short password.
    """
    for secret in secrets:
        if not secret:
            continue
        if len(secret) >= WHOLE_WORD_BELOW:
            text = text.replace(secret, REDACTED)
        elif secret in text:
            text = re.sub(rf"(?<![0-9A-Za-z_]){re.escape(secret)}(?![0-9A-Za-z_])", REDACTED, text)
    return text


def _credentials(text: str) -> str:
    """Mask what an auth header carries, known secret or not."""
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
    return _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def _cut_prefix(text: str, secrets: Sequence[str]) -> str:
    """Mask a secret's beginning left at the very end of ``text`` (cut by a limit)."""
    for secret in secrets:
        for n in range(min(len(secret) - 1, len(text)), _CUT_PREFIX - 1, -1):
            if text.endswith(secret[:n]):
                return text[:-n] + REDACTED
    return text


def mask_response(text: str, secrets: Sequence[str], limit: int | None = None) -> str:
    """Return what may be kept of a response's ``text``: secrets and credentials masked,
    then at most ``limit`` characters (a secret the cut splits is masked too)."""
    masked = _credentials(mask(text, secrets))
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
