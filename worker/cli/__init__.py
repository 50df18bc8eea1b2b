"""The ``lane-worker`` command line: a thin shell over settings, client and supervisor.

One module per command group (``runs``, ``submit``, ``lanes``, ``database``, ``daemon``,
``roles``), hung from ``root``. ``exits`` turns what went wrong into one sentence on stderr and the
exit code ``errors.exit_code_for`` gives it (0 ok, 1 failure, 2 usage, 78 config);
``connect`` runs a database command's client; ``params`` holds the parameter types
and shared options, ``output`` the printing.
"""

from __future__ import annotations

from worker.cli import (  # noqa: F401 (they register the commands)
    daemon,
    database,
    lanes,
    releases,
    roles,
    runs,
    scaler,
    submit,
)
from worker.cli.root import cli

__all__ = ["cli", "main"]


def main() -> None:
    """Run the ``lane-worker`` command."""
    cli(prog_name="lane-worker")
