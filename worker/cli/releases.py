"""`releases`: the release registry the scaler acts on (deploy, rollback, list)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click

from worker import lanes
from worker.cli.connect import with_client
from worker.cli.exits import Failure, UsageFailure
from worker.cli.output import emit
from worker.cli.params import RELEASE_ID, Duration, Seconds, gate_spec, json_option
from worker.cli.root import cli
from worker.client import LaneClient
from worker.db.store.rows import ReleaseHold
from worker.errors import counted, printable, shown
from worker.ops.lanes_text import aligned
from worker.ops.releases import GATE_TIMEOUT_S, ReleaseView, RolloutState, gate_word
from worker.ops.report import SCALER_STALE_S, machines_wanted
from worker.scaler.app_check import check_app


@cli.group("releases", invoke_without_command=True)
@json_option
@click.pass_context
def releases_group(ctx: click.Context, as_json: bool) -> None:
    """List the deployed releases: current, superseded, draining, drained.

    `releases deploy` records the current release; `lane-worker scaler` starts its
    machines and, once they are ready, retires the releases it supersedes, then stops
    each retired release's machines when its lane is drained.
    """
    if ctx.invoked_subcommand is not None:
        return

    async def read(client: LaneClient) -> tuple[list[ReleaseView], Any, ReleaseHold | None]:
        views, scaler = await client.releases.list()
        return views, scaler, await client.releases.held()

    views, scaler, hold = with_client(read)
    rows = [["release", "status", "workers", "ready", "scaler", "image"]]
    rows += [
        [
            v.release_id,
            v.status.split(" (")[0],  # its why is a note under the table
            f"{v.live_workers}/{_wanted(v)}",
            str(v.ready_workers),
            _scaler_counts(v.scaler),
            v.image,
        ]
        for v in views
    ]
    scaler_line = (
        "scaler: none has reported"
        if scaler is None
        else f"scaler: {scaler.holder} ({scaler.backend}), last pass {scaler.age_s:.0f} s ago"
    )
    if scaler is not None and scaler.age_s >= SCALER_STALE_S:
        scaler_line += " (none active: the machines it started keep running until one is)"

    seen = None
    if scaler is not None:
        seen = {"holder": scaler.holder, "backend": scaler.backend, "ageSeconds": scaler.age_s}
    report = {
        "releases": [v.as_json() for v in views],
        "scaler": seen,
        "hold": hold.as_json() if hold is not None else None,
    }
    lines = aligned(rows) if views else ["no release deployed yet"]
    held = [] if hold is None else [_hold_line(hold)]
    notes = [_printable(n) for v in views for n in _notes(v, hold is not None)]
    emit(as_json, report, *held, *lines, *notes, *_machine_lines(views), scaler_line)


def _wanted(v: ReleaseView) -> int:
    """How many machines the release should run now (the lanes page counts the same way)."""
    return machines_wanted(v.desired, v.scaler)


def _printable(line: str) -> str:
    return line if line.isprintable() else repr(line)


def _notes(v: ReleaseView, held: bool) -> list[str]:
    """What the table's cells leave out: why a superseded release still claims, and the
    scaler's own words on a release (waiting for ..., a refused boot, an error)."""
    notes = []
    if v.role == "candidate":
        notes.append(f"{v.release_id}: {gate_word(v)}")
    gate = v.gate or {}
    if gate.get("outcome") in ("failed", "abandoned"):
        notes.append(f"{v.release_id}: gate {gate['outcome']}, never current: {gate.get('reason')}")
    elif gate.get("outcome") == "passed":
        plays = ", ".join(str(g.get("play")) for g in gate.get("runs") or [])
        notes.append(f"{v.release_id}: gate passed ({plays})")
    if v.role == "previous":
        why = (
            "the releases are held, so the scaler retires nothing until `lane-worker "
            "releases resume`"
            if held
            else "until the current release's machines are ready; then the scaler retires it"
        )
        notes.append(f"{v.release_id}: superseded, still claiming: {why}")
    said = v.scaler or {}
    words = [str(a) for a in said.get("actions") or [] if str(a).startswith("waiting")]
    failed = said.get("bootFailed")
    if isinstance(failed, dict) and failed.get("inARow"):
        words.append(f"boot failing: {failed['inARow']} in a row exited {failed.get('exitCode')}")
    words += [str(said[k]) for k in ("bootRefused", "error") if said.get(k)]
    notes += [f"{v.release_id}: scaler: {w}" for w in words]
    if v.boot_failed:  # recorded in the store (0047): what submits to its lane are told
        notes.append(
            f"{v.release_id}: BOOT FAILING: {v.boot_failed.get('reason')}; submits to its lane "
            "say served=false until a machine boots (logs: "
            f"{v.boot_failed.get('logs')})"
        )
    return notes


