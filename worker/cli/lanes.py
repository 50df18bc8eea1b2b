"""`lanes`: the drain report, `show`, `wait`, and the remedies retire, activate, move, prune."""

from __future__ import annotations

import asyncio

import click

from worker.cli.connect import with_client
from worker.cli.exits import Failure
from worker.cli.output import emit
from worker.cli.params import (
    RELEASE_ID,
    Duration,
    Seconds,
    force_option,
    json_option,
)
from worker.cli.root import cli
from worker.client import LaneClient, LaneView
from worker.ops.lanes_text import lane_detail, lanes_table

PROGRESS_EVERY_S = 10.0  # a progress line on stderr while `lanes wait` waits


@cli.group("lanes", invoke_without_command=True)
@json_option
@click.pass_context
def lanes_group(ctx: click.Context, as_json: bool) -> None:
    """List release lanes, what each holds and whether its machines may stop.

    A lane is claiming (it takes new runs), draining (retired, still holding
    runs only its release may run: its workers finish them) or drained (retired,
    nothing left for its release: safe to stop its machines). Subcommands show
    one lane, wait for one to drain, retire or activate one.
    """
    if ctx.invoked_subcommand is None:
        views = with_client(lambda client: client.lanes())
        emit(as_json, {"lanes": [v.as_json() for v in views]}, *lanes_table(views))


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@json_option
def show(release_id: str, as_json: bool) -> None:
    """Show one lane in full: workers and their plays, counts, verdict, blockers with run ids."""
    view = with_client(lambda client: client.lane(release_id))
    emit(as_json, view.as_json(), *lane_detail(view))


WAIT_POLL_S = 0.5


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@click.option(
    "--timeout",
    type=Seconds(),
    default=900.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up (exit 1, printing what still blocks) after this long.",
)
@json_option
def wait(release_id: str, timeout: float, as_json: bool) -> None:
    """Wait until RELEASE_ID's lane is drained: exit 0 the moment its machines may stop.

    Exits 1 at once for a lane that still claims (retire it first), and after
    --timeout with the lane's blockers when it did not drain in time.
    """

    async def action(client: LaneClient) -> LaneView:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline, said_at = started + timeout, started
        while True:
            view = await client.lane(release_id)
            if view.safe_to_stop or view.status == "claiming" or loop.time() >= deadline:
                return view
            if loop.time() - said_at >= PROGRESS_EVERY_S:
                # On stderr, so --json stays one object and a CI job with a
                # no-output limit sees the wait is alive.
                said_at = loop.time()
                left = ", ".join(f"{b.reason} {b.count}" for b in view.blocked_by) or "nothing"
                click.echo(
                    f"lanes wait: {view.release_id} still {view.status} after "
                    f"{said_at - started:.0f} s; left: {left}",
                    err=True,
                )
            await asyncio.sleep(min(WAIT_POLL_S, max(0.0, deadline - loop.time())))

    view = with_client(action)
    if view.safe_to_stop:
        emit(
            as_json,
            view.as_json(),
            f"lane {view.queue} (release {view.release_id}) is drained: safe to stop its machines.",
        )
        return
    if as_json:
        emit(True, view.as_json())
    if view.status == "claiming" and view.role == "current":
        raise Failure(
            f"lane {view.queue} (release {view.release_id}) is the current release, so it will "
            "not drain: deploy a newer one (`lane-worker releases deploy`) and the scaler "
            "retires it once that one is ready."
        )
    if view.status == "claiming":
        raise Failure(
            f"lane {view.queue} (release {view.release_id}) still claims new runs, so it will "
            f"not drain: run `lane-worker lanes retire {view.release_id}` first."
        )
    blockers = "; ".join(f"{b.reason} {b.count}" for b in view.blocked_by)
    raise Failure(
        f"lane {view.queue} (release {view.release_id}) is still {view.status} after "
        f"{timeout:g} s ({blockers}); see `lane-worker lanes show {view.release_id}`."
    )


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@force_option
@json_option
def retire(release_id: str, force: bool, as_json: bool) -> None:
    """Mark RELEASE_ID's lane retired; newer releases adopt its parked runs.

    A release id no lane has ever had (no worker registered it, no run used its
    queue) is refused as a likely typo, listing the known lanes; --force creates
    it retired (its machines may not have booted yet).
    """

    async def action(client: LaneClient) -> tuple[str, bool, str]:
        known = await client.lane_known(release_id)
        queue = await client.retire_release(release_id, force=force)
        # Whatever spelling was typed (rel_a), the lane's release id as deployed (rel-a).
        return queue, known, await client.lane_release_id(release_id)

    queue, known, release = with_client(action)
    report = {"releaseId": release, "queue": queue, "status": "retired", "known": known}
    emit(as_json, report, f"retired lane {queue} (release {release}).")


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@force_option
@json_option
def activate(release_id: str, force: bool, as_json: bool) -> None:
    """Mark RELEASE_ID's lane claiming again; its workers may boot.

    A release id no lane has ever had is refused, as by retire, unless --force.
    """

    async def action(client: LaneClient) -> tuple[str, str]:
        queue = await client.activate_release(release_id, force=force)
        return queue, await client.lane_release_id(release_id)  # as deployed

    queue, release = with_client(action)
    report = {"releaseId": release, "queue": queue, "status": "claiming"}
    emit(as_json, report, f"activated lane {queue} (release {release}): claiming again.")


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@click.option(
    "--to",
    "to_release",
    type=RELEASE_ID,
    required=True,
    help="The claiming release whose lane takes the runs.",
)
@json_option
def move(release_id: str, to_release: str, as_json: bool) -> None:
    """Move RELEASE_ID's runs that never started to the lane of release --to.

    One transaction per run. A run that ever started (an attempt, a committed
    step) stays and is listed as refused: its steps ran on the old release's
    code (fail it and retry it instead). Exits 1 when any run was refused.
    """
    report = with_client(lambda client: client.move_lane(release_id, to_release))
    said = [
        f"moved {len(report.moved)} run(s) from {report.from_queue} to {report.to_queue} "
        f"(release {report.to_release_id})."
    ]
    said += [f"  {run_id}" for run_id in report.moved]
    said += [f"refused {run_id}: {why}" for run_id, why in report.refused]
    emit(
        as_json,
        {
            "from": report.from_queue,
            "to": report.to_queue,
            "toReleaseId": report.to_release_id,
            "moved": list(report.moved),
            "refused": [{"runId": r, "reason": w} for r, w in report.refused],
        },
        *said,
    )
    if report.refused:
        raise Failure(
            f"{len(report.refused)} run(s) of {report.from_queue} were not moved "
            "(listed above, each with the reason)."
        )


