"""Commands on runs: submit, signal, cancel, status, and `runs` (list, fail, retry)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
from click.core import ParameterSource

from worker.cli.bulk import read_submits, submit_from
from worker.cli.connect import with_client
from worker.cli.exits import Failure
from worker.cli.output import cell, columns, emit, one_line
from worker.cli.params import (
    EVENT_KEY,
    IDEMPOTENCY_KEY,
    INPUT,
    PAYLOAD,
    PLAY,
    RELEASE_ID,
    RUNTIME_API,
    SUFFIX,
    TEXT,
    Seconds,
    json_option,
)
from worker.cli.root import cli
from worker.client import SUBMIT_VARIABLES, LaneClient, RunReport
from worker.config import settings
from worker.errors import printable
from worker.jsonvalue import unreadable_in
from worker.ops.lanes_text import aligned
from worker.ops.remedies import MAX_LIST, STATUS_FILTERS


@cli.command()
@click.argument("play", type=PLAY, required=False)
@click.option("--from", "from_file", metavar="FILE|-",
              help="Submit one run per line of FILE (- for stdin), all in one transaction: "
                   "each line a JSON object with play, and optionally input, "
                   "idempotencyKey, queueSuffix, runtimeApi. Prints one run id per line "
                   "(--json: {\"runs\": [...]}); a bad line is refused by its number and "
                   "nothing is submitted.")  # fmt: skip
@click.option("--input", "input_", type=INPUT, metavar="JSON|@FILE|-",
              help="The play's input: a JSON object inline, from @FILE, or - for stdin "
                   "(default {}; at most 1 MiB).")  # fmt: skip
@click.option("--idempotency-key", type=IDEMPOTENCY_KEY, metavar="KEY",
              help="At most one run per KEY (at most 255 characters).")  # fmt: skip
@click.option("--queue-suffix", type=SUFFIX, help="Submit to this suffix's dev lane instead.")
@click.option("--runtime-api", type=RUNTIME_API, metavar="@FILE|-",
              help="Deliver the run's ledger facts to this runtime API: a JSON object with "
                   "baseUrl and executorToken (integrationMode, vercelProtectionBypassToken, "
                   "runtimeTestFaultHeader optional). Pass it as @FILE or - (stdin): it "
                   "holds a token, which a command line shows to every user of the "
                   "machine.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Wait for the end; exit 1 unless it completed.")
@click.option("--timeout", type=Seconds(), default=300.0,
              show_default=True, metavar="SECONDS", help="How long --wait waits.")  # fmt: skip
@json_option
@click.pass_context
def submit(ctx: click.Context, play: str | None, from_file: str | None, input_: Any,
           idempotency_key: str | None, queue_suffix: str | None,
           runtime_api: dict[str, Any] | None, wait: bool, timeout: float,
           as_json: bool) -> None:  # fmt: skip
    """Submit a run of PLAY on this release's lane and print its run id (or runs: --from)."""
    if from_file is not None:
        given = [name for name, value in (
            ("PLAY", play), ("--input", input_), ("--idempotency-key", idempotency_key),
            ("--queue-suffix", queue_suffix), ("--runtime-api", runtime_api),
            ("--wait", wait or None),
        ) if value is not None]  # fmt: skip
        if given:
            raise click.UsageError(
                f"--from takes every submit from its lines, not from {', '.join(given)}: "
                "each line holds play, input, idempotencyKey, queueSuffix, runtimeApi."
            )
        _submit_from(from_file, as_json)
        return
    if play is None:
        raise click.UsageError("Missing argument 'PLAY' (or --from FILE).")
    if not wait and ctx.get_parameter_source("timeout") is not ParameterSource.DEFAULT:
        raise click.UsageError("--timeout only applies together with --wait.")

    async def action(client: LaneClient) -> tuple[dict[str, Any], RunReport | None]:
        run = await client.submit(
            play, input_, idempotency_key=idempotency_key, queue_suffix=queue_suffix,
            runtime_api=runtime_api,
        )  # fmt: skip
        if not as_json:
            click.echo(run.run_id)  # before waiting, so an operator can follow the run
        report = dict(runId=run.run_id, releaseId=run.release_id, queue=run.queue,
                      created=run.created)  # fmt: skip
        return report, (await client.wait(run.run_id, timeout) if wait else None)

    check = (settings.MAX_ATTEMPTS_ENV,) if queue_suffix else SUBMIT_VARIABLES
    report, final = with_client(action, check=check)
    if final is None:
        if as_json:
            emit(True, report)
        return
    report |= dict(status=final.status, output=final.output, error=final.error,
                   timedOut=not final.finished)  # fmt: skip
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
    own_lane = any(r.queue_suffix is None for r in requests)
    check = SUBMIT_VARIABLES if own_lane else (settings.MAX_ATTEMPTS_ENV,)
    made = with_client(lambda client: submit_from(client, source, numbers, requests), check=check)
    reports = [dict(runId=run.run_id, releaseId=run.release_id, queue=run.queue,
                    created=run.created) for run in made]  # fmt: skip
    if as_json:
        emit(True, {"runs": reports})
    elif made:
        emit(False, None, *(run.run_id for run in made))


