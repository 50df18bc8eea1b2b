"""Commands on runs: signal, cancel, status, and `runs` (list, fail, retry); `submit.py` submits."""

from __future__ import annotations

import json
from typing import Any

import click

from worker.cli.connect import with_client
from worker.cli.output import cell, columns, emit, one_line
from worker.cli.params import (
    EVENT_KEY,
    PAYLOAD,
    PLAY,
    RELEASE_ID,
    RUN_ID,
    TEXT,
    json_option,
)
from worker.cli.root import cli
from worker.client import AttemptView, LaneClient, RunReport
from worker.errors import printable
from worker.jsonvalue import unreadable_in
from worker.ops.lanes_text import aligned
from worker.ops.remedies import MAX_LIST, STATUS_FILTERS
from worker.ops.run_view import claims_line, waits_line


@cli.command()
@click.argument("run_id", type=RUN_ID)
@click.argument("event_key", type=EVENT_KEY)
@click.option(
    "--data",
    type=PAYLOAD,
    metavar="JSON|@FILE|-",
    help="The event's payload: JSON inline, from @FILE, or - for stdin (default null).",
)
@json_option
def signal(run_id: str, event_key: str, data: Any, as_json: bool) -> None:
    """Deliver integration event EVENT_KEY to a run (first wins)."""

    async def action(client: LaneClient) -> tuple[Any, str | None]:
        said = await client.signal(run_id, event_key, data)
        waits = (await client.status(said.delivered_to)).waits_for if said.delivered_to else None
        key = (
            (waits or {}).get("eventKey")
            if (waits or {}).get("kind") == "integration_event"
            else None
        )
        return said, key if key is not None and key != event_key else None

    result, other_key = with_client(action)
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
        if other_key is not None:
            # Kept for a later wait on that key, but it wakes nothing now: say so.
            text += (
                f" The run waits for event {other_key!r}, not {event_key!r}: it stays parked"
                " (is the key misspelled?)."
            )
            report["waitsForEvent"] = other_key
    emit(as_json, report, text)


@cli.command()
@click.argument("run_id", type=RUN_ID)
@click.option("--reason", type=TEXT, help="Why: recorded in the run's run.cancelled fact.")
@json_option
def cancel(run_id: str, reason: str | None, as_json: bool) -> None:
    """Cancel a run (a finished run is left as it is)."""

    async def action(client: LaneClient) -> tuple[bool, RunReport]:
        cancelled = await client.remedies.cancel_run(run_id, reason=reason, source="operator")
        return cancelled, await client.status(run_id)

    cancelled, now = with_client(action)
    report = {"runId": now.run_id, "cancelled": cancelled, "status": now.status}
    said = "cancelled run" if cancelled else f"nothing to cancel: already {now.status}, run"
    emit(as_json, report, f"{said} {now.run_id}.")


@cli.command("runner-result")
@click.argument("run_id", type=RUN_ID)
@click.argument("runner_attempt", type=click.IntRange(min=1), metavar="ATTEMPT")
@click.option(
    "--data",
    type=PAYLOAD,
    metavar="JSON|@FILE|-",
    help="What the runner came to: JSON inline, from @FILE, or - for stdin (default null).",
)
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
@click.argument("run_id", type=RUN_ID)
@json_option
def status(run_id: str, as_json: bool) -> None:
    """Show a run's status, release, queue, attempts spent, claims and result."""
    now = with_client(lambda client: client.status(run_id))
    rows = [
        ("run", now.run_id),
        ("play", now.play),
        ("status", now.status),
        ("release", now.release_id),
        ("adopted release", now.adopted_release_id or "(none)"),
        ("queue", now.queue),
        *([("waits for", waits_line(now.waits_for))] if now.waits_for else []),
        # Attempts spent as `runs` and the run page count them; each claim below.
        ("attempts", _attempts_line(now)),
        ("claims", claims_line((a.disposition, a.attempt) for a in now.claims)),
    ]
    for n, a in enumerate(now.claims, start=1):
        rows += _claim_rows(a.claim or n, a)
    for step in now.steps:
        by = f"release {step.release_id} (attempt {step.attempt})" if step.release_id else "?"
        # A durable wait (an event's, a runner's, a sleep's) ends once: listed as a step is.
        kind = "step" if step.name.startswith("step:") else "wait"
        rows.append((f"  {kind} {step.name}", f"committed by {by}"))
    if now.retry_of is not None:
        rows.append(("retry of", now.retry_of))
    if now.output is not None:
        rows.append(
            (
                "output",
                unreadable_in("the output", now.output) or json.dumps(now.output, default=str),
            )
        )
    if now.error is not None:
        rows.append(
            ("error", unreadable_in("the error", now.error) or one_line(now.error, limit=2000))
        )
    for fact in now.ledger:
        delivery = fact.get("delivery")
        said = "recorded" if delivery is None else _delivery_line(delivery)
        rows.append((f"  fact {fact['type']}", said))
    emit(as_json, now.as_json(), *columns(rows), *_traceback_lines(now.error))


