"""The embedded-Postgres helper's bookkeeping (no server needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from worker.dev.embedded import _forget_dead_users


def test_a_killed_dev_process_no_longer_holds_the_server(tmp_path: Path) -> None:
    """Pids of dead processes are dropped from the server's user list; live ones stay."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(dead.stdout)
    users = tmp_path / ".handle_pids.json"
    users.write_text(json.dumps([os.getpid(), dead_pid]))
    _forget_dead_users(tmp_path)
    assert json.loads(users.read_text()) == [os.getpid()]


def test_a_missing_or_garbled_user_list_is_left_alone(tmp_path: Path) -> None:
    """No file, or a file that is not JSON, is not an error (the library rewrites it)."""
    _forget_dead_users(tmp_path)
    (tmp_path / ".handle_pids.json").write_text("{not json")
    _forget_dead_users(tmp_path)
    assert (tmp_path / ".handle_pids.json").read_text() == "{not json"
