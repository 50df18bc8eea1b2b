"""``python -m worker``: the same as the ``lane-worker`` command."""

from worker.cli import main

main()