@cli.command()
@click.argument("run_id")
@click.argument("event_key", type=EVENT_KEY)
@click.option("--data", type=PAYLOAD, metavar="JSON|@FILE|-",
              help="The event's payload: JSON inline, from @FILE, or - for stdin "
                   "(default null).")  # fmt: skip
@json_option
def signal(run_id: str, event_key: str, data: Any, as_json: bool) -> None:
    """Deliver integration event EVENT_KEY to a run (first wins)."""
    result = with_client(lambda client: client.signal(run_id, event_key, data))
    report = {
        "runId": result.run_id,
        "eventKey": event_key,
        "duplicate": result.duplicate,
        "runEnded": result.run_ended,
        "deliveredTo": result.delivered_to,
        "keptForRetry": result.kept_for_retry,
    }
    to = result.delivered_to
    via = f"run {to}, the retry of run {result.run_id}" if to != result.run_id else f"run {to}"
    if result.duplicate:
        text = f"ignored: {via} already has event {event_key!r} (first signal wins)."
    elif result.kept_for_retry:
        text = (
            f"kept: {via} has already ended ({result.run_ended}), so nothing waits for "
            f"{event_key!r} now; a retry of it (lane-worker runs retry {to}) receives it."
        )
    elif result.run_ended is not None:
        text = (
            f"ignored: run {result.run_id} has already ended ({result.run_ended}); "
            f"nothing waits for {event_key!r}."
        )
    else:
        text = f"delivered event {event_key!r} to {via}."
    emit(as_json, report, text)


@cli.command()
@click.argument("run_id")
@click.option("--reason", type=TEXT, help="Why: recorded in the run's run.cancelled fact.")
@json_option
def cancel(run_id: str, reason: str | None, as_json: bool) -> None:
    """Cancel a run (a finished run is left as it is)."""

    async def action(client: LaneClient) -> tuple[bool, RunReport]:
        cancelled = await client.cancel(run_id, reason=reason)
        return cancelled, await client.status(run_id)

    cancelled, now = with_client(action)
    report = {"runId": now.run_id, "cancelled": cancelled, "status": now.status}
    said = "cancelled run" if cancelled else f"nothing to cancel: already {now.status}, run"
    emit(as_json, report, f"{said} {now.run_id}.")


@cli.command("runner-result")
@click.argument("run_id")
@click.argument("runner_attempt", type=click.IntRange(min=1), metavar="ATTEMPT")
@click.option("--data", type=PAYLOAD, metavar="JSON|@FILE|-",
              help="What the runner came to: JSON inline, from @FILE, or - for stdin "
                   "(default null).")  # fmt: skip
