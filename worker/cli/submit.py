"""The ``submit`` command: one run of a play, or every line of a file (``--from``)."""

from __future__ import annotations

import json
from typing import Any

import click
from click.core import ParameterSource

from worker import lanes
from worker.cli.bulk import read_submits, submit_from
from worker.cli.connect import with_client
from worker.cli.exits import Failure
from worker.cli.output import emit, one_line
from worker.cli.params import (
    IDEMPOTENCY_KEY,
    INPUT,
    PLAY,
    RELEASE_ID,
    RUNTIME_API,
    SUFFIX,
    Seconds,
    json_option,
)
from worker.cli.root import cli
from worker.client import SUBMIT_VARIABLES, LaneClient, RunReport, SubmittedRun
from worker.config import settings
from worker.errors import printable
from worker.limits import MAX_ATTEMPTS


@cli.command()
@click.argument("play", type=PLAY, required=False)
@click.option(
    "--from",
    "from_file",
    metavar="FILE|-",
    help="Submit one run per line of FILE (- for stdin), all in one transaction: "
    "each line a JSON object with play, and optionally input, "
    "idempotencyKey, queueSuffix, runtimeApi, releaseId, maxAttempts. Prints one run id per line "
    '(--json: {"runs": [...]}); a bad line is refused by its number and '
    "nothing is submitted.",
)
@click.option(
    "--input",
    "input_",
    type=INPUT,
    metavar="JSON|@FILE|-",
    help="The play's input: a JSON object inline, from @FILE, or - for stdin "
    "(default {}; at most 1 MiB).",
)
@click.option(
    "--idempotency-key",
    type=IDEMPOTENCY_KEY,
    metavar="KEY",
    help="At most one run per KEY (at most 255 characters).",
)
@click.option("--queue-suffix", type=SUFFIX, help="Submit to this suffix's dev lane instead.")
@click.option(
    "--release",
    "release_id",
    type=RELEASE_ID,
    metavar="RELEASE",
    help="Submit to this release's lane instead of this process's "
    "(DEEPLINE_RUNTIME_DEPLOY_VERSION's); not with --queue-suffix.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, MAX_ATTEMPTS),
    metavar="N",
    help=f"This run's attempts, 1..{MAX_ATTEMPTS} (default LANE_WORKER_MAX_ATTEMPTS, 5).",
)
@click.option(
    "--runtime-api",
    type=RUNTIME_API,
    metavar="@FILE|-",
    help="Deliver the run's ledger facts to this runtime API: a JSON object with "
    "baseUrl and executorToken (integrationMode, vercelProtectionBypassToken, "
    "runtimeTestFaultHeader optional). Pass it as @FILE or - (stdin): it "
    "holds a token, which a command line shows to every user of the "
    "machine.",
)
@click.option("--wait", is_flag=True, help="Wait for the end; exit 1 unless it completed.")
@click.option(
    "--timeout",
    type=Seconds(),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="How long --wait waits.",
)
@json_option
@click.pass_context
def submit(
    ctx: click.Context,
    play: str | None,
    from_file: str | None,
    input_: Any,
    idempotency_key: str | None,
    queue_suffix: str | None,
    release_id: str | None,
    max_attempts: int | None,
    runtime_api: dict[str, Any] | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Submit a run of PLAY on this release's lane and print its run id (or runs: --from)."""
    if from_file is not None:
        given = [
            name
            for name, value in (
                ("PLAY", play),
                ("--input", input_),
                ("--idempotency-key", idempotency_key),
                ("--queue-suffix", queue_suffix),
                ("--release", release_id),
                ("--max-attempts", max_attempts),
                ("--runtime-api", runtime_api),
                ("--wait", wait or None),
            )
            if value is not None
        ]
        if given:
            raise click.UsageError(
                f"--from takes every submit from its lines, not from {', '.join(given)}: "
                "each line holds play, input, idempotencyKey, queueSuffix, runtimeApi, "
                "releaseId, maxAttempts."
            )
        _submit_from(from_file, as_json)
        return
    if play is None:
        raise click.UsageError("Missing argument 'PLAY' (or --from FILE).")
    if release_id is not None and queue_suffix is not None:
        raise click.UsageError("--release and --queue-suffix each name the lane: pass one.")
    if not wait and ctx.get_parameter_source("timeout") is not ParameterSource.DEFAULT:
        raise click.UsageError("--timeout only applies together with --wait.")

    async def action(client: LaneClient) -> tuple[dict[str, Any], RunReport | None]:
        run = await client.submit(
            play,
            input_,
            idempotency_key=idempotency_key,
            queue_suffix=queue_suffix,
            runtime_api=runtime_api,
            release_id=release_id,
            max_attempts=max_attempts,
        )
        if not as_json:
            click.echo(run.run_id)  # before waiting, so an operator can follow the run
            if not run.created:  # stderr: `RUN=$(lane-worker submit ...)` reads only the id
                click.echo(
                    f"lane-worker: note: the idempotency key names run {run.run_id}, submitted "
                    "before with this request: nothing new was submitted.",
                    err=True,
                )
            warn_unserved([run])
        return run.as_json(), (await client.wait(run.run_id, timeout) if wait else None)

    check = _read_variables(
        own_lane=queue_suffix is None and release_id is None, own_attempts=max_attempts is None
    )
    report, final = with_client(action, check=check)
    if final is None:
        if as_json:
            emit(True, report)
        return
    report |= dict(
        status=final.status, output=final.output, error=final.error, timedOut=not final.finished
    )
    done = final.status == "completed"
    output = [f"output: {json.dumps(final.output, default=str)}"] if done else []
    emit(as_json, report, f"status: {final.status}", *output)
    if not final.finished:
        raise Failure(
            f"run {final.run_id} did not finish within {timeout:g} s; it is {final.status} "
            "and goes on (see lane-worker status)."
        )
    if not done:
        why = f": {one_line(final.error)}" if final.error is not None else "."
        raise Failure(f"run {final.run_id} {final.status}{why}")


def _submit_from(source: str, as_json: bool) -> None:
    numbers, requests = read_submits(source)
    check = _read_variables(
        own_lane=any(r.queue_suffix is None and r.release_id is None for r in requests),
        own_attempts=any(r.max_attempts is None for r in requests),
    )
    made = with_client(lambda client: submit_from(client, source, numbers, requests), check=check)
    if as_json:
        emit(True, {"runs": [run.as_json() for run in made]})
    elif made:
        emit(False, None, *(run.run_id for run in made))
        warn_unserved(made)


def _read_variables(*, own_lane: bool, own_attempts: bool) -> tuple[str, ...]:
    """The variables a submit reads (refused when unusable): an explicit lane or attempt
    budget stands for its variable, which is then neither read nor checked."""
    return tuple(
        name
        for name in SUBMIT_VARIABLES
        if (name != lanes.RELEASE_ID_ENV or own_lane)
        and (name != settings.MAX_ATTEMPTS_ENV or own_attempts)
    )


def warn_unserved(runs: list[SubmittedRun]) -> None:
    """Say on stderr each warning the submits were answered with, once each: nothing
    serves a lane, or none of its live workers registers a play (the run ids stay on
    stdout; the runs are accepted all the same)."""
    said: set[str] = set()
    for run in runs:
        if run.warning is not None and run.warning not in said:
            said.add(run.warning)
            click.echo(printable(f"lane-worker: warning: {run.warning}"), err=True)
