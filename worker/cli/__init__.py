"""The ``lane-worker`` command line: a thin shell over settings, client and supervisor.

Every database command goes through ``_with_client``: it checks the environment
the client needs, connects, runs one async action and maps what can go wrong to
an exit code and one sentence on stderr (0 ok, 1 failure, 2 usage, 78 config).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import asyncpg
import click
import structlog
from click.core import ParameterSource

from worker import lanes, limits
from worker.client import CONNECT_VARIABLES, SUBMIT_VARIABLES, LaneClient, LaneView, RunStatus
from worker.config import dburl, settings
from worker.db.pool import is_transient
from worker.db.store import MigrationReport
from worker.errors import (
    SHOWN_CHARS,
    EngineSchemaError,
    InvalidRequestError,
    LaneConfigError,
    LaneWorkerError,
    StoreSchemaError,
    printable,
)
from worker.ops.remedies import MAX_LIST, STATUSES
from worker.ops.report import aligned, lane_detail, lanes_table

T = TypeVar("T")
DEFAULT_APP = "worker.demo:app"
# The CLI answers within seconds when the database is away; the daemon waits longer.
CONNECT_RETRY_S = 10.0


_MISSING_SCHEMA = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedFunctionError,
    asyncpg.InvalidSchemaNameError,
)


class Failure(click.ClickException):
    """A command failed: one sentence on stderr, prefixed ``lane-worker:``; exit 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(printable(f"lane-worker: {self.format_message()}"), err=True)


class UsageFailure(Failure):
    """The request itself is unusable (exit 2), found after the command line parsed."""

    exit_code = 2


class ConfigRefused(Failure):
    """The configuration is refused (exit 78): the environment or the schemas must change."""

    exit_code = settings.EXIT_CONFIG


def _say_errors(diagnosis: settings.Diagnosis) -> None:
    for error in diagnosis.errors:
        click.echo(printable(f"lane-worker: {error}"), err=True)


def _render(diagnosis: settings.Diagnosis) -> str:
    t = diagnosis.tuning
    schema = diagnosis.scheduler_schema + (
        " (isolated)" if diagnosis.isolated else " (production default)"
    )
    suffix = diagnosis.queue_suffix or "(none)"
    listen = " (PgBouncer: no LISTEN, polling)" if t.pgbouncer else " + 1 LISTEN"
    rows = [
        ("release id", diagnosis.release_id or "(unresolved)"),
        ("launch release id", diagnosis.launch_release_id or "(unresolved)"),
        ("queue", diagnosis.queue or "(unresolved)"),
        ("scheduler schema", schema),
        ("queue suffix", f"{suffix} (lane from {diagnosis.suffix_source})"),
        ("database", diagnosis.database_url_redacted or _no_url(diagnosis)),
        ("pool", f"worker 2 connections{listen}; client {diagnosis.client_pool_size}"),
        ("concurrency", str(t.concurrency)),
        ("claim timeout", f"{t.claim_timeout_s} s"),
        ("poll interval", f"{t.poll_interval_s} s"),
        ("drain window", f"{t.drain_s} s"),
        ("health port", f"{t.health_port} on {t.health_host}"),
        ("max attempts", str(t.max_attempts)),
        ("log format", t.log_format),
    ]
    lines = _columns(rows)
    verdict = (
        f"boot would be REFUSED (exit {diagnosis.exit_code})"
        if diagnosis.refused
        else f"boot would proceed (exit {diagnosis.exit_code})"
    )
    lines += ["", f"verdict: {verdict}"]
    lines += [f"  error ({e.variable}): {e}" for e in diagnosis.errors]
    lines += [f"  warning: {w}" for w in diagnosis.warnings]
    return "\n".join(lines)


def _no_url(diagnosis: settings.Diagnosis) -> str:
    refused = any(e.variable == settings.DATABASE_URL_ENV for e in diagnosis.errors)
    return "(set but refused, not shown: see the error below)" if refused else "(not set)"