@json_option
def runner_result(run_id: str, runner_attempt: int, data: Any, as_json: bool) -> None:
    """Record the result of detached runner ATTEMPT of a run (ctx.run_detached) and wake it."""
    said = with_client(lambda client: client.report_runner_result(run_id, runner_attempt, data))
    if said.woke:
        text = f"recorded: run {said.run_id} resumes from runner attempt {runner_attempt}."
    elif said.duplicate:
        text = f"ignored: runner attempt {runner_attempt} of run {said.run_id} reported already."
    else:
        text = (
            f"recorded and ignored: nothing waits for runner attempt {runner_attempt} of run "
            f"{said.run_id} ({said.reason})."
        )
    emit(as_json, said.as_json(), text)


@cli.command()
@click.argument("run_id")
@json_option
def status(run_id: str, as_json: bool) -> None:
    """Show a run's status, release, queue, attempts and result."""
    now = with_client(lambda client: client.status(run_id))
    rows = [
        ("run", now.run_id),
        ("play", now.play),
        ("status", now.status),
        ("release", now.release_id),
        ("adopted release", now.adopted_release_id or "(none)"),
        ("queue", now.queue),
        ("attempts", _attempts_line(now.attempts)),
    ]
    for a in now.attempts:
        did = f"{a.disposition} by {a.worker_id} (release {a.release_id})"
        rows.append((f"  #{a.attempt}", f"{did} -> {a.outcome or 'in progress'}"))
    for step in now.steps:
        by = f"release {step.release_id} (attempt #{step.attempt})" if step.release_id else "?"
        rows.append((f"  step {step.name}", f"committed by {by}"))
    if now.retry_of is not None:
        rows.append(("retry of", now.retry_of))
    if now.output is not None:
        rows.append(("output", unreadable_in("the output", now.output)
                     or json.dumps(now.output, default=str)))  # fmt: skip
    if now.error is not None:
        rows.append(("error", unreadable_in("the error", now.error)
                     or one_line(now.error, limit=2000)))  # fmt: skip
    for fact in now.ledger:
        delivery = fact.get("delivery")
        said = "recorded" if delivery is None else _delivery_line(delivery)
        rows.append((f"  fact {fact['type']}", said))
    emit(as_json, now.as_json(), *columns(rows))


def _delivery_line(delivery: dict[str, Any]) -> str:
    state, tries = delivery["state"], delivery["attempts"]
    if state == "delivered":
        return f"delivered to the runtime API ({tries} {'try' if tries == 1 else 'tries'})"
    error = delivery.get("error") or {}
    if isinstance(error, dict):
        why = (
            error.get("reason")
            or error.get("error")
            or (f"HTTP {error['status']}" if "status" in error else None)
        )
    else:  # stored JSON of another shape, or none Python can read
        why = unreadable_in("the delivery error", error) or one_line(error)
    if state == "failed":
        return f"delivery given up after {tries}: {why or 'no reason recorded'}"
    return f"delivery pending ({tries} tries so far{f', last: {why}' if why else ''})"


def _attempts_line(claims: Sequence[Any]) -> str:
    """Count the claims that ran the play; a defer or a refusal spends no attempt."""
    ran = sum(1 for a in claims if a.disposition in ("own", "adopt"))
    back = len(claims) - ran
    if not claims:
        return "(none yet)"
    return f"{ran}" + (f" (and {back} claim(s) put back without an attempt)" if back else "")


@cli.group("runs", invoke_without_command=True)
@click.option("--status", type=click.Choice(STATUS_FILTERS),
              help="Only runs with this status (open: every run not finished).")  # fmt: skip
@click.option("--lane", type=RELEASE_ID, metavar="RELEASE",
              help="Only runs of this release's lane (its own and those it adopted).")  # fmt: skip
@click.option("--play", type=PLAY, help="Only runs of this play.")
@click.option("--limit", type=click.IntRange(1, MAX_LIST), default=50, show_default=True,
              help="List at most this many runs.")  # fmt: skip
