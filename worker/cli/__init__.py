"""The ``lane-worker`` command line: a thin shell over settings, client and supervisor.

One module per command group (``runs``, ``lanes``, ``database``, ``daemon``);
``common`` maps what can go wrong to an exit code and one sentence on stderr
(0 ok, 1 failure, 2 usage, 78 config); ``params`` holds the parameter types.
"""

from __future__ import annotations

from worker.cli import daemon, database, lanes, runs  # noqa: F401 (they register the commands)
from worker.cli.root import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Run the ``lane-worker`` command."""
    cli(prog_name="lane-worker")
