"""lane-worker's version is written once (worker/version.py); what repeats it must agree.

The TypeScript client is released with the worker whose SQL API it calls, and the
example app pins the wheel it vendors: a bump that forgets either fails here.
"""

from __future__ import annotations

import json
import re
import tomllib

from support import REPO
from worker.version import VERSION


def test_the_typescript_client_carries_the_workers_version() -> None:
    package = json.loads((REPO / "clients" / "typescript" / "package.json").read_text())
    lock = json.loads((REPO / "clients" / "typescript" / "package-lock.json").read_text())
    assert package["version"] == VERSION
    assert lock["version"] == lock["packages"][""]["version"] == VERSION


def test_the_example_app_pins_this_version() -> None:
    app = tomllib.loads((REPO / "examples" / "app" / "pyproject.toml").read_text())
    assert f"lane-worker=={VERSION}" in app["project"]["dependencies"]
    wheel = app["tool"]["uv"]["sources"]["lane-worker"]["path"]
    assert wheel == f"wheels/lane_worker-{VERSION}-py3-none-any.whl"
    locked = (REPO / "examples" / "app" / "uv.lock").read_text()
    assert re.search(rf'name = "lane-worker"\nversion = "{re.escape(VERSION)}"', locked)
