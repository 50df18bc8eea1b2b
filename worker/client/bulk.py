"""``LaneClient.submit_many``: many submits in one call of the store's ``submit_runs``.

Each request is checked here as ``LaneClient.submit`` checks its arguments, then
all of them go to ``submit_runs`` (store migration 0025) in one transaction: all
are made or none, and a refusal names the request's index (``item 3: ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.errors import InvalidRequestError
from worker.limits import checked_input, checked_key, checked_play, checked_runtime_api


@dataclass(frozen=True)
class SubmitRequest:
    """One submit of ``LaneClient.submit_many``: ``LaneClient.submit``'s arguments."""

    play: str
    input: Any = None
    idempotency_key: str | None = None
    queue_suffix: str | None = None
    runtime_api: Mapping[str, Any] | None = None


def submit_items(
    requests: Iterable[SubmitRequest],
    release_for: Callable[[str | None], str],
    max_attempts: int | None,
) -> list[dict[str, Any]]:
    """Return ``submit_runs``' items for ``requests``, refusing the first bad one by its index.

    ``release_for``: the release a queue suffix (or None, the process's own) submits to.
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
                "releaseId": release_for(request.queue_suffix),
                "maxAttempts": max_attempts,
            }
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
