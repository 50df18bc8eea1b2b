"""What the LISTEN connection tells the lane refresh (issue 35).

A (re)connect pokes every loop itself and asks the lane refresh to re-read the
registry; only a lane NOTIFY also makes the refresh poke every loop again. Before,
both poked: at boot a worker facing 900 retired lanes checked every quiet loop
twice, 7 s apart (18 safety-net statements where 9 do).
"""

from __future__ import annotations

from worker.daemon.listener import Listener, Wakeups
from worker.db.tasks import LANES_CHANNEL


def listener() -> tuple[Listener, Wakeups, list[str]]:
    wakeups = Wakeups()
    poked: list[str] = []
    return Listener("postgresql://x/y", wakeups, set, lambda: poked.append("all")), wakeups, poked


def test_a_reconnect_pokes_the_loops_once_and_asks_only_for_a_refresh() -> None:
    lis, wakeups, poked = listener()
    lis._wake_everyone()
    assert poked == ["all"]
    assert wakeups.lanes_changed.is_set()
    assert wakeups.take_lanes_notified() is False


def test_a_lane_notify_asks_the_refresh_to_poke_every_loop_once() -> None:
    lis, wakeups, poked = listener()
    lis._on_notify(None, 0, LANES_CHANNEL, "")  # type: ignore[arg-type]
    assert poked == []
    assert wakeups.lanes_changed.is_set()
    assert wakeups.take_lanes_notified() is True
    assert wakeups.take_lanes_notified() is False  # taken once
