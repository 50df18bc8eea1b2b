"""Hostile and careless input to ``LaneClient``: refused with one sentence, nothing written.

Every refusal is an ``InvalidRequestError`` (a ``ValueError``), ``IdempotencyConflict`` or
``LaneConfigError`` raised before the database sees the request, never a driver error
such as ``asyncpg.DataError``; and the database is the same afterwards (``snapshot``).
"""

from __future__ import annotations

import copy
import datetime
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from support.runtime import connect, open_client
from worker.client import LaneClient
from worker.errors import (
    IdempotencyConflict,
    InvalidRequestError,
    LaneConfigError,
    LaneWorkerError,
    SchemasMissingError,
)
from worker.limits import MAX_INPUT_BYTES

STORE = "runtime_scheduler"
KEY = "order-42"
RUN_INPUT = {"a": 1}
RELEASE = "rel-a"
ENV = {"DEEPLINE_RUNTIME_DEPLOY_VERSION": RELEASE}
OWN_QUEUE = "runs_rel_a"
NOT_AN_OBJECT = "a run's input must be a JSON object (a dict), not"
NOT_STORABLE = "the run's input is not storable JSON:"
KEY_PROBLEM = "a key has at most 255 characters and no NUL or unpaired surrogate character"


def nested(depth: int) -> dict[str, Any]:
    """Return an object nested ``depth`` lists deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return {"deep": value}


@dataclass(frozen=True)
class Snapshot:
    """What a refused call must leave as it was."""

    schemas: tuple[str, ...]
    row_counts: tuple[tuple[str, int], ...]
    runs: tuple[tuple[str, str, str, str], ...]
    engine_queues: tuple[str, ...]


async def snapshot(url: str) -> Snapshot:
    """Return the database's schemas, every table's row count, the runs and engine queues."""
    conn = await asyncpg.connect(url)
    try:
        schemas = tuple(
            r[0]
            for r in await conn.fetch(
                "select nspname from pg_namespace where nspname !~ '^pg_' "
                "and nspname <> 'information_schema' order by 1"
            )
        )
        counts = []
        for t in await conn.fetch(
            "select table_schema, table_name from information_schema.tables "
            "where table_type = 'BASE TABLE' and table_schema = any($1::text[]) order by 1, 2",
            list(schemas),
        ):
            name = f'"{t[0]}"."{t[1]}"'
            counts.append((name, int(await conn.fetchval(f"select count(*) from {name}"))))
        runs: tuple[tuple[str, str, str, str], ...] = ()
        if STORE in schemas:
            runs = tuple(
                (str(r[0]), r[1], r[2], r[3])
                for r in await conn.fetch(
                    f"select run_id, play, queue, input::text from {STORE}.runs order by run_id"
                )
            )
        queues: tuple[str, ...] = ()
        if "absurd" in schemas:
            queues = tuple(
                r[0] for r in await conn.fetch("select queue_name from absurd.queues order by 1")
            )
        return Snapshot(schemas, tuple(counts), runs, queues)
    finally:
        await conn.close()


@dataclass
class Prepared:
    """A client on a migrated database holding one run submitted with idempotency key KEY."""

    client: LaneClient
    url: str
    run_id: str


@pytest.fixture
async def prepared(database_url: str) -> AsyncIterator[Prepared]:
    """A client (release rel-a) after one submit of play p with RUN_INPUT and KEY."""
    async with open_client(database_url, ENV) as client:
        run = await client.submit("p", RUN_INPUT, idempotency_key=KEY)
        yield Prepared(client, database_url, run.run_id)


async def stored_input(url: str, run_id: str) -> Any:
    """Return the input stored for ``run_id``."""
    conn = await connect(url)
    try:
        return await conn.fetchval(
            f"select input from {STORE}.runs where run_id = $1", uuid.UUID(run_id)
        )
    finally:
        await conn.close()


def assert_invalid_request(exc: BaseException, *phrases: str) -> None:
    """The refusal is the project's usage error with one sentence naming the problem."""
    assert isinstance(exc, InvalidRequestError)
    assert isinstance(exc, ValueError)
    assert isinstance(exc, LaneWorkerError)
    assert not isinstance(exc, asyncpg.PostgresError)
    message = str(exc)
    assert "\n" not in message
    assert len(message) < 2000  # one sentence, not a copy of the request
    for phrase in phrases:
        assert phrase in message, message