def _hold_line(hold: ReleaseHold) -> str:
    why = f": {hold.reason}" if hold.reason else ""
    line = (
        f"HELD by {hold.held_by} since {hold.held_at:%Y-%m-%d %H:%M:%S %Z}{why} (the scaler "
        "changes no current release; `lane-worker releases resume` ends it)"
    )
    return line if line.isprintable() else repr(line)


def _machine_lines(views: list[ReleaseView]) -> list[str]:
    """Each machine the scaler last listed: its state, health port (the process backend's
    machines each pick a free one) and where its logs are."""
    lines = []
    for v in views:
        ago = v.scaler.get("lastListedSecondsAgo")
        # No active scaler: its machines keep running; said as its last listing.
        when = "" if ago is None else f" (as the scaler last listed it {ago} s ago)"
        for m in v.scaler.get("machines") or []:
            if not isinstance(m, dict):
                continue
            port = f", health port {m['healthPort']}" if m.get("healthPort") else ""
            said = f"{m.get('state')}{when}{port}; logs: {m.get('logs')}"
            line = f"{v.release_id} machine {m.get('id')}: {said}"
            lines.append(line if line.isprintable() else repr(line))
    return lines


def _scaler_counts(said: dict[str, Any]) -> str:
    """The scaler's last count of a release's machines: running, stopping, outdated, unlisted
    (what it says beside them is a note under the table)."""
    if not said or "lastListedSecondsAgo" in said:
        return "-"  # no active scaler: nothing it says now
    parts = [f"{said.get('running', 0)} running"]
    parts += [f"{said[k]} {k}" for k in ("stopping", "outdated", "unlisted") if said.get(k)]
    return ", ".join(parts)


