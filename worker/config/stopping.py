"""How long a worker takes at most to stop on SIGTERM: its drain window plus fixed bounds.

Configuration, not the daemon's internals: the daemon waits each bound, and the
scaler (its destroy deadline, Fly's stop timeout) and the deploy files read the
sum from here, with the drain window they configure.
"""

from __future__ import annotations

# How long the claim loops get to stop claiming.
POLLER_STOP_GRACE_S = 5.0
# How long unfinished runs get to hand themselves back after the drain window.
HAND_BACK_TIMEOUT_S = 10.0
# How long the worker's stop mark gets to be written.
STOP_MARK_TIMEOUT_S = 5.0


def longest_stop_s(drain_s: float) -> float:
    """Return the longest a SIGTERM can take to end the process, with drain window ``drain_s``.

    Claim loops stop, runs drain, unfinished ones hand themselves back, the stop is
    recorded: an orchestrator's kill timeout must exceed this, or runs are cut off
    and resume only after their lease expires.
    """
    return POLLER_STOP_GRACE_S + drain_s + HAND_BACK_TIMEOUT_S + STOP_MARK_TIMEOUT_S