BAD_INPUTS: list[tuple[str, Any, str]] = [
    ("list", [1, 2], f"{NOT_AN_OBJECT} list"),
    ("tuple", ("a",), f"{NOT_AN_OBJECT} tuple"),
    ("string", '{"a": 1}', f"{NOT_AN_OBJECT} str"),
    ("int", 5, f"{NOT_AN_OBJECT} int"),
    ("float", 2.5, f"{NOT_AN_OBJECT} float"),
    ("bool", False, f"{NOT_AN_OBJECT} bool"),
    ("bytes", b"{}", f"{NOT_AN_OBJECT} bytes"),
    ("nan", {"a": float("nan")}, f"{NOT_STORABLE} a non-finite float (nan) at $.a"),
    ("infinity", {"a": [float("inf")]}, f"{NOT_STORABLE} a non-finite float (inf) at $.a[0]"),
    ("minus-infinity", {"a": -float("inf")}, "a non-finite float (-inf) at $.a"),
    ("nul-in-string", {"a": "x\x00y"}, f"{NOT_STORABLE} a string with a NUL character"),
    ("nul-in-key", {"\x00": 1}, f"{NOT_STORABLE} a key with a NUL character"),
    ("nul-in-nested-key", {"a": {"b\x00": 1}}, "a key with a NUL character (\\u0000) at $.a"),
    ("lone-surrogate", {"a": "\ud800"}, "a string with a lone surrogate (not UTF-8) at $.a"),
    ("lone-surrogate-key", {"\udcff": 1}, "a key with a lone surrogate"),
    ("int-key", {1: "one"}, "a int key (1) at $; keys must be strings"),
    ("datetime", {"when": datetime.date(2026, 1, 1)}, "a datetime.date at $.when"),
    ("set", {"s": {1}}, "a set at $.s"),
    ("huge-int", {"n": 10**5000}, "an int too long to write as JSON"),
    ("too-deep", nested(600), "nests deeper than 512 levels"),
    (
        "over-1-mib",
        {"k": "x" * MAX_INPUT_BYTES},
        f"more than the {MAX_INPUT_BYTES} bytes (1 MiB) allowed",
    ),
    (
        "over-1-mib-in-utf8",
        {"k": "\u00e9" * (MAX_INPUT_BYTES // 2)},
        f"more than the {MAX_INPUT_BYTES} bytes (1 MiB) allowed",
    ),
]


@pytest.mark.parametrize(
    ("value", "says"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
async def test_submit_refuses_an_input_that_is_not_a_small_json_object(
    prepared: Prepared, value: Any, says: str
) -> None:
    """submit raises InvalidRequestError naming the problem, and writes nothing."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit("p", value)
    assert_invalid_request(caught.value, says)
    assert await snapshot(prepared.url) == before


async def test_an_input_of_exactly_1_mib_is_accepted(prepared: Prepared) -> None:
    """The limit is inclusive: 1 MiB of JSON as Postgres prints it is stored.

    (So the test above can fail.)
    """
    filler = MAX_INPUT_BYTES - len(json.dumps({"k": ""}, separators=(", ", ": ")))
    run = await prepared.client.submit("p", {"k": "x" * filler})
    assert len((await stored_input(prepared.url, run.run_id))["k"]) == filler


@pytest.mark.parametrize("input_", [None, {}], ids=["none", "empty"])
async def test_no_input_is_the_empty_object(prepared: Prepared, input_: Any) -> None:
    """None (and an absent input) is stored as {}."""
    run = await prepared.client.submit("p", input_)
    assert await stored_input(prepared.url, run.run_id) == {}
    default = await prepared.client.submit("p")
    assert await stored_input(prepared.url, default.run_id) == {}


BAD_KEYS: list[tuple[str, Any, str]] = [
    ("too-long", "k" * 256, KEY_PROBLEM),
    ("far-too-long", "k" * 5000, KEY_PROBLEM),
    ("nul", "order\x00-1", KEY_PROBLEM),
    ("lone-surrogate", "order-\udcff", KEY_PROBLEM),
    ("blank", "   ", "must be a non-blank string"),
    ("empty", "", "must be a non-blank string"),
    ("not-a-string", 42, "must be a non-blank string"),
]


@pytest.mark.parametrize(("key", "says"), [c[1:] for c in BAD_KEYS], ids=[c[0] for c in BAD_KEYS])
async def test_unusable_idempotency_key_is_refused_before_the_database(
    prepared: Prepared, key: Any, says: str
) -> None:
    """An idempotency key over 255 characters, blank, or holding NUL is refused up front."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit("p", {}, idempotency_key=key)
    assert_invalid_request(caught.value, "an idempotency key", says)
    if len(str(key)) > 100:
        assert str(key)[:101] not in str(caught.value)  # quotes at most 100 characters
    assert await snapshot(prepared.url) == before


async def test_a_key_of_255_characters_is_accepted(prepared: Prepared) -> None:
    """The key limit is inclusive."""
    run = await prepared.client.submit("p", {}, idempotency_key="k" * 255)
    assert run.created


@pytest.mark.parametrize(("key", "says"), [c[1:] for c in BAD_KEYS], ids=[c[0] for c in BAD_KEYS])
async def test_unusable_event_key_is_refused_before_the_database(
    prepared: Prepared, key: Any, says: str
) -> None:
    """An event key over 255 characters, blank, or holding NUL is refused up front."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.signal(prepared.run_id, key, {"by": "ops"})
    assert_invalid_request(caught.value, "an event key", says)
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (float("nan"), "a non-finite float (nan) at $"),
        ({"by": "\x00"}, "a string with a NUL character"),
        ({"k": "x" * MAX_INPUT_BYTES}, f"more than the {MAX_INPUT_BYTES} bytes (1 MiB) allowed"),
    ],
    ids=["nan", "nul", "over-1-mib"],
)
async def test_unusable_event_payload_is_refused(prepared: Prepared, data: Any, says: str) -> None:
    """A payload that is not small, storable JSON is refused up front."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.signal(prepared.run_id, "approved", data)
    assert_invalid_request(caught.value, "the event's payload", says)
    assert await snapshot(prepared.url) == before


async def test_signal_without_an_event_key_is_refused(prepared: Prepared) -> None:
    """None is no event key."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.signal(prepared.run_id, None)  # type: ignore[arg-type]
    assert_invalid_request(caught.value, "signal needs an event key")
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize(
    ("play", "says"),
    [
        ("", "submit needs a play name"),
        ("   ", "submit needs a play name"),
        ("p" * 201, "a play name has at most 200 characters"),
        ("p\x00", "no NUL or unpaired surrogate character"),
    ],
    ids=["empty", "blank", "too-long", "nul"],
)
async def test_unusable_play_name_is_refused(prepared: Prepared, play: str, says: str) -> None:
    """A blank, over-long or NUL-holding play name is refused up front."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit(play, {})
    assert_invalid_request(caught.value, says)
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize("suffix", ["---", "   ", "", "...", "\u00e9\u00e9"], ids=repr)
async def test_queue_suffix_naming_no_queue_never_lands_on_the_own_lane(
    prepared: Prepared, suffix: str
) -> None:
    """A blank or all-punctuation suffix is refused: only None means this process's lane."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit("p", {}, queue_suffix=suffix)
    assert_invalid_request(caught.value, f"queue_suffix={suffix!r}", "names no queue")
    assert await snapshot(prepared.url) == before


async def test_queue_suffix_that_is_not_a_string_is_refused(prepared: Prepared) -> None:
    """A suffix of another type is refused, and never lands on the own lane."""
    before = await snapshot(prepared.url)
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit("p", {}, queue_suffix=7)  # type: ignore[arg-type]
    assert_invalid_request(caught.value, "queue_suffix must be a string", "not int")
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize(
    "value",
    [
        {"k" * 100_000: float("nan")},
        {"k" * 100_000: {"a": "\x00"}},
        {"a": {"k" * 100_000: None, "b": {1: 2}}},
    ],
    ids=["nan-under-a-long-key", "nul-under-a-long-key", "int-key-next-to-a-long-key"],
)
async def test_a_refusal_does_not_echo_a_huge_key(prepared: Prepared, value: Any) -> None:
    """Where the problem sits is named without copying a 100 kB key into the sentence."""
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit("p", value)
    assert_invalid_request(caught.value, "the run's input is not storable JSON")


async def test_queue_suffix_none_and_a_real_one(prepared: Prepared) -> None:
    """None is the own lane; a suffix is its dev lane (so the refusals above can fail)."""
    own = await prepared.client.submit("p", {})
    preview = await prepared.client.submit("p", {}, queue_suffix="PR-7")
    assert own.queue == OWN_QUEUE
    assert (preview.release_id, preview.queue) == ("dev-pr_7", "runs_pr_7")


CONFLICTS: list[tuple[str, str, Any, dict[str, str], str | None, str]] = [
    # (id, play, input, client env, queue_suffix, what differs)
    ("input", "p", {"a": 2}, ENV, None, "input"),
    ("no-input", "p", None, ENV, None, "input"),
    ("play", "q", RUN_INPUT, ENV, None, "play"),
    ("boolean-for-number", "p", {"a": True}, ENV, None, "input"),
    ("lane-release", "p", RUN_INPUT, {"DEEPLINE_RUNTIME_DEPLOY_VERSION": "rel-b"}, None, "lane"),
    ("lane-suffix", "p", RUN_INPUT, ENV, "pr-9", "lane"),
    ("play-and-input", "q", {"b": 1}, ENV, None, "play and input"),
]


@pytest.mark.parametrize(
    ("play", "input_", "env", "suffix", "differs"),
    [c[1:] for c in CONFLICTS],
    ids=[c[0] for c in CONFLICTS],
)
async def test_reused_idempotency_key_for_another_request_names_the_run(
    prepared: Prepared,
    play: str,
    input_: Any,
    env: dict[str, str],
    suffix: str | None,
    differs: str,
) -> None:
    """IdempotencyConflict names the existing run (and carries its id); nothing is written."""
    before = await snapshot(prepared.url)
    async with open_client(prepared.url, env) as client:
        with pytest.raises(IdempotencyConflict) as caught:
            await client.submit(play, input_, idempotency_key=KEY, queue_suffix=suffix)
    assert caught.value.run_id == prepared.run_id
    message = str(caught.value)
    assert f"idempotency key {KEY!r} already names run {prepared.run_id}" in message
    assert f"differs in its {differs};" in message
    assert "use another key" in message
    assert await snapshot(prepared.url) == before


async def test_same_key_and_same_request_returns_the_same_run(prepared: Prepared) -> None:
    """A repeat (another dict of equal content) returns the first run with created False."""
    before = await snapshot(prepared.url)
    again = await prepared.client.submit("p", json.loads('{ "a" : 1 }'), idempotency_key=KEY)
    assert (again.run_id, again.release_id, again.queue) == (prepared.run_id, RELEASE, OWN_QUEUE)
    assert again.created is False
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize(
    "value",
    [
        {"x": 1e16},
        {"x": 1e300},
        {"x": -0.0},
        {"x": 0.1, "y": 2.5e-7},
        {"n": [1, {"b": None}], "s": "\u00e9\U0001f600", "t": True},
        {},
    ],
    ids=["1e16", "1e300", "minus-zero", "fractions", "nested", "empty"],
)
async def test_the_same_request_twice_is_one_run(prepared: Prepared, value: Any) -> None:
    """Whatever Postgres makes of the numbers, the same request is the same run, not a conflict."""
    first = await prepared.client.submit("p", value, idempotency_key="same-request")
    before = await snapshot(prepared.url)
    again = await prepared.client.submit("p", copy.deepcopy(value), idempotency_key="same-request")
    assert (again.run_id, again.created) == (first.run_id, False)
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"LANE_WORKER_MAX_ATTEMPTS": "abc"}, "LANE_WORKER_MAX_ATTEMPTS"),
        ({"LANE_WORKER_MAX_ATTEMPTS": "5000"}, "LANE_WORKER_MAX_ATTEMPTS"),
        ({"LANE_WORKER_MAX_ATTEMPTS": "1_0"}, "LANE_WORKER_MAX_ATTEMPTS"),
        ({"LANE_WORKER_MAX_ATTEMPTS": "9" * 5000}, "LANE_WORKER_MAX_ATTEMPTS"),
        ({"DEEPLINE_RUNTIME_DEPLOY_VERSION": "DEV"}, "DEEPLINE_RUNTIME_DEPLOY_VERSION"),
        ({"DEEPLINE_RUNTIME_DEPLOY_VERSION": "r" * 201}, "DEEPLINE_RUNTIME_DEPLOY_VERSION"),
    ],
    ids=["abc", "5000", "underscore", "5000-digits", "DEV", "long-release"],
)
async def test_submit_refuses_its_own_variables_instead_of_defaulting(
    prepared: Prepared, env: dict[str, str], variable: str
) -> None:
    """A bad LANE_WORKER_MAX_ATTEMPTS or deploy version refuses the submit (LaneConfigError)."""
    before = await snapshot(prepared.url)
    client = await LaneClient.connect(prepared.url, env=env)
    try:
        with pytest.raises(LaneConfigError) as caught:
            await client.submit("p", {})
    finally:
        await client.close()
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert await snapshot(prepared.url) == before


async def test_submit_with_a_suffix_still_refuses_a_bad_max_attempts(prepared: Prepared) -> None:
    """With queue_suffix the deploy version is not read, but max attempts still is."""
    before = await snapshot(prepared.url)
    env = {"LANE_WORKER_MAX_ATTEMPTS": "abc", "DEEPLINE_RUNTIME_DEPLOY_VERSION": "DEV"}
    client = await LaneClient.connect(prepared.url, env=env)
    try:
        with pytest.raises(LaneConfigError) as caught:
            await client.submit("p", {}, queue_suffix="pr-1")
    finally:
        await client.close()
    assert caught.value.variable == "LANE_WORKER_MAX_ATTEMPTS"
    assert await snapshot(prepared.url) == before


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"VERCEL": "maybe"}, "VERCEL"),
        ({"VERCEL": "2"}, "VERCEL"),
        ({"LANE_WORKER_PGBOUNCER": "sometimes"}, "LANE_WORKER_PGBOUNCER"),
        (
            {"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "runtime_scheduler_typo"},
            "DEEPLINE_ABSURD_QUEUE_SUFFIX",
        ),
        ({"DEEPLINE_ABSURD_QUEUE_SUFFIX": "---"}, "DEEPLINE_ABSURD_QUEUE_SUFFIX"),
        ({"DEEPLINE_RUNTIME_SCHEDULER_SCHEMA": "1bad"}, "DEEPLINE_RUNTIME_SCHEDULER_SCHEMA"),
    ],
    ids=["vercel-maybe", "vercel-2", "pgbouncer", "typo-schema", "suffix", "bad-schema"],
)
async def test_connect_refuses_the_configuration_every_call_uses(
    database_url: str, env: dict[str, str], variable: str
) -> None:
    """LaneClient.connect raises LaneConfigError naming the variable, and opens nothing."""
    before = await snapshot(database_url)
    with pytest.raises(LaneConfigError) as caught:
        await LaneClient.connect(database_url, env=env)
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert await snapshot(database_url) == before


async def test_read_calls_on_a_database_without_schemas_install_nothing(
    empty_database_url: str,
) -> None:
    """lanes, status, signal, cancel, retire and activate raise SchemasMissingError."""
    before = await snapshot(empty_database_url)
    client = await LaneClient.connect(empty_database_url, env={})
    some_run = str(uuid.uuid4())
    try:
        calls: list[Callable[[], Awaitable[object]]] = [
            client.lanes,
            lambda: client.status(some_run),
            lambda: client.signal(some_run, "approved"),
            lambda: client.cancel(some_run),
            lambda: client.retire_release("rel-a"),
            lambda: client.activate_release("rel-a", force=True),
            lambda: client.lane_known("rel-a"),
        ]
        for call in calls:
            with pytest.raises(SchemasMissingError, match="run `lane-worker migrate` first"):
                await call()
    finally:
        await client.close()
    after = await snapshot(empty_database_url)
    assert after == before
    assert "absurd" not in after.schemas
    assert STORE not in after.schemas


async def test_submit_on_a_database_without_schemas_installs_them(
    empty_database_url: str,
) -> None:
    """A client's first write installs both schemas, as a worker's boot does; reads do not."""
    client = await LaneClient.connect(empty_database_url, env={})
    try:
        run = await client.submit("p", {"n": 1})
        assert (await client.status(run.run_id)).status == "queued"
    finally:
        await client.close()
    after = await snapshot(empty_database_url)
    assert "absurd" in after.schemas
    assert STORE in after.schemas


@pytest.mark.parametrize(
    "token", ["tok-SECRET\x00", "tok-SECRET\udcff"], ids=["nul", "lone-surrogate"]
)
async def test_a_runtime_api_python_cannot_send_is_refused_without_quoting_it(
    prepared: Prepared, token: str
) -> None:
    """A token Postgres could not store: InvalidRequestError naming where, never the token."""
    before = await snapshot(prepared.url)
    api = {"baseUrl": "https://app.example", "executorToken": token}
    with pytest.raises(LaneWorkerError) as caught:
        await prepared.client.submit("p", {}, runtime_api=api)
    assert_invalid_request(caught.value, "the runtime API context is not storable JSON")
    assert "SECRET" not in str(caught.value)
    assert "$.executorToken" in str(caught.value)
    assert await snapshot(prepared.url) == before
