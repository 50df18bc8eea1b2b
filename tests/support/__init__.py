"""What the test suites share: the database fixture, harnesses, the CLI runner and the plays.

``tests/`` has no ``__init__.py``: pytest's default ("prepend") import mode puts it on
``sys.path`` before importing ``tests/conftest.py``, so this package imports as the
top-level ``support`` (``from support.cli import run_cli``) from every test module. A
daemon started by :mod:`support.daemon` gets the same directory on ``PYTHONPATH``, so its
``--app`` names a module here (``support.apps.basic:app``).

- :mod:`support.pgfixture`: the session's PostgreSQL, its migrated template, fresh databases.
- :mod:`support.cli`: ``python -m worker ARGS`` with exactly a given environment.
- :mod:`support.daemon`: real daemons (``python -m worker run``) and their JSON logs.
- :mod:`support.runtime`: in-process runtimes and clients, for claims driven by the test.
- :mod:`support.db`: one query on a connection of its own, and the rows tests read.
- :mod:`support.report`: reading the drain report (buckets, blockers) in assertions.
- :mod:`support.page`: the lanes page as headless Chromium renders it.
- :mod:`support.plays`: the in-process apps the integration tests share.
- :mod:`support.apps`: the apps the daemons of the e2e tests run.
- :mod:`support.deployfiles`: the Dockerfile, fly.toml and shell scripts, read as their tools do.
- :mod:`support.example_app`: the example app (``examples/app``) and its image's build, replayed.
- :mod:`support.tsclient`: the TypeScript client (``clients/typescript``), built for Node.
"""

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO = TESTS_DIR.parent

# The least a wait helper (``eventually``, a daemon's ``wait_for`` / ``wait_exit`` /
# ``ready``) waits before it gives up, whatever ``timeout_s`` it was given: its limit
# only tells a hang from slow progress, and on a loaded CI machine a daemon's boot or
# a subprocess's exit can take many seconds. A test that means "promptly" says so in
# an assertion of its own (on the database, on recorded order, or with a defect's
# signal made far larger than this), never through a wait's limit.
WAIT_FLOOR_S = 60.0


def give_up_after(timeout_s: float) -> float:
    """Return how long a wait helper asked for ``timeout_s`` waits (``WAIT_FLOOR_S`` at least)."""
    return max(timeout_s, WAIT_FLOOR_S)


def step_logged(log: Path) -> bool:
    """Tell whether an execution's line is in ``log`` (support.apps' ``record``), not only its file.

    ``record`` opens the file, then writes: a worker killed between the two leaves an
    empty file, and its re-run takes itself for the first execution.
    """
    return log.exists() and log.read_text().endswith("\n")
