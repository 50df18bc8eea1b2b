"""The client's renamed result class under its old name, where the class itself lived.

A review of issue 30 item 8 (``RunStatus`` -> ``RunReport``): the old name still
imports from ``worker.client`` with a ``DeprecationWarning`` (README); it must
from ``worker.client.results`` too, the module that defined it (its
``__module__``, what type hints and reprs named): such an import failed.
"""

from __future__ import annotations

import importlib

import pytest


def test_the_old_name_imports_from_the_module_that_defined_it() -> None:
    results = importlib.import_module("worker.client.results")
    with pytest.warns(DeprecationWarning, match="RunReport"):
        old = results.RunStatus
    assert old is results.RunReport
