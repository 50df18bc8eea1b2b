"""``LaneClient.submit_many``: many submits in one call of the store's ``submit_runs``.

Each request is checked here as ``LaneClient.submit`` checks its arguments, then
all of them go to ``submit_runs`` (store migration 0025) in one transaction: all
are made or none, and a refusal names the request's index (``item 3: ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.config import settings
from worker.errors import InvalidRequestError, shown
from worker.limits import (
    checked_input,
    checked_key,
    checked_max_attempts,
    checked_play,
    checked_runtime_api,
)


@dataclass(frozen=True)
class SubmitRequest:
    """One submit of ``LaneClient.submit_many``: ``LaneClient.submit``'s arguments."""

    play: str
    input: Any = None
    idempotency_key: str | None = None
    queue_suffix: str | None = None
    runtime_api: Mapping[str, Any] | None = None
    release_id: str | None = None
    max_attempts: int | None = None


def named_release(release_id: Any, queue_suffix: str | None) -> str:
    """``release_id`` as given, checked by the lane rules (never beside a suffix)."""
    if queue_suffix is not None:
        raise InvalidRequestError("pass release_id or queue_suffix, not both.")
    text = release_id if isinstance(release_id, str) else ""
    problem = settings.release_id_problem(text) if text else "a release id must be a string"
    if problem:
        raise InvalidRequestError(f"release_id {shown(str(release_id))}: {problem}.")
    return text.strip()


def submit_items(
    requests: Iterable[SubmitRequest],
    release_for: Callable[[SubmitRequest], str],
    max_attempts: Callable[[], int | None],
) -> list[dict[str, Any]]:
    """Return ``submit_runs``' items for ``requests``, refusing the first bad one by its index.

    ``release_for``: the release a request submits to (its own, its suffix's, or the
    process's); ``max_attempts``: the process's budget, for a request that gives none.
    """
    items = []
    for index, request in enumerate(requests):
        try:
            if not isinstance(request, SubmitRequest):
                raise InvalidRequestError(
                    f"submit_many takes SubmitRequest objects, not {type(request).__name__}."
                )
            item: dict[str, Any] = {
                "play": checked_play(request.play),
                "input": checked_input(request.input),
                "releaseId": release_for(request),
                "maxAttempts": checked_max_attempts(request.max_attempts),
            }
            if item["maxAttempts"] is None:
                item["maxAttempts"] = max_attempts()
            if checked_key(request.idempotency_key, "an idempotency key") is not None:
                item["idempotencyKey"] = request.idempotency_key
            api = request.runtime_api
            api = checked_runtime_api(dict(api) if isinstance(api, Mapping) else api)
            if api is not None:
                item["runtimeApi"] = api
        except InvalidRequestError as exc:
            raise InvalidRequestError(f"item {index}: {exc}") from None
        items.append(item)
    return items