def _claim_rows(n: int, a: AttemptView) -> list[tuple[str, str]]:
    """One claim, numbered once (``attempt`` is the engine's, which a put-back or a
    resumed park repeats), and what it stored: a put-back's reason, a failure's error."""
    ran = a.disposition in ("own", "adopt")
    where = f"release {a.release_id}" + (f", machine {a.machine_id}" if a.machine_id else "")
    did = f"{a.disposition} by {a.worker_id} ({where})"
    said = f"{f'attempt {a.attempt}: ' if ran else ''}{did} -> {a.outcome or 'in progress'}"
    rows = [(f"  claim {n}", said)]
    error = a.error
    unreadable = unreadable_in("the claim's error", error)
    if unreadable is not None:
        rows.append(("    error", unreadable))
    elif isinstance(error, dict) and isinstance(error.get("reason"), str):
        rows.append(("    reason", one_line(error["reason"], limit=1000)))
    elif isinstance(error, dict) and isinstance(error.get("name"), str):
        rows.append(("    error", f"{error['name']}: {one_line(error, limit=1000)}"))
    elif error is not None:
        rows.append(("    error", one_line(error, limit=1000)))
    return rows


def _traceback_lines(error: Any) -> list[str]:
    """The failure's traceback (stored bounded and masked), indented under its own heading."""
    text = error.get("traceback") if isinstance(error, dict) else None
    if not isinstance(text, str):  # none kept (an older build, an operator's fail)
        return []
    # A line of the app's text with a control character must not drive the terminal.
    lines = (line if line.isprintable() else repr(line)[1:-1] for line in text.splitlines())
    return ["traceback", *(f"  {line}" for line in lines)]


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


def _attempts_line(now: RunReport) -> str:
    """The engine attempts the run spent, of its most (a park and its resume are one)."""
    of = f" of {now.max_attempts}" if now.max_attempts is not None else ""
    return f"{now.attempt_count}{of}"