@json_option
@click.pass_context
def runs_group(ctx: click.Context, status: str | None, lane: str | None, play: str | None,
               limit: int, as_json: bool) -> None:  # fmt: skip
    """List runs, newest first; or fail or retry one."""
    if ctx.invoked_subcommand is not None:
        return
    found = with_client(
        lambda client: client.runs(status=status, lane=lane, play=play, limit=limit)
    )
    rows = [("RUN", "PLAY", "STATUS", "RELEASE", "QUEUE", "ATTEMPTS", "CREATED")]
    # A play name is the app's text: one with a line break must not split its row,
    # nor a 100,000-character one pad every line (cut, and shown as repr if not printable).
    rows += [(r.run_id, cell("play", r.play), r.status, cell("release", r.release_id),
              cell("queue", r.queue), str(r.attempts),
              r.created_at.isoformat(timespec="seconds")) for r in found]  # fmt: skip
    lines = aligned(rows)
    emit(as_json, {"runs": [r.as_json() for r in found]},
          *(lines if found else ["no runs match."]))  # fmt: skip


@runs_group.command("fail")
@click.argument("run_id")
@click.option("--reason", type=TEXT, required=True, help="Why: stored as the run's error.")
@json_option
def fail_run(run_id: str, reason: str, as_json: bool) -> None:
    """Fail a run for good (one run.failed fact); a running attempt stops at its next step."""
    failed = with_client(lambda client: client.fail_run(run_id, reason))
    said = f"failed run {run_id}." if failed else f"nothing to fail: run {run_id} had ended."
    emit(as_json, {"runId": run_id, "failed": failed}, said)


@runs_group.command("retry")
@click.argument("run_id")
@click.option("--to", "to_release", type=RELEASE_ID, metavar="RELEASE",
              help="Retry on this claiming release (default: the newest claiming release "
                   "with a live worker that registers the play).")  # fmt: skip
@click.option("--completed", is_flag=True,
              help="Also retry a run that completed (its work runs again).")  # fmt: skip
@click.option("--drop-unreadable-signals", is_flag=True,
              help="Leave out the events whose stored payload cannot be read (else the "
                   "retry is refused); the retry waits for them again.")  # fmt: skip
@json_option
def retry_run(
    run_id: str, to_release: str | None, completed: bool, drop_unreadable_signals: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Submit a new run with an ended run's play and input, on a release that can run it.

    Refused while the run is open or an attempt of it may still execute a step,
    and for a completed run without --completed. The new run's retryOf names the
    old one, and it receives the events the old one had; refused when one of their
    payloads cannot be read back, unless --drop-unreadable-signals. A run is
    retried once: asked again, this prints the existing retry (``created`` false).
    """
    retried = with_client(
        lambda client: client.retry_run(
            run_id, to_release=to_release, completed=completed,
            drop_unreadable_signals=drop_unreadable_signals,
        )
    )  # fmt: skip
    report = {"runId": retried.run_id, "releaseId": retried.release_id, "queue": retried.queue,
              "retryOf": retried.retry_of, "created": retried.created,
              "status": retried.status,
              "droppedSignals": list(retried.dropped_signals)}  # fmt: skip
    if retried.dropped_signals and not as_json:
        keys = ", ".join(repr(k) for k in retried.dropped_signals)
        click.echo(printable(
            f"lane-worker: left out event(s) {keys}, whose payload cannot be read; the retry "
            f"waits for them again (lane-worker signal {retried.retry_of} KEY ...)."
        ), err=True)  # fmt: skip
    if not retried.created and not as_json:
        # stdout stays the retry's id, as for a new one: scripts read it.
        ended = retried.status in ("completed", "failed", "cancelled")
        again = (f" To run it again, retry {retried.run_id}." if ended
                 else " It has not ended: nothing to retry yet.")  # fmt: skip
        click.echo(printable(
            f"lane-worker: run {run_id.strip()} was already retried; its latest retry is run "
            f"{retried.run_id} (release {retried.release_id}, {retried.status}); nothing "
            f"submitted.{again}"
        ), err=True)  # fmt: skip
    emit(as_json, report, retried.run_id)