@lanes_group.command()
@click.option(
    "--older-than",
    "older_than",
    type=Duration(),
    required=True,
    metavar="DURATION",
    help="Only lanes retired longer ago than this (3600, 90m, 24h, 7d).",
)
@click.option("--dry-run", is_flag=True, help="List the lanes that would be pruned; drop nothing.")
@json_option
def prune(older_than: float, dry_run: bool, as_json: bool) -> None:
    """Drop the engine queues of retired lanes that no open run uses; keep their history.

    Many deploys a day leave many retired lanes, each with six engine tables.
    A lane qualifies when it was retired more than --older-than ago, none of
    its runs is open, its queue holds no unfinished task of any kind (a
    sandbox cleanup, another system's task) and no task of another system at
    all, finished or not (the queue is that system's too), and lane-worker
    recorded creating its engine queue (a queue it has no record of creating
    is never dropped: another system's, or one made by an older build or
    inside a savepoint); its lane row and its runs stay.
    `lanes activate` recreates the queue.
    """

    async def pruning(client: LaneClient) -> tuple[list[str], ...]:
        queues = await client.prune_lanes(older_than, dry_run=dry_run)
        live = await client.prune_kept_live(older_than)
        busy = await client.prune_kept_busy(older_than)
        foreign = await client.prune_kept_foreign(older_than)
        return queues, live, busy, foreign, await client.prune_kept_not_ours(older_than)

    queues, kept, busy, foreign, not_ours = with_client(pruning)
    verb = "would prune" if dry_run else "pruned"
    emit(
        as_json,
        {
            "dryRun": dry_run,
            "queues": queues,
            "keptLive": kept,
            "keptBusy": busy,
            "keptForeign": foreign,
            "keptNotOurs": not_ours,
        },
        f"{verb} {len(queues)} lane queue(s).",
        *(f"  {q}" for q in queues),
    )
    if not_ours and not as_json:
        click.echo(
            f"kept {len(not_ours)} drained lane(s) whose engine queue lane-worker has no record "
            "of creating (another system's, such as the TypeScript app's, or one made by a build "
            "before records were kept or inside a savepoint; `lanes prune` never drops it: once "
            "you have checked nothing else uses it, `absurdctl drop-queue QUEUE --yes`): "
            f"{' '.join(not_ours)}",
            err=True,
        )
    if busy and not as_json:
        click.echo(
            f"kept {len(busy)} drained lane(s) whose queue still holds an unfinished task (a "
            "sandbox cleanup, or another system's task: `lanes --json` counts those as "
            f"foreignTasks): {' '.join(busy)}",
            err=True,
        )
    if foreign and not as_json:
        click.echo(
            f"kept {len(foreign)} drained lane(s) whose queue holds tasks lane-worker did not "
            "create (another system's, such as the TypeScript app's, finished ones too: "
            "dropping the queue would drop its history and the queue it spawns on): "
            f"{' '.join(foreign)}",
            err=True,
        )
    if kept and not as_json:
        click.echo(
            f"kept {len(kept)} drained lane(s) whose workers are still live (their loops poll "
            f"the queue): stop their machines, then prune again: {' '.join(kept)}",
            err=True,
        )