@cli.group("runs", invoke_without_command=True)
@click.option(
    "--status",
    type=click.Choice(STATUS_FILTERS),
    help="Only runs with this status (open: every run not finished).",
)
@click.option(
    "--lane",
    type=RELEASE_ID,
    metavar="RELEASE",
    help="Only runs of this release's lane (its own and those it adopted).",
)
@click.option("--play", type=PLAY, help="Only runs of this play.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST),
    default=50,
    show_default=True,
    help="List at most this many runs.",
)
@json_option
@click.pass_context
def runs_group(
    ctx: click.Context,
    status: str | None,
    lane: str | None,
    play: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List runs, newest first; or fail or retry one."""
    if ctx.invoked_subcommand is not None:
        return
    found = with_client(
        lambda client: client.runs(status=status, lane=lane, play=play, limit=limit)
    )
    rows = [("RUN", "PLAY", "STATUS", "RELEASE", "QUEUE", "ATTEMPTS", "CREATED")]
    # A play name is the app's text: one with a line break must not split its row,
    # nor a 100,000-character one pad every line (cut, and shown as repr if not printable).
    rows += [
        (
            r.run_id,
            cell("play", r.play),
            r.status,
            cell("release", r.release_id),
            cell("queue", r.queue),
            str(r.attempts),
            r.created_at.isoformat(timespec="seconds"),
        )
        for r in found
    ]
    lines = aligned(rows)
    emit(as_json, {"runs": [r.as_json() for r in found]}, *(lines if found else ["no runs match."]))


@runs_group.command("fail")
@click.argument("run_id", type=RUN_ID)
@click.option("--reason", type=TEXT, required=True, help="Why: stored as the run's error.")
@json_option
def fail_run(run_id: str, reason: str, as_json: bool) -> None:
    """Fail a run for good (one run.failed fact); a running attempt stops at its next step."""
    failed = with_client(lambda client: client.fail_run(run_id, reason))
    said = f"failed run {run_id}." if failed else f"nothing to fail: run {run_id} had ended."
    emit(as_json, {"runId": run_id, "failed": failed}, said)


@runs_group.command("retry")
@click.argument("run_id", type=RUN_ID)
@click.option(
    "--to",
    "to_release",
    type=RELEASE_ID,
    metavar="RELEASE",
    help="Retry on this claiming release (default: a dev lane's run on its own dev "
    "lane; a release's run on the newest claiming release with a live worker that "
    "registers the play, never a dev lane).",
)
@click.option(
    "--completed", is_flag=True, help="Also retry a run that completed (its work runs again)."
)
@click.option(
    "--drop-unreadable-signals",
    is_flag=True,
    help="Leave out the events whose stored payload cannot be read (else the "
    "retry is refused); the retry waits for them again.",
)
@json_option
def retry_run(
    run_id: str,
    to_release: str | None,
    completed: bool,
    drop_unreadable_signals: bool,
    as_json: bool,
) -> None:
    """Submit a new run with an ended run's play and input, on a release that can run it.

    Refused while the run is open or an attempt of it may still execute a step,
    and for a completed run without --completed. The new run's retryOf names the
    old one, and it receives the events the old one had; refused when one of their
    payloads cannot be read back, unless --drop-unreadable-signals. A run is
    retried once: asked again, this prints the existing retry (``created`` false).
    """
    retried = with_client(
        lambda client: client.retry_run(
            run_id,
            to_release=to_release,
            completed=completed,
            drop_unreadable_signals=drop_unreadable_signals,
        )
    )
    report = {
        "runId": retried.run_id,
        "releaseId": retried.release_id,
        "queue": retried.queue,
        "retryOf": retried.retry_of,
        "created": retried.created,
        "status": retried.status,
        "droppedSignals": list(retried.dropped_signals),
    }
    if retried.dropped_signals and not as_json:
        keys = ", ".join(repr(k) for k in retried.dropped_signals)
        click.echo(
            printable(
                f"lane-worker: left out event(s) {keys}, whose payload cannot be read; the retry "
                f"waits for them again (lane-worker signal {retried.retry_of} KEY ...)."
            ),
            err=True,
        )
    if not retried.created and not as_json:
        # stdout stays the retry's id, as for a new one: scripts read it.
        ended = retried.status in ("completed", "failed", "cancelled")
        again = (
            f" To run it again, retry {retried.run_id}."
            if ended
            else " It has not ended: nothing to retry yet."
        )
        click.echo(
            printable(
                f"lane-worker: run {run_id.strip()} was already retried; its latest retry is run "
                f"{retried.run_id} (release {retried.release_id}, {retried.status}); nothing "
                f"submitted.{again}"
            ),
            err=True,
        )
    elif not as_json:  # where it went, beside the id scripts read from stdout
        click.echo(
            printable(
                f"lane-worker: retried run {run_id.strip()} as run {retried.run_id} on release "
                f"{retried.release_id} (queue {retried.queue})."
            ),
            err=True,
        )
    emit(as_json, report, retried.run_id)