def _columns(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(name) for name, _ in rows)
    # A value with a line break (from the environment, a release id) must not split its
    # row, and a pasted megabyte must not fill the terminal.
    return [f"{name.ljust(width)}  {_cell(name, value)}" for name, value in rows]


def _cell(name: str, value: str) -> str:
    limit = 3 * SHOWN_CHARS if name == "database" else SHOWN_CHARS  # URLs run long
    if len(value) > limit:
        value = value[:limit] + "..."
    return value if value.isprintable() else repr(value)


def _scrub(text: str, url: str) -> str:
    """Remove the database URL and its password from ``text`` (driver messages may echo them)."""
    text = text.replace(url, dburl.redact_url(url)) if url else text
    return dburl.mask_secrets(text, dburl.url_secrets(url))


def _failure_for(exc: Exception, url: str) -> Failure:
    """Map an exception of a command to its exit code and one sentence."""
    where = dburl.redact_url(url) if url else "(not set)"
    said = _scrub(str(exc), url)
    if isinstance(exc, LaneConfigError | EngineSchemaError | StoreSchemaError):
        return ConfigRefused(said)
    if isinstance(exc, InvalidRequestError):
        return UsageFailure(said)
    if isinstance(exc, LaneWorkerError):
        return Failure(said)
    if is_transient(exc):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return Failure(
            f"cannot reach the runtime database at {where} ({_scrub(reason, url)}); "
            "check that it is running and that the URL is right."
        )
    if isinstance(exc, _MISSING_SCHEMA):
        return Failure(f"the runtime database at {where} lacks lane-worker's schemas ({said}); "
                       "run lane-worker migrate first.")  # fmt: skip
    if isinstance(exc, asyncpg.PostgresError):
        return Failure(f"the runtime database at {where} answered: {said}")
    return Failure(f"unexpected {type(exc).__name__}: {said}")


