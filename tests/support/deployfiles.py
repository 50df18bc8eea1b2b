"""Reading the deploy files as Docker, Fly and sh read them, for the tests that check them.

The Dockerfile parser handles what these files use (``\\`` continuations, comments, stages,
``ENV A=1 B=2`` and ``ENV A 1``, ``ARG``, the exec and shell forms of ``CMD``); the checks
shared by lane-worker's own image and the example app's image (``examples/app``) live here
too, so both images are held to the same rules.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import REPO
from worker import lanes
from worker.config import settings

DOCKERFILE = REPO / "Dockerfile"
FLY_TOML = REPO / "fly.toml"
MAKEFILE = REPO / "Makefile"
# Only for Settings.from_env in these tests: never connected to.
UNUSED_DB_URL = "postgresql://deploy-check@127.0.0.1:1/none"


# --- the Dockerfile parser -----------------------------------------------------------------


@dataclass
class Stage:
    """One ``FROM`` stage: its instructions in order, as (KEYWORD, arguments)."""

    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    @property
    def image(self) -> str:
        """Return the image the stage starts from (``FROM image AS name`` without the name)."""
        return self.base.split()[0]

    def all(self, keyword: str) -> list[str]:
        """Return the arguments of every ``keyword`` instruction of this stage."""
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        """Return the arguments of the stage's last ``keyword`` (the one Docker applies)."""
        found = self.all(keyword)
        assert found, f"the stage FROM {self.base} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """Return the stage's ENV variables (later ENVs win)."""
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            values.update(parse_env(args))
        return values

    def args(self) -> dict[str, str | None]:
        """Return the stage's ARG names with their defaults (None: no default)."""
        values: dict[str, str | None] = {}
        for args in self.all("ARG"):
            for word in shlex.split(args):
                name, eq, default = word.partition("=")
                values[name] = default if eq else None
        return values


def dockerfile_instructions(text: str) -> Iterator[tuple[str, str]]:
    """Yield (KEYWORD, arguments) per instruction: continuations joined, comments dropped."""
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        # Comment lines are dropped, also between continuation lines (Docker does the same).
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = joined.partition(" ")
        yield keyword.upper(), args.strip()
    assert not pending, "the Dockerfile ends inside a line continuation"


def parse_env(args: str) -> dict[str, str]:
    """Parse an ENV instruction's arguments: ``A=1 B="two words"`` or the legacy ``A 1``."""
    words = shlex.split(args)
    if words and "=" not in words[0]:
        name, _, value = args.partition(" ")
        return {name: " ".join(shlex.split(value))}
    values = {}
    for word in words:
        name, eq, value = word.partition("=")
        assert eq, f"ENV {args!r}: {word!r} is not NAME=VALUE"
        values[name] = value
    return values


def parse_dockerfile(text: str) -> list[Stage]:
    """Return the Dockerfile's stages in order (the last one is the image)."""
    stages: list[Stage] = []
    for keyword, args in dockerfile_instructions(text):
        if keyword == "FROM":
            stages.append(Stage(base=args))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    assert stages, "the Dockerfile has no FROM"
    return stages


def exec_form(args: str) -> list[str]:
    """Return a CMD/ENTRYPOINT as argv: the JSON (exec) form, else the shell words."""
    if args.startswith("["):
        argv = json.loads(args)
        assert isinstance(argv, list), args
        return [str(a) for a in argv]
    return shlex.split(args)


def copy_sources(args: str) -> list[str]:
    """Return the build-context sources of a ``COPY`` (none for ``COPY --from=stage``)."""
    words = exec_form(args) if args.startswith("[") else shlex.split(args)
    if any(word.startswith("--from=") for word in words):
        return []
    paths = [word for word in words if not word.startswith("--")]
    assert len(paths) >= 2, f"COPY {args}: no source and destination"
    return paths[:-1]


def shell_lines(text: str) -> list[str]:
    """Return a shell script's commands, ``\\`` continuations joined, comments dropped."""
    lines, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def uv_syncs(commands: list[str]) -> list[list[str]]:
    """Return the arguments after ``uv sync`` of every such call in ``commands``."""
    found = []
    for command in commands:
        words = shlex.split(command)
        for i, word in enumerate(words[:-1]):
            if Path(word).name == "uv" and words[i + 1] == "sync":
                found.append(words[i + 2 :])
    return found


def makefile_uv_version() -> str:
    """Return the uv version the Makefile pins (``UV_VERSION``), which every install uses."""
    make = MAKEFILE.read_text()
    pinned = re.findall(r"^\s*UV_VERSION\s*:?=\s*(\S+)\s*$", make, re.MULTILINE)
    assert len(pinned) == 1, pinned
    assert "uv==$(UV_VERSION)" in make
    return pinned[0]


# --- checks shared by every image ------------------------------------------------------------


def release_guard(image: Stage, value: str) -> subprocess.CompletedProcess[str]:
    """Run the final stage's release-id guard as Docker would, with the build arg ``value``."""
    name = lanes.RELEASE_ID_ENV
    guards = [run for run in image.all("RUN") if name in run]
    assert len(guards) == 1, f"the final stage has no single RUN that checks {name}"
    return subprocess.run(
        ["/bin/sh", "-c", guards[0]],
        env={name: value, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        check=False,
    )


def assert_bakes_the_release_id(image: Stage) -> None:
    """Fail unless the final stage turns ``ARG`` RELEASE_ID_ENV into the same ``ENV``."""
    name = lanes.RELEASE_ID_ENV
    assert name in image.args(), f"the final stage declares no ARG {name}"
    baked = image.env().get(name)
    assert baked in (f"${{{name}}}", f"${name}"), f"ENV {name}={baked!r} is not the ARG's value"


def assert_runs_as_a_non_root_user_it_creates(image: Stage) -> None:
    """Fail unless the final stage's USER is not root and is created by the stage."""
    user = image.last("USER")
    name = user.split(":")[0]
    assert name not in ("root", "0"), f"USER {user}"
    created = [args for args in image.all("RUN") if "useradd" in args or "adduser" in args]
    assert any(re.search(rf"\b{re.escape(name)}\s*$", args) for args in created), (
        f"USER {user}, but the final stage creates no such user"
    )


def assert_syncs_exactly_the_lock(words: list[str]) -> None:
    """Fail unless a ``uv sync`` call installs the lock as it is, without dev tools or extras."""
    assert "--frozen" in words, words
    assert "--no-dev" in words, words
    assert not {"--all-extras", "--extra", "--dev", "--all-groups"} & set(words), words


def exposed_ports(image: Stage) -> set[int]:
    """Return the ports the final stage's ``EXPOSE`` lines name."""
    return {int(p.split("/")[0]) for args in image.all("EXPOSE") for p in args.split()}


# --- fly.toml --------------------------------------------------------------------------------


def read_fly() -> dict[str, Any]:
    """Return lane-worker's fly.toml, parsed."""
    return tomllib.loads(FLY_TOML.read_text())


def fly_env(fly: dict[str, Any]) -> dict[str, str]:
    """Return fly.toml's [env] as strings (as the machine sees them)."""
    return {name: str(value) for name, value in fly.get("env", {}).items()}


def health_port(fly: dict[str, Any]) -> int:
    """Return the health port fly.toml's [env] gives the daemon, as the daemon parses it."""
    env = {**fly_env(fly), settings.DATABASE_URL_ENV: UNUSED_DB_URL}
    assert settings.HEALTH_PORT_ENV in env, (
        f"fly.toml [env] does not set {settings.HEALTH_PORT_ENV}"
    )
    return settings.Settings.from_env(env).tuning.health_port
