"""The process backend's default state folder: per user and database, never the password."""

from __future__ import annotations

from pathlib import Path

from worker.scaler.statedir import database_key, default_state_dir, state_home

URL = "postgresql://app:hunter2hunter2@db.example:5432/app"


def test_the_key_names_the_database_not_its_credentials() -> None:
    key = database_key(URL, "runtime_scheduler")
    assert key.startswith("app-")
    assert "hunter2" not in key
    # The same database: another password or user, the default port spelled out or not.
    assert database_key("postgresql://ops:other@db.example/app", "runtime_scheduler") == key
    # Another database, host, port or store schema: another folder.
    others = [
        database_key("postgresql://app:x@db.example:5432/app2", "runtime_scheduler"),
        database_key("postgresql://app:x@db2.example:5432/app", "runtime_scheduler"),
        database_key("postgresql://app:x@db.example:5433/app", "runtime_scheduler"),
        database_key(URL, "lane_store"),
    ]
    assert len({key, *others}) == 5


def test_the_folder_is_absolute_and_follows_xdg_state_home(tmp_path: Path) -> None:
    env = {"WORKFLOW_RUNTIME_POSTGRES": URL, "XDG_STATE_HOME": str(tmp_path)}
    folder = default_state_dir(env)
    assert folder.parent == tmp_path / "lane-worker" / "machines"
    # A relative XDG_STATE_HOME is ignored, as the spec says.
    assert state_home({"XDG_STATE_HOME": "rel"}) == Path.home() / ".local" / "state"
