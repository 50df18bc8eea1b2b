"""The client's old name ``RunStatus`` keeps working: it is ``RunReport``, with a warning."""

from __future__ import annotations

import pytest

import worker.client
from worker.client import RunReport


def test_run_status_is_the_report_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="use worker.client.RunReport"):
        from worker.client import RunStatus
    assert RunStatus is RunReport


def test_other_missing_names_still_raise() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = worker.client.Nope