@releases_group.command()
@click.argument("release_id", type=RELEASE_ID)
@click.option("--image", required=True, help="The image (Fly) or app (process backend) to run.")
@click.option(
    "--machines",
    type=click.IntRange(0, 1000),
    default=1,
    show_default=True,
    help="How many machines the release runs.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until its machines are ready and the releases it supersedes are "
    "retired; exit 1 with the reason after --timeout.",
)
@click.option(
    "--timeout",
    type=Seconds(),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long --wait waits.",
)
@click.option(
    "--force", is_flag=True, help="Go ahead even while the releases are held (releases hold)."
)
@click.option(
    "--gate",
    "gates",
    multiple=True,
    metavar="PLAY[=JSON]",
    help="A run of PLAY (with JSON as its input) the scaler submits on the release's lane "
    "once its machines are ready; it becomes current only if every gate run completes "
    "within --gate-timeout, else it is retired and the current release stays. Repeatable.",
)
@click.option(
    "--gate-timeout",
    type=Duration(),
    default=GATE_TIMEOUT_S,
    show_default=True,
    metavar="DURATION",
    help="How long the gate runs have to complete (seconds, or 90s, 5m, 1h).",
)
@click.option(
    "--skip-app-check",
    is_flag=True,
    help="Process backend: deploy without first checking that the app (--image) loads "
    "as the scaler's machines would load it.",
)
@json_option
def deploy(
    release_id: str,
    image: str,
    machines: int,
    wait: bool,
    timeout: float,
    force: bool,
    gates: tuple[str, ...],
    gate_timeout: float,
    skip_app_check: bool,
    as_json: bool,
) -> None:
    """Record RELEASE_ID as the current release, with its image and machine count.

    With --gate it is the candidate: the current release stays current until every
    gate run completes on RELEASE_ID's machines; a gate that fails or times out
    retires RELEASE_ID (its machines go) and --wait exits 1 naming the run.

    With the process backend the app (--image, module:attr) is first loaded in a
    subprocess as the scaler's machines would load it; a deploy whose app does not
    load is refused (exit 2) and nothing is recorded.
    """
    try:
        gate = [gate_spec(g) for g in gates]
    except ValueError as exc:  # InvalidRequestError is one
        raise UsageFailure(f"release {release_id} was not deployed: {exc}") from None
    if gates and not gate_timeout > 0:
        raise UsageFailure(f"--gate-timeout must be above 0 seconds, not {gate_timeout:g}.")
    if gates and machines < 1:
        raise UsageFailure("a gated release needs --machines 1 or more to run its gate on.")
    if not skip_app_check:
        _check_app(release_id, image)
    _record(
        release_id,
        wait,
        timeout,
        as_json,
        lambda c: c.releases.deploy(
            release_id,
            image=image,
            machines=machines,
            force=force,
            gate=gate,
            gate_timeout_s=gate_timeout,
        ),
        warning=_spelling_warning(release_id),
    )


def _spelling_warning(release_id: str) -> str | None:
    """Warn of an id its queue spells otherwise (case, punctuation: ``REL-D`` rides
    ``runs_rel_d``); the lane rules are the TypeScript app's, so it is not refused.
    A ``-`` read as ``_`` is the usual spelling (``rel-42``): not warned of."""
    trimmed = release_id.strip()
    segment = lanes.sanitize_release_segment(trimmed)
    if not segment or segment == trimmed.replace("-", "_"):
        return None
    return (
        f"release id {shown(trimmed)} is spelled {segment!r} in its queue name (lower case, "
        f"each run of other characters one '_'): its runs ride queue "
        f"{lanes.queue_name_for_release(trimmed)}."
    )


@releases_group.command()
@click.argument("release_id", type=RELEASE_ID)
@click.option("--wait", is_flag=True, help="Wait until the rollback is done (see deploy).")
@click.option(
    "--timeout",
    type=Seconds(),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long --wait waits.",
)
@click.option(
    "--force", is_flag=True, help="Go ahead even while the releases are held (releases hold)."
)
@json_option
def rollback(release_id: str, wait: bool, timeout: float, force: bool, as_json: bool) -> None:
    """Make an older release current again (its recorded image and machine count)."""
    _record(
        release_id, wait, timeout, as_json, lambda c: c.releases.rollback(release_id, force=force)
    )


@releases_group.command()
@click.option("--reason", help="Why (shown by `releases` and kept with the hold).")
@json_option
def hold(reason: str | None, as_json: bool) -> None:
    """Hold the releases: the scaler changes no current release until `releases resume`.

    While held the scaler retires nothing a ready release supersedes (it still
    replaces dead machines and stops drained releases' machines), and `releases
    deploy` and `releases rollback` are refused unless --force.
    """
    said = with_client(lambda c: c.releases.hold(reason))
    already = said.pop("already")
    why = f": {said['reason']}" if said.get("reason") else ""
    text = f"releases {'were already' if already else 'are now'} held by {said['heldBy']}{why}."
    if already and (reason or "").strip() and (reason or "").strip() != said.get("reason"):
        text += " Your reason was not kept (the hold keeps its own: resume, then hold again)."
    emit(as_json, {**said, "alreadyHeld": already}, text if text.isprintable() else repr(text))


