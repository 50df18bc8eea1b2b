"""Named SQL parameters: each params dataclass has one field per parameter of its statement."""

from __future__ import annotations

import re
import uuid
from dataclasses import fields

import pytest

from worker.db.engine_claims import _AdoptClaim, _ClaimNext, _OwnClaim
from worker.db.sql import engine_query, named_queries, query
from worker.db.store.api import _SubmitRun
from worker.db.store.attempts import CheckpointWrite, CompletionWrite, _BeginAttempt
from worker.db.store.lanes import _Heartbeat
from worker.db.store.rows import args_of, columns_of
from worker.db.store.runs import _InsertRun, _SettleRun


def _parameters(sql: str) -> int:
    return max(int(n) for n in re.findall(r"\$(\d+)", sql))


def _own_claim() -> str:
    return query("engine", "own_claim.sql", "own_claim", schema="s", queue="q")


def _adopt_claim() -> str:
    return query("engine", "adopt_claim.sql", "adopt_claim", schema="s", queue="q")


def _store(name: str, file: str = "attempts.sql") -> str:
    return named_queries("store", file, schema="s")[name]


@pytest.mark.parametrize(
    ("sql", "count"),
    [
        (_own_claim(), len(fields(_OwnClaim))),
        (_adopt_claim(), len(fields(_AdoptClaim))),
        (engine_query("claim_next"), len(fields(_ClaimNext))),
        (_store("begin_attempt"), len(fields(_BeginAttempt))),
        # lock_wait_ms, then the checkpoints' arrays, then the completions'.
        (_store("write_sets"), 1 + len(fields(CheckpointWrite)) + len(fields(CompletionWrite))),
        (_store("complete_attempt"), len(fields(CompletionWrite))),
        (_store("insert_run", "runs.sql"), len(fields(_InsertRun))),
        (_store("settle_run", "runs.sql"), len(fields(_SettleRun))),
        (_store("heartbeat", "lanes.sql"), len(fields(_Heartbeat))),
        (_store("submit_run", "api.sql"), len(fields(_SubmitRun))),
    ],
    ids=[
        "own_claim",
        "adopt_claim",
        "claim_next",
        "begin_attempt",
        "write_sets",
        "complete_attempt",
        "insert_run",
        "settle_run",
        "heartbeat",
        "submit_run",
    ],
)
def test_a_params_dataclass_has_a_field_per_parameter(sql: str, count: int) -> None:
    assert _parameters(sql) == count


def test_values_come_in_field_order() -> None:
    run, engine_run, task = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    begin = _BeginAttempt(
        queue="runs_a",
        task_id=task,
        step_keys=1,
        adopted_queue=None,
        adopted_release_id=None,
        disposition="own",
        release_id="a",
        worker_id="w",
        attempt=2,
        engine_run_id=engine_run,
        run_id=run,
    )
    assert args_of(begin) == (run, engine_run, 2, "w", "a", "own", None, None, 1, task, "runs_a")
    writes = [
        CheckpointWrite("q1", task, "s1", "1", engine_run, None),
        CheckpointWrite("q2", task, "s2", None, engine_run, 30),
    ]
    assert columns_of(CheckpointWrite, writes) == [
        ["q1", "q2"],
        [task, task],
        ["s1", "s2"],
        ["1", None],
        [engine_run, engine_run],
        [None, 30],
    ]
    assert columns_of(CompletionWrite, []) == [[]] * len(fields(CompletionWrite))
