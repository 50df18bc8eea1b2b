"""What the relay's request for one ledger fact is: its endpoint, headers and secrets,
whether it can be sent at all, and when to try it again."""

from __future__ import annotations

import re
import time
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import aiohttp
from tenacity import RetryCallState, wait_random_exponential

from worker.db.store.rows import PendingFact
from worker.jsonvalue import unreadable_in
from worker.masking import secret_forms
from worker.version import VERSION

MAX_BACKOFF_S = 600.0
_BACKOFF = wait_random_exponential(multiplier=1, max=MAX_BACKOFF_S)
_USER_AGENT = f"lane-worker/{VERSION}"
# The endpoint of a fact whose context names no usable base URL: never sent to,
# never limited (the fact is given up at once).
NO_ENDPOINT = "-"
_OPTIONAL_HEADERS = ("vercelProtectionBypassToken", "runtimeTestFaultHeader")


def unsendable(exc: BaseException) -> bool:
    """Tell whether a request could not even be made from the context (a bad URL or header)."""
    if isinstance(exc, aiohttp.InvalidURL):
        return True
    return isinstance(exc, ValueError | UnicodeError) and not isinstance(exc, aiohttp.ClientError)


def unusable(fact: PendingFact) -> tuple[str, dict[str, str]] | None:
    """Say why no request can carry ``fact``: the metric's reason and ``reason``, ``detail``.

    Only a row written past the store's checks (an older build, a direct SQL
    write) can be like this; no retry changes it, so the fact is given up, alone:
    the run's later facts still go. The detail never quotes the context's values.
    """
    said = unreadable_in("the fact", fact.fact)
    if said is not None:
        return "unreadable", {"reason": "the fact cannot be read", "detail": said}
    said = unreadable_in("the runtime API context", fact.api)
    if said is not None:
        return "unreadable", {"reason": "the runtime API context cannot be read", "detail": said}
    api = fact.api
    if not isinstance(api, dict):
        detail = "it is not a JSON object"
    elif not isinstance(api.get("baseUrl"), str) or not isinstance(api.get("executorToken"), str):
        detail = "its baseUrl or executorToken is missing or not a string"
    elif any(not isinstance(api.get(k) or "", str) for k in _OPTIONAL_HEADERS):
        detail = f"its {' or '.join(_OPTIONAL_HEADERS)} is not a string"
    else:
        return None
    return "refused", {"reason": "the runtime API context cannot be sent", "detail": detail}


def backoff_s(tries: int, retry_after_s: float | None = None) -> float:
    """Seconds until try ``tries + 1``: full jitter (tenacity), at least ``Retry-After``."""
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(1, tries)
    wait = float(_BACKOFF(state))
    if retry_after_s is not None:
        wait = max(wait, retry_after_s)
    return min(wait, MAX_BACKOFF_S)


def retry_after_s(value: str | None) -> float | None:
    """Read a ``Retry-After`` header: seconds, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def headers_for(fact: PendingFact) -> dict[str, str]:
    """The request's headers: the token, the fact's idempotency key, the optional two."""
    api = fact.api
    headers = {
        "Authorization": f"Bearer {api['executorToken']}",
        # The same on every try of this fact, whichever worker sends it.
        "Idempotency-Key": f"{fact.run_id}:{fact.fact_id}",
        "Content-Type": "application/json",
        "User-Agent": _USER_AGENT,
    }
    if api.get("vercelProtectionBypassToken"):
        headers["x-vercel-protection-bypass"] = api["vercelProtectionBypassToken"]
    if api.get("runtimeTestFaultHeader"):
        headers["x-runtime-test-fault"] = api["runtimeTestFaultHeader"]
    return headers


def sent_secrets(fact: PendingFact) -> tuple[str, ...]:
    """The secrets a fact's request carries, in every spelling an echo of them may take."""
    api = fact.api
    return secret_forms(
        *(str(api.get(k) or "") for k in ("executorToken", "vercelProtectionBypassToken"))
    )


_ORIGIN = re.compile(r"^(https?://[^/?#]+)", re.IGNORECASE)


def origin_of(base_url: str) -> str:
    """The endpoint a base URL names: scheme, host and port, lowercased.

    The key the relay limits and backs off by; the claim computes the same
    (``claim_deliveries``), so paths of one host are one endpoint.
    """
    found = _ORIGIN.match(base_url)
    return (found.group(1) if found else base_url).lower()


def endpoint_of(fact: PendingFact) -> str:
    """The endpoint (origin) a fact goes to; ``NO_ENDPOINT`` when its context names none."""
    api = fact.api
    base = api.get("baseUrl") if isinstance(api, dict) else None
    return origin_of(base) if isinstance(base, str) else NO_ENDPOINT


def host_of(base_url: str) -> str:
    """What a log line may say about an endpoint: its host, never a path, query or userinfo."""
    try:
        return urlsplit(base_url).hostname or "?"
    except ValueError:
        return "?"