@releases_group.command()
@json_option
def resume(as_json: bool) -> None:
    """End a hold (`releases hold`): the scaler changes current releases again."""
    ended = with_client(lambda c: c.releases.resume())
    text = "the hold is over." if ended else "the releases were not held: nothing to resume."
    emit(as_json, {"resumed": ended}, text)


def _check_app(release_id: str, image: str) -> None:
    """Refuse the deploy of an app the process backend's machines cannot load."""
    outcome = check_app(image, release_id, with_client(lambda c: c.releases.scaler()))
    if outcome is None:
        return  # no process-backend scaler has reported: nothing to check against
    if outcome.problem:
        # The traceback the sentence points to ("traceback above"), on stderr before it.
        for line in outcome.traceback:
            click.echo(printable(line), err=True)
        raise UsageFailure(
            f"release {release_id} was not deployed: its app {image} does not load as the "
            f"scaler's machines would load it: {outcome.problem}"
        )
    if outcome.cannot:
        raise Failure(
            f"release {release_id} was not deployed: its app {image} cannot be checked here "
            f"({outcome.cannot}); pass --skip-app-check to deploy without the check"
        )


def _redeployed(said: dict[str, Any]) -> str:
    """What deploying the current release again does (the scaler's plan: machines on an
    image it no longer records stop once its count is ready on the new one)."""
    was = said["redeployedFrom"]
    if was["image"] != said["image"]:
        return (
            f"it was already current: same release, new image; its machines on {was['image']} "
            "are replaced by new ones once those are ready."
        )
    if was["desired"] != said["desired"]:
        was_count = was["desired"]
        return (
            f"it was already current, same image: only its machine count changed (was {was_count})."
        )
    return "it was already current with this image and count: nothing changes."


Act = Callable[[LaneClient], Awaitable[dict[str, Any]]]


def _record(
    release_id: str,
    wait: bool,
    timeout: float,
    as_json: bool,
    act: Act,
    warning: str | None = None,
) -> None:
    async def action(client: LaneClient) -> tuple[dict[str, Any], RolloutState]:
        said = await act(client)
        if not wait:
            return said, RolloutState(True, None)
        return said, await client.releases.wait_rolled_out(said["releaseId"], timeout_s=timeout)

    said, state = with_client(action)
    done, reason = state.done, state.reason
    if warning is not None:  # stderr, as submit's; under --json, in the one object
        said["warning"] = warning
        if not as_json:
            click.echo(printable(f"lane-worker: warning: {warning}"), err=True)
    # A rollout that cannot finish (superseded, or nothing to take over with) is
    # said as soon as it is known, not after the timeout.
    previous = ", ".join(said.get("previous") or []) or "none"
    text = [
        f"release {said['releaseId']} is current (queue {said['queue']}, "
        f"{counted(said['desired'], 'machine')}); "
        + (_redeployed(said) if said.get("redeployedFrom") else f"superseded: {previous}.")
    ]
    if said.get("candidate"):
        plays = ", ".join(str(g["play"]) for g in said["gate"])
        current = ", ".join(said.get("current") or []) or "none"
        text = [
            f"release {said['releaseId']} is the candidate (queue {said['queue']}, "
            f"{counted(said['desired'], 'machine')}), gated by {plays} within "
            f"{said['gateTimeoutSeconds']:g} s; current until it passes: {current}."
        ]
    if wait and done:
        ran = (
            "its machines are ready" if said["desired"] else "it runs no machine (deployed with 0)"
        )
        text.append(f"rolled out: {ran} and what it supersedes is retired.")
    # Not rolled out: said once, by the error line below (stderr), not on stdout too.
    emit(as_json, {**said, "rolledOut": done if wait else None, "reason": reason}, *text)
    if not done:
        within = "" if state.final else f" within {timeout:g} s"
        raise Failure(f"release {said['releaseId']} did not roll out{within}: {reason}")
