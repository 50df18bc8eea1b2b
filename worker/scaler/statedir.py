"""Where the process backend records its machines: one absolute folder per user and database.

A relative default (``.lane-worker/machines``, in earlier versions) made a scaler restarted from
another directory (systemd, another shell) find none of its machines: it started new ones
and left the old ones running unmanaged. So the default is the user's XDG state folder,
keyed by the database the scaler manages (host, port, database name and store schema,
hashed; never the password), so two scalers of two databases on one host never share
machines, and a scaler finds its machines from any directory. An override (``--state-dir``,
``LANE_WORKER_SCALER_STATE_DIR``) is resolved once, at start, to an absolute path.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

import structlog

from worker.config.dburl import DATABASE_URL_ENV
from worker.config.settings import diagnose

log = structlog.get_logger("lane_worker.scaler")

XDG_STATE_HOME_ENV = "XDG_STATE_HOME"
# Where scalers before this one kept their machines, relative to where they ran.
LEGACY_STATE_DIR = Path(".lane-worker/machines")
DEFAULT_PORT = "5432"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def state_home(env: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME`` when set to an absolute path (as the XDG spec says), else
    ``~/.local/state``."""
    given = (env.get(XDG_STATE_HOME_ENV) or "").strip()
    if given and Path(given).is_absolute():
        return Path(given)
    return Path.home() / ".local" / "state"


def database_key(url: str, store_schema: str) -> str:
    """A short stable name for the database ``url`` points at and its store schema:
    ``<dbname>-<hash of host, port, dbname, schema>``. The user and password are not in it."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    hostspec = parts.netloc.rsplit("@", 1)[-1].lower()
    user = unquote(parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]) if "@" in parts.netloc else ""
    hosts = []
    for host in (query.get("host") or hostspec).split(","):
        bare = host.rsplit("]", 1)[-1] if host.startswith("[") else host
        hosts.append(host if ":" in bare else f"{host}:{query.get('port') or DEFAULT_PORT}")
    # As the driver does: no database name is the user's own database.
    dbname = unquote(parts.path.lstrip("/")) or query.get("dbname") or user or "postgres"
    digest = hashlib.sha256(json.dumps([sorted(hosts), dbname, store_schema]).encode())
    readable = _UNSAFE.sub("_", dbname)[:40] or "db"
    return f"{readable}-{digest.hexdigest()[:12]}"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """The default folder for the database and store schema ``env`` names."""
    diagnosis = diagnose(env)
    for error in diagnosis.errors:
        if error.variable == DATABASE_URL_ENV:
            raise error  # as the client would refuse it: its sentence quotes no secret
    url = (env.get(DATABASE_URL_ENV) or "").strip()
    return state_home(env) / "lane-worker" / "machines" / database_key(url, diagnosis.store_schema)


def _records(folder: Path) -> list[Path]:
    try:
        return sorted(folder.glob("*.json"))
    except OSError:
        return []


def resolve_state_dir(given: Path | None, env: Mapping[str, str], cwd: Path | None = None) -> Path:
    """The absolute folder the process backend uses: ``given`` (resolved against ``cwd``
    now, once) or the default. Logs it; warns when the default is empty while the old
    relative default under ``cwd`` holds machine records (they would be left unmanaged)."""
    here = Path.cwd() if cwd is None else cwd
    if given is not None:
        chosen = (here / given).resolve()
        log.info("scaler.state_dir", state_dir=str(chosen), source="--state-dir", given=str(given))
        return chosen
    chosen = default_state_dir(env)
    log.info("scaler.state_dir", state_dir=str(chosen), source="default")
    legacy = (here / LEGACY_STATE_DIR).resolve()
    found = _records(legacy)
    if found and legacy != chosen and not _records(chosen):
        log.warning(
            "scaler.state_dir_legacy",
            state_dir=str(chosen),
            legacy_dir=str(legacy),
            records=len(found),
            message=(
                f"{legacy} holds {len(found)} machine record(s) of a scaler that used the old "
                f"relative default, and {chosen} holds none: those machines are not managed "
                f"by this scaler (it may start new ones beside them); to keep managing them, "
                f"restart it with --state-dir {legacy} (or LANE_WORKER_SCALER_STATE_DIR)"
            ),
        )
    return chosen
