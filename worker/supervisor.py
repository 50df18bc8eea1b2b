"""The daemon: boot, claim loops, adoption refresh, maintenance, health, SIGTERM drain."""

from __future__ import annotations

from collections.abc import Mapping


def run_daemon(env: Mapping[str, str], app_spec: str) -> int:
    """Run the worker daemon until it is stopped; return the process exit code."""
    raise NotImplementedError("the supervisor is being written")
