"""``lane-worker submit --from FILE``: one JSON object a line, all submitted in one transaction.

Each line holds ``submit``'s arguments by their JSON names (``play``, ``input``,
``idempotencyKey``, ``queueSuffix``, ``runtimeApi``, ``releaseId``, ``maxAttempts``),
checked as ``submit`` checks its command line. A line that is not such an object is
refused naming its line number, before anything is sent; a line the store refuses is
named too, and then nothing is written either (``LaneClient.submit_many``: one
``submit_runs`` call).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from worker import lanes, limits
from worker.cli.exits import UsageFailure
from worker.cli.params import parse_json_text
from worker.client import LaneClient, SubmitRequest, SubmittedRun
from worker.config import settings
from worker.errors import IdempotencyConflict, InvalidRequestError, LaneWorkerError

FIELDS = (
    "play",
    "input",
    "idempotencyKey",
    "queueSuffix",
    "runtimeApi",
    "releaseId",
    "maxAttempts",
)
_ITEM = re.compile(r"item (\d+): ")


def read_submits(source: str) -> tuple[list[int], list[SubmitRequest]]:
    """Read FILE (``-``: stdin); return each submit's line number and the submits.

    Blank lines are skipped. Raises ``UsageFailure`` (exit 2) naming the first bad line.
    """
    try:
        if source == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as file:
                raw = file.read()
    except OSError as exc:
        raise UsageFailure(f"cannot read --from {source!r}: {exc.strerror or exc}.") from None
    numbers, requests = [], []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            requests.append(_request(line))
        except ValueError as exc:  # InvalidRequestError is one
            raise UsageFailure(f"--from {source}, line {number}: {exc}") from None
        numbers.append(number)
    return numbers, requests


def _request(line: bytes) -> SubmitRequest:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text.") from None
    value = parse_json_text(text, "the line")
    if not isinstance(value, dict):
        raise ValueError(f"a submit is a JSON object ({', '.join(FIELDS)}), not {_kind(value)}.")
    unknown = [k for k in value if k not in FIELDS]
    if unknown:
        raise ValueError(
            f"a submit has no field {unknown[0]!r}: it takes {', '.join(FIELDS[:-1])} "
            f"and {FIELDS[-1]}."
        )
    for name in ("play", "idempotencyKey", "queueSuffix", "releaseId"):
        if value.get(name) is not None and not isinstance(value[name], str):
            raise ValueError(f"{name} must be a JSON string, not {_kind(value[name])}.")
    play = limits.checked_play((value.get("play") or "").strip())
    key = limits.checked_key(value.get("idempotencyKey"), "an idempotency key")
    suffix = value.get("queueSuffix")
    if suffix is not None:
        if not lanes.normalize_queue_suffix(suffix):
            raise ValueError(f"queueSuffix {suffix!r} names no queue.")
        suffix = suffix.strip()
    api = value.get("runtimeApi")
    if api is not None and not isinstance(api, dict):
        # No value quoted: it holds tokens.
        raise ValueError(
            f"runtimeApi must be a JSON object (baseUrl, executorToken, ...), not {_kind(api)}."
        )
    release = value.get("releaseId")
    if release is not None:
        if suffix is not None:
            raise ValueError("releaseId and queueSuffix each name the lane: give one.")
        problem = settings.release_id_problem(release)
        if problem:
            raise ValueError(f"releaseId: {problem}.")
        release = release.strip()
    attempts = value.get("maxAttempts")
    if attempts is not None and (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= limits.MAX_ATTEMPTS
    ):
        raise ValueError(f"maxAttempts must be a whole number from 1 to {limits.MAX_ATTEMPTS}.")
    return SubmitRequest(
        play, limits.checked_input(value.get("input")), key, suffix, api, release, attempts
    )


def _kind(value: Any) -> str:
    kinds = {
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
    }
    return "null" if value is None else f"a JSON {kinds[type(value)].split()[-1]}"


async def submit_from(
    client: LaneClient, source: str, numbers: list[int], requests: list[SubmitRequest]
) -> list[SubmittedRun]:
    """Submit ``requests``; a refusal of one names its line of ``source``, not its index."""
    try:
        return await client.submit_many(requests)
    except (InvalidRequestError, IdempotencyConflict) as exc:
        raise _on_line(exc, source, numbers) from None


def _on_line(exc: LaneWorkerError, source: str, numbers: list[int]) -> LaneWorkerError:
    said = str(exc)
    match = _ITEM.match(said)
    if match is None or int(match[1]) >= len(numbers):
        return exc
    said = f"--from {source}, line {numbers[int(match[1])]}: {said[match.end() :]}"
    if isinstance(exc, IdempotencyConflict):
        return IdempotencyConflict(said, run_id=exc.run_id)
    return InvalidRequestError(said)
