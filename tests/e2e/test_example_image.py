"""The example app's image, built and run as far as this machine allows (Docker does not run).

As a user's CI would: the example project (``examples/app``) is checked out in a temporary
folder, its vendor script builds lane-worker's wheel from this tree and locks it, and the build
stage of its Dockerfile is performed step by step (``support/example_app.py``: each COPY, each
RUN, offline from uv's cache). The image's CMD then runs from the venv that build made, with
the image's ENV, in a folder holding nothing else, against the test database: /readyz answers
200, runs of both of the example's plays complete in the store, and SIGTERM drains it (exit 0).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

import aiohttp

from support.daemon import Daemons
from support.db import run_row
from support.deployfiles import exec_form, makefile_uv_version, parse_dockerfile
from support.example_app import UV_BIN, copy_example, replay_build, run, vendor_lane_worker
from support.runtime import eventually
from worker import lanes

RELEASE = "myapp-3f9c2e1"
# A machine's own PATH, less the image's venv (the final stage prepends it).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def locked(project: Path) -> dict[str, dict[str, Any]]:
    """Return the packages of a project's uv.lock by name."""
    return {p["name"]: p for p in tomllib.loads((project / "uv.lock").read_text())["package"]}


def machine_env(baked: dict[str, str], venv_in_image: str, venv: Path) -> dict[str, str]:
    """Return the final stage's ENV as a machine of the image sees it, with the venv moved."""
    env = {}
    for name, value in baked.items():
        value = value.replace("$PATH", SYSTEM_PATH).replace(venv_in_image, str(venv))
        env[name] = value.replace(f"${{{lanes.RELEASE_ID_ENV}}}", RELEASE)
    return env


def launched(pid: int) -> str:
    """Return the script a Python process runs (the second word of its command line)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1].decode()


async def ready(port: int) -> bool:
    """Tell whether GET /readyz on the health port answers 200 (what the checks ask)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
            http.get(f"http://127.0.0.1:{port}/readyz") as response,
        ):
            return response.status == 200
    except aiohttp.ClientConnectionError:
        return False


async def cli(venv: Path, database_url: str, *args: str) -> Any:
    """Run the image's own `lane-worker ARGS --json` as the app's side does; return its JSON."""
    env = {
        "PATH": f"{venv / 'bin'}:{SYSTEM_PATH}",
        "WORKFLOW_RUNTIME_POSTGRES": database_url,
        lanes.RELEASE_ID_ENV: RELEASE,
    }
    done = await asyncio.to_thread(run, ["lane-worker", *args, "--json"], venv, env)
    return json.loads(done.stdout)


async def completed(database_url: str, run_id: str) -> dict[str, Any] | None:
    """Return the run's store row once it has completed."""
    row = await run_row(database_url, run_id)
    assert row["status"] not in ("failed", "cancelled"), row
    return row if row["status"] == "completed" else None


async def test_the_example_image_builds_boots_and_completes_its_plays(
    database_url: str, tmp_path: Path
) -> None:
    """Vendor, build as the Dockerfile does, run its CMD: ready, both plays complete, drains."""
    project = copy_example(tmp_path / "myapp")
    before = locked(project)
    await asyncio.to_thread(vendor_lane_worker, project)
    after = locked(project)
    # Re-locking moved lane-worker's wheel only, to the one just built.
    assert {n: p["version"] for n, p in after.items()} == {
        n: p["version"] for n, p in before.items()
    }
    wheel = project / after["lane-worker"]["source"]["path"]
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert after["lane-worker"]["wheels"][0]["hash"] == f"sha256:{digest}"

    build, image = parse_dockerfile((project / "Dockerfile").read_text())
    # The replay uses the uv `make install` put in .tools; the image installs the same version.
    uv_version = run([str(UV_BIN / "uv"), "--version"], tmp_path, {}).stdout.split()[1]
    assert uv_version == makefile_uv_version()
    venv = await asyncio.to_thread(replay_build, build, project, tmp_path / "build")

    argv = exec_form(image.last("CMD"))
    env = machine_env(image.env(), build.env()["UV_PROJECT_ENVIRONMENT"], venv)
    assert env[lanes.RELEASE_ID_ENV] == RELEASE
    # 8080 is shared by everything on this machine; a container has it to itself.
    env["LANE_WORKER_HEALTH_PORT"] = "0"
    env["WORKFLOW_RUNTIME_POSTGRES"] = database_url
    workdir = tmp_path / "image-workdir"  # the final stage's WORKDIR: nothing of the app in it
    workdir.mkdir()
    async with Daemons(database_url) as pool:
        daemon = pool.start_raw("myapp", env, argv=argv, cwd=workdir)
        await daemon.ready(timeout_s=30)
        # CMD's `lane-worker` is the venv's (found on the image's PATH), not this suite's.
        assert launched(daemon.pid) == str(venv / "bin" / "lane-worker")
        await eventually(lambda: ready(daemon.health_port), what="/readyz to answer 200")

        order = {"email": "ada@example.com", "grace_s": 1,
                 "lines": [{"sku": "A", "quantity": 2, "unit_cents": 1250}]}  # fmt: skip
        claim = {"order": "A-7", "total_cents": 2500, "reason": "used"}
        invoice = await cli(
            venv, database_url, "submit", "send-invoice", "--input", json.dumps(order)
        )
        refund = await cli(venv, database_url, "submit", "refund", "--input", json.dumps(claim))
        assert invoice["queue"] == lanes.queue_name_for_release(RELEASE)
        for parked in (invoice, refund):  # the grace period's sleep, the approval's wait
            await daemon.wait_for("run.parked", run_id=parked["runId"])
        await cli(
            venv, database_url, "signal", refund["runId"], "approved", "--data", '{"by": "ada"}'
        )

        invoiced = await eventually(
            lambda: completed(database_url, invoice["runId"]), what="the invoice run to complete"
        )
        refunded = await eventually(
            lambda: completed(database_url, refund["runId"]), what="the refund run to complete"
        )
        assert invoiced["output"]["invoice"] == {"to": "ada@example.com", "total_cents": 2500}
        # The release the image was built for: its lane, its id in what the play saw.
        assert invoiced["output"]["release"] == lanes.launch_release_id(env)
        assert refunded["output"] == {"order": "A-7", "refunded_cents": 1250, "approved_by": "ada"}

        daemon.terminate()  # the image's STOPSIGNAL
        assert await daemon.wait_exit(timeout_s=30) == 0
        assert not daemon.malformed_lines()