def _with_client(action: Callable[[LaneClient], Awaitable[T]], *, check: tuple[str, ...] = ()) -> T:
    """Connect a client from the environment, run ``action`` with it, map failures to exits."""
    env = os.environ
    url = (env.get(settings.DATABASE_URL_ENV) or "").strip()
    for error in settings.diagnose(env).errors:
        if error.variable in CONNECT_VARIABLES + check:
            raise ConfigRefused(str(error))
    # Library logs (retry warnings) would break the one-sentence and --json contracts.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )

    async def main() -> T:
        try:
            client = await LaneClient.connect(env=env, retry_for_s=CONNECT_RETRY_S)
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            if isinstance(exc, LaneConfigError):
                raise
            # The driver could not parse the URL; nothing reached the server.
            raise ConfigRefused(
                f"{settings.DATABASE_URL_ENV} is not a usable database URL "
                f"({_scrub(str(exc), url)}): set it to postgresql://user:password@host:5432/dbname."
            ) from None
        try:
            return await action(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except Failure:
        raise
    except Exception as exc:
        raise _failure_for(exc, url) from None


def _daemon_exit(run: Callable[[], int], env: os._Environ[str]) -> int:
    """Run a daemon; map what escapes it to an exit code and one sentence, never a traceback."""
    try:
        return run()
    except Exception as exc:
        # A task group wraps the one error that ended it.
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            inner = exc.exceptions[0]
            if not isinstance(inner, Exception):
                break
            exc = inner
        url = (env.get(settings.DATABASE_URL_ENV) or "").strip()
        raise _failure_for(exc, url) from None


class _Checked(click.ParamType[Any]):
    """A string parameter: ``problem`` says why a value is unusable (exit 2), else None."""

    def __init__(self, name: str, problem: Callable[[str], str | None], to: Callable[[str], Any]):
        self.name, self.problem, self.to = name, problem, to

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        reason = self.problem(value) if isinstance(value, str) else None
        if reason:
            self.fail(reason, param, ctx)
        return self.to(value) if isinstance(value, str) else value


def _refuse_constant(name: str) -> Any:
    raise ValueError(
        f"{name} is not JSON (the JSON standard has no {name}): send null or a string instead."
    )


def _read_json_text(value: str, what: str) -> str:
    """Return the JSON text of ``value``: itself, ``@FILE``'s content, or stdin for ``-``."""
    limit = limits.MAX_INPUT_BYTES
    try:
        if value == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        elif value.startswith("@"):
            with open(value[1:], "rb") as file:
                raw = file.read(limit + 1)
        else:
            raw = value.encode("utf-8", "surrogatepass")
    except OSError as exc:
        raise ValueError(f"cannot read {what} from {value[1:]!r}: {exc.strerror or exc}.") from None
    if len(raw) > limit:
        raise ValueError(
            f"{what} is more than {limit} bytes (1 MiB) of JSON text: store large data "
            "elsewhere and pass a reference to it."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text.") from None


def _parse_json(value: str, what: str) -> Any:
    text = _read_json_text(value, what)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply.") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})."
        ) from None
    except ValueError as exc:
        if "digits" not in str(exc):  # NaN / Infinity, refused by _refuse_constant
            raise
        # Python's limit on integer digits; its own message names a Python setting.
        raise ValueError(
            f"{what} holds an integer with more than 4300 digits: send it as a string."
        ) from None


class _JsonArg(click.ParamType[Any]):
    """JSON given inline, as ``@FILE`` or as ``-`` (stdin), checked by ``check`` (exit 2)."""

    def __init__(self, name: str, check: Callable[[Any], Any]) -> None:
        self.name, self.check = name, check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        what = param.opts[0] if param is not None and param.opts else "the value"
        try:
            return self.check(_parse_json(value, what))
        except ValueError as exc:  # InvalidRequestError is one
            self.fail(str(exc), param, ctx)


class _Seconds(click.ParamType[float]):
    """A finite number of seconds above zero (``nan``, ``inf`` and negatives are refused)."""

    name = "seconds"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        number = settings.decimal_number(str(value).strip())
        if number is None or number <= 0:
            self.fail(f"{value!r} is not a number of seconds above 0.", param, ctx)
        return number


def _key_problem(what: str) -> Callable[[str], str | None]:
    def problem(value: str) -> str | None:
        try:
            limits.checked_key(value, what)
        except InvalidRequestError as exc:
            return str(exc)
        return None

    return problem


def _release_problem(value: str) -> str | None:
    problem = settings.release_id_problem(value)
    return f"{problem}." if problem else None


def _app_problem(value: str) -> str | None:
    module, _, attr = value.partition(":")
    return None if module.strip() and attr.strip() else f"{value!r} is not MODULE:ATTRIBUTE."


def _play_problem(value: str) -> str | None:
    try:
        limits.checked_play(value.strip())
    except InvalidRequestError as exc:
        return str(exc)
    return None


def _suffix_problem(value: str) -> str | None:
    return None if lanes.normalize_queue_suffix(value) else f"{value!r} names no queue."


INPUT = _JsonArg("json-object", limits.checked_input)
PAYLOAD = _JsonArg("json", limits.checked_payload)
TEXT = _Checked("text", lambda v: None if v.strip() else "must not be blank.", str.strip)
PLAY = _Checked("play", lambda v: _play_problem(v), str.strip)
IDEMPOTENCY_KEY = _Checked("key", _key_problem("an idempotency key"), str)
EVENT_KEY = _Checked("event_key", _key_problem("an event key"), str)
RELEASE_ID = _Checked("release_id", _release_problem, str.strip)
SUFFIX = _Checked("suffix", _suffix_problem, str.strip)
APP_SPEC = _Checked("module:attr", _app_problem, str.strip)


def _one_line(value: Any, limit: int = 300) -> str:
    if isinstance(value, dict) and isinstance(value.get("message"), str):
        value = value["message"]
    text = " ".join((value if isinstance(value, str) else json.dumps(value, default=str)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _emit(as_json: bool, report: Any, *lines: str) -> None:
    """Print ``report`` as one JSON object, or else ``lines`` as text."""
    click.echo(
        json.dumps(report, indent=2, default=str) if as_json else printable("\n".join(lines))
    )


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Run and operate lane-worker: durable Absurd runs, one queue per release.

    Every command reads its configuration from the environment
    (WORKFLOW_RUNTIME_POSTGRES, DEEPLINE_RUNTIME_SCHEDULER_SCHEMA, ...). Exit
    codes: 0 success, 1 failure, 2 usage error, 78 configuration refused.
    """


@cli.command()
@json_option
def doctor(as_json: bool) -> None:
    """Print the resolved topology and whether the daemon would refuse to boot.

    Reads the environment only; never connects to the database. Exits with the
    code the daemon would use: 78 when boot would be refused, else 0.
    """
    diagnosis = settings.diagnose(os.environ)
    _emit(as_json, diagnosis.as_json(), _render(diagnosis))
    _say_errors(diagnosis)
    sys.exit(diagnosis.exit_code)


@cli.command()
@click.option("--app", default=DEFAULT_APP, show_default=True, type=APP_SPEC,
              help="The App whose plays to run, as module:attribute.")  # fmt: skip
def run(app: str) -> None:
    """Run the worker daemon for this release's lane until SIGTERM."""
    from worker.daemon.supervisor import (
        run_daemon,  # the daemon's imports stay out of other commands
    )

    sys.exit(_daemon_exit(functools.partial(run_daemon, os.environ, app), os.environ))


@cli.command()
@click.option(
    "--app",
    default=DEFAULT_APP,
    show_default=True,
    type=APP_SPEC,
    help="The App whose plays to run; the demo runs are submitted if it has them.",
)
@click.option(
    "--exit-after-demo",
    is_flag=True,
    help="Exit 0 once every demo run completed (1 if one did not).",
)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".pg/dev"), show_default=True,
              help="Embedded PostgreSQL's data folder, reused across starts.")  # fmt: skip
def dev(app: str, exit_after_demo: bool, data_dir: Path) -> None:
    """Run a worker with the demo runs, on embedded PostgreSQL unless one is configured.

    With WORKFLOW_RUNTIME_POSTGRES set, that database is used instead. Ctrl-C
    drains the worker and stops PostgreSQL.
    """
    from worker.dev.mode import run_dev  # embedded Postgres stays out of other commands

    run = functools.partial(
        run_dev, os.environ, app, exit_after_demo=exit_after_demo, data_dir=data_dir
    )
    sys.exit(_daemon_exit(run, os.environ))


@cli.command()
@click.argument("play", type=PLAY)
@click.option("--input", "input_", type=INPUT, metavar="JSON|@FILE|-",
              help="The play's input: a JSON object inline, from @FILE, or - for stdin "
                   "(default {}; at most 1 MiB).")  # fmt: skip
@click.option("--idempotency-key", type=IDEMPOTENCY_KEY, metavar="KEY",
              help="At most one run per KEY (at most 255 characters).")  # fmt: skip
@click.option("--queue-suffix", type=SUFFIX, help="Submit to this suffix's dev lane instead.")
@click.option("--wait", is_flag=True, help="Wait for the end; exit 1 unless it completed.")
@click.option("--timeout", type=_Seconds(), default=300.0,
              show_default=True, metavar="SECONDS", help="How long --wait waits.")  # fmt: skip
@json_option
@click.pass_context
def submit(ctx: click.Context, play: str, input_: Any, idempotency_key: str | None,
           queue_suffix: str | None, wait: bool, timeout: float,
           as_json: bool) -> None:  # fmt: skip
    """Submit a run of PLAY on this release's lane and print its run id."""
    if not wait and ctx.get_parameter_source("timeout") is not ParameterSource.DEFAULT:
        raise click.UsageError("--timeout only applies together with --wait.")

    async def action(client: LaneClient) -> tuple[dict[str, Any], RunStatus | None]:
        run = await client.submit(
            play, input_, idempotency_key=idempotency_key, queue_suffix=queue_suffix
        )
        if not as_json:
            click.echo(run.run_id)  # before waiting, so an operator can follow the run
        report = dict(runId=run.run_id, releaseId=run.release_id, queue=run.queue,
                      created=run.created)  # fmt: skip
        return report, (await client.wait(run.run_id, timeout) if wait else None)

    check = (settings.MAX_ATTEMPTS_ENV,) if queue_suffix else SUBMIT_VARIABLES
    report, final = _with_client(action, check=check)
    if final is None:
        if as_json:
            _emit(True, report)
        return
    report |= dict(status=final.status, output=final.output, error=final.error,
                   timedOut=not final.finished)  # fmt: skip
    done = final.status == "completed"
    output = [f"output: {json.dumps(final.output, default=str)}"] if done else []
    _emit(as_json, report, f"status: {final.status}", *output)
    if not final.finished:
        raise Failure(
            f"run {final.run_id} did not finish within {timeout:g} s; it is {final.status} "
            "and goes on (see lane-worker status)."
        )
    if not done:
        why = f": {_one_line(final.error)}" if final.error is not None else "."
        raise Failure(f"run {final.run_id} {final.status}{why}")


@cli.command()
@click.argument("run_id")
@click.argument("event_key", type=EVENT_KEY)
@click.option("--data", type=PAYLOAD, metavar="JSON|@FILE|-",
              help="The event's payload: JSON inline, from @FILE, or - for stdin "
                   "(default null).")  # fmt: skip
@json_option
def signal(run_id: str, event_key: str, data: Any, as_json: bool) -> None:
    """Deliver integration event EVENT_KEY to a run (first wins)."""
    result = _with_client(lambda client: client.signal(run_id, event_key, data))
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
    _emit(as_json, report, text)


@cli.command()
@click.argument("run_id")
@json_option
def cancel(run_id: str, as_json: bool) -> None:
    """Cancel a run (a finished run is left as it is)."""

    async def action(client: LaneClient) -> tuple[bool, RunStatus]:
        cancelled = await client.cancel(run_id)
        return cancelled, await client.status(run_id)

    cancelled, now = _with_client(action)
    report = {"runId": now.run_id, "cancelled": cancelled, "status": now.status}
    said = "cancelled run" if cancelled else f"nothing to cancel: already {now.status}, run"
    _emit(as_json, report, f"{said} {now.run_id}.")


@cli.command()
@click.argument("run_id")
@json_option
def status(run_id: str, as_json: bool) -> None:
    """Show a run's status, release, queue, attempts and result."""
    now = _with_client(lambda client: client.status(run_id))
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
        rows.append(("output", json.dumps(now.output, default=str)))
    if now.error is not None:
        rows.append(("error", _one_line(now.error, limit=2000)))
    _emit(as_json, now.as_json(), *_columns(rows))


def _attempts_line(claims: Sequence[Any]) -> str:
    """Count the claims that ran the play; a defer or a refusal spends no attempt."""
    ran = sum(1 for a in claims if a.disposition in ("own", "adopt"))
    back = len(claims) - ran
    if not claims:
        return "(none yet)"
    return f"{ran}" + (f" (and {back} claim(s) put back without an attempt)" if back else "")


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
        views = _with_client(lambda client: client.lanes())
        _emit(as_json, {"lanes": [v.as_json() for v in views]}, *lanes_table(views))


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@json_option
def show(release_id: str, as_json: bool) -> None:
    """Show one lane in full: workers and their plays, counts, verdict, blockers with run ids."""
    view = _with_client(lambda client: client.lane(release_id))
    _emit(as_json, view.as_json(), *lane_detail(view))


WAIT_POLL_S = 0.5


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@click.option("--timeout", type=_Seconds(), default=900.0, show_default=True, metavar="SECONDS",
              help="Give up (exit 1, printing what still blocks) after this long.")  # fmt: skip
@json_option
def wait(release_id: str, timeout: float, as_json: bool) -> None:
    """Wait until RELEASE_ID's lane is drained: exit 0 the moment its machines may stop.

    Exits 1 at once for a lane that still claims (retire it first), and after
    --timeout with the lane's blockers when it did not drain in time.
    """

    async def action(client: LaneClient) -> LaneView:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            view = await client.lane(release_id)
            if view.safe_to_stop or view.status == "claiming" or loop.time() >= deadline:
                return view
            await asyncio.sleep(min(WAIT_POLL_S, max(0.0, deadline - loop.time())))

    view = _with_client(action)
    if view.safe_to_stop:
        _emit(as_json, view.as_json(),
              f"lane {view.queue} (release {view.release_id}) is drained: safe to stop its "
              "machines.")  # fmt: skip
        return
    if as_json:
        _emit(True, view.as_json())
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


force_option = click.option(
    "--force", is_flag=True, help="Create the lane even if no lane has ever had this release id."
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

    async def action(client: LaneClient) -> tuple[str, bool]:
        known = await client.lane_known(release_id)
        return await client.retire_release(release_id, force=force), known

    queue, known = _with_client(action)
    report = {"releaseId": release_id, "queue": queue, "status": "retired", "known": known}
    _emit(as_json, report, f"retired lane {queue} (release {release_id}).")


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@force_option
@json_option
def activate(release_id: str, force: bool, as_json: bool) -> None:
    """Mark RELEASE_ID's lane claiming again; its workers may boot.

    A release id no lane has ever had is refused, as by retire, unless --force.
    """
    queue = _with_client(lambda client: client.activate_release(release_id, force=force))
    report = {"releaseId": release_id, "queue": queue, "status": "claiming"}
    _emit(as_json, report, f"activated lane {queue} (release {release_id}): claiming again.")


@lanes_group.command()
@click.argument("release_id", type=RELEASE_ID)
@click.option("--to", "to_release", type=RELEASE_ID, required=True,
              help="The claiming release whose lane takes the runs.")  # fmt: skip
@json_option
def move(release_id: str, to_release: str, as_json: bool) -> None:
    """Move RELEASE_ID's runs that never started to the lane of release --to.

    One transaction per run. A run that ever started (an attempt, a committed
    step) stays and is listed as refused: its steps ran on the old release's
    code (fail it and retry it instead). Exits 1 when any run was refused.
    """
    report = _with_client(lambda client: client.move_lane(release_id, to_release))
    said = [f"moved {len(report.moved)} run(s) from {report.from_queue} to {report.to_queue} "
            f"(release {report.to_release_id})."]  # fmt: skip
    said += [f"  {run_id}" for run_id in report.moved]
    said += [f"refused {run_id}: {why}" for run_id, why in report.refused]
    _emit(as_json, {"from": report.from_queue, "to": report.to_queue,
                    "toReleaseId": report.to_release_id, "moved": list(report.moved),
                    "refused": [{"runId": r, "reason": w} for r, w in report.refused]},
          *said)  # fmt: skip
    if report.refused:
        raise Failure(f"{len(report.refused)} run(s) of {report.from_queue} were not moved "
                      "(listed above, each with the reason).")  # fmt: skip


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class _Duration(click.ParamType[float]):
    """A duration: seconds, or a number with s, m, h or d (``90m``, ``24h``, ``7d``)."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in _UNITS else "s"
        number = settings.decimal_number(text[:-1] if text[-1:] in _UNITS else text)
        if number is None:
            self.fail(f"{value!r} is not a duration such as 3600, 90m, 24h or 7d.", param, ctx)
        return number * _UNITS[unit]


@lanes_group.command()
@click.option("--older-than", "older_than", type=_Duration(), required=True, metavar="DURATION",
              help="Only lanes retired longer ago than this (3600, 90m, 24h, 7d).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="List the lanes that would be pruned; drop nothing.")
@json_option
def prune(older_than: float, dry_run: bool, as_json: bool) -> None:
    """Drop the engine queues of retired lanes that no open run uses; keep their history.

    Many deploys a day leave many retired lanes, each with six engine tables.
    A lane qualifies when it was retired more than --older-than ago and none of
    its runs is open; its lane row and its runs stay (status, runs, history).
    `lanes activate` recreates the queue.
    """

    async def pruning(client: LaneClient) -> tuple[list[str], list[str]]:
        queues = await client.prune_lanes(older_than, dry_run=dry_run)
        return queues, await client.prune_kept_live(older_than)

    queues, kept = _with_client(pruning)
    verb = "would prune" if dry_run else "pruned"
    _emit(as_json, {"dryRun": dry_run, "queues": queues, "keptLive": kept},
          f"{verb} {len(queues)} lane queue(s).", *(f"  {q}" for q in queues))  # fmt: skip
    if kept and not as_json:
        click.echo(
            f"kept {len(kept)} drained lane(s) whose workers are still live (their loops poll "
            f"the queue): stop their machines, then prune again: {' '.join(kept)}",
            err=True,
        )


@cli.group("runs", invoke_without_command=True)
@click.option("--status", type=click.Choice(STATUSES), help="Only runs with this status.")
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
    found = _with_client(
        lambda client: client.runs(status=status, lane=lane, play=play, limit=limit)
    )
    rows = [("RUN", "PLAY", "STATUS", "RELEASE", "QUEUE", "ATTEMPTS", "CREATED")]
    rows += [(r.run_id, r.play, r.status, r.release_id, r.queue, str(r.attempts),
              r.created_at.isoformat(timespec="seconds")) for r in found]  # fmt: skip
    lines = aligned(rows)
    _emit(as_json, {"runs": [r.as_json() for r in found]},
          *(lines if found else ["no runs match."]))  # fmt: skip


@runs_group.command("fail")
@click.argument("run_id")
@click.option("--reason", type=TEXT, required=True, help="Why: stored as the run's error.")
@json_option
def fail_run(run_id: str, reason: str, as_json: bool) -> None:
    """Fail a run for good (one run.failed fact); a running attempt stops at its next step."""
    failed = _with_client(lambda client: client.fail_run(run_id, reason))
    said = f"failed run {run_id}." if failed else f"nothing to fail: run {run_id} had ended."
    _emit(as_json, {"runId": run_id, "failed": failed}, said)


@runs_group.command("retry")
@click.argument("run_id")
@click.option("--to", "to_release", type=RELEASE_ID, metavar="RELEASE",
              help="Retry on this claiming release (default: the newest claiming release "
                   "with a live worker that registers the play).")  # fmt: skip
@click.option("--completed", is_flag=True,
              help="Also retry a run that completed (its work runs again).")  # fmt: skip
@json_option
def retry_run(run_id: str, to_release: str | None, completed: bool, as_json: bool) -> None:
    """Submit a new run with an ended run's play and input, on a release that can run it.

    Refused while the run is open or an attempt of it may still execute a step,
    and for a completed run without --completed. The new run's retryOf names the
    old one, and it receives the events the old one had. A run is retried once:
    asked again, this prints the existing retry (``created`` false).
    """
    retried = _with_client(
        lambda client: client.retry_run(run_id, to_release=to_release, completed=completed)
    )
    report = {"runId": retried.run_id, "releaseId": retried.release_id, "queue": retried.queue,
              "retryOf": retried.retry_of, "created": retried.created,
              "status": retried.status}  # fmt: skip
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
    _emit(as_json, report, retried.run_id)


@cli.command()
@json_option
def migrate(as_json: bool) -> None:
    """Install or upgrade the engine schema and the run-state store."""

    async def action(client: LaneClient) -> tuple[str, MigrationReport, str]:
        return (*await client.migrate(), client.store.schema)

    engine, store, schema = _with_client(action)
    applied = ", ".join(f"{v:04d}" for v in store.applied) or "nothing (current)"
    newer = ", ".join(f"{v:04d}" for v in store.unknown_compatible)
    report = dict(engine=engine, storeSchema=schema, storeVersion=store.current,
                  storeApplied=list(store.applied),
                  storeNewer=list(store.unknown_compatible))  # fmt: skip
    lines = [f"engine schema: {engine}", f"store {schema}: applied {applied}"]
    lines[-1] += f"; version {store.current:04d}"
    if newer:
        lines.append(f"store {schema} also holds newer compatible migrations {newer}")
    _emit(as_json, report, *lines)


def main() -> None:
    """Run the ``lane-worker`` command."""
    cli(prog_name="lane-worker")
