"""The operator page's forms and action pages: sign-in, the bulk form, its confirmation, the
audit trail. Every form is a POST carrying the session's CSRF token; every value is escaped.
"""

from __future__ import annotations

import json
from datetime import datetime
from html import escape

from worker.daemon.page_actions import ACTIONS, Bulk, RetryGroups
from worker.daemon.runs_page import shell, when
from worker.db.store.page import PageAction
from worker.ops.run_list import MAX_BULK, RunFilter


def _hidden(fields: dict[str, str]) -> str:
    return "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items()
    )


def signin_form(flt: RunFilter) -> str:
    """The sign-in form (shown while actions are on and nobody is signed in)."""
    return (
        '<div class="actions" data-field="signin"><form method="post" action="/signin">'
        f"{_hidden({'back': flt.url()})}"
        '<label>your name <input name="who" size="16" autocomplete="username"></label> '
        '<label>page token <input name="token" type="password" size="24" '
        'autocomplete="current-password"></label> <button type="submit">sign in to act'
        "</button></form>"
        '<span class="note">Retry, cancel and move need LANE_WORKER_PAGE_TOKEN.</span></div>'
    )


def action_form(flt: RunFilter, csrf: str, who: str) -> str:
    """The bulk form under the filter: which action, on everything the filter matches."""
    options = "".join(f'<option value="{a}">{a}</option>' for a in ACTIONS)
    return (
        '<div class="actions" data-field="actions">'
        '<form method="post" action="/actions/preview" data-field="action">'
        f"{_hidden({**flt.as_query(), 'csrf': csrf})}"
        f'<label>on everything matching: <select name="action">{options}</select></label> '
        "<label>to release (move; retry: optional, else each run's own target) "
        '<input name="to" size="14"></label> '
        f'<button type="submit">count them first</button></form>'
        f'<form method="post" action="/signout">{_hidden({"csrf": csrf})}'
        f'<span class="note">signed in as <b data-field="who">{escape(who)}</b></span> '
        '<button type="submit">sign out</button></form>'
        f'<p class="note">Retry needs status failed or cancelled, move status queued; at most '
        f"{MAX_BULK} runs. Each run goes through the CLI's remedy (a retry without a release "
        "goes where <code>runs retry</code> sends it: a dev lane's run to its own dev lane, "
        "a release's run to the newest claiming release; the count first says where); "
        '<a href="/actions">the audit trail</a> lists every action.</p></div>'
    )


def confirm_page(
    bulk: Bulk,
    count: int,
    as_of: datetime,
    csrf: str,
    preview: str,
    confirmed: int | None = None,
    groups: RetryGroups | None = None,
) -> str:
    """Ask to confirm ``count`` runs; the form carries the filter, ``asOf``, the count and
    the preview's id (the runs it counted are the only ones a confirmation acts on).

    ``confirmed``: the fewer runs a confirmation carried (it is asked again).
    ``groups``: a retry's targets (where each run's retry goes), and the runs not retried.
    """
    again = (
        f'<p class="refused" data-field="again">Nothing done: {count} runs match now, you '
        f"confirmed {confirmed}. Look again.</p>"
        if confirmed is not None
        else ""
    )
    targets = _retry_groups(groups) if groups is not None else ""
    fields = {
        **bulk.filter.as_query(),
        "action": bulk.action,
        "asOf": as_of.isoformat(),
        "seen": str(count),
        "preview": preview,
        "csrf": csrf,
        **({"to": bulk.to} if bulk.to else {}),
    }
    where = f": {groups.describe()}" if groups is not None else ""
    button = f"{bulk.action} {count} run(s){where}"
    body = (
        f"<h1>{escape(bulk.action)} {count} run(s)?</h1>{again}"
        f'<p data-field="count" data-count="{count}">{escape(bulk.describe(count))}, '
        f"created by {escape(when(as_of))}{escape(where)}.</p>{targets}"
        '<p class="note">Only these runs are acted on: runs created after that, or that '
        "enter the filter meanwhile, are left alone. Should any run enter the filter before "
        "you confirm, nothing is done and you are asked again; fewer is fine.</p>"
        f'<form method="post" action="/actions/run" data-field="confirm">{_hidden(fields)}'
        f'<button type="submit">yes, {escape(button)}</button></form>'
        f'<p><a href="{escape(bulk.filter.url())}" data-field="back">no, back to the list'
        "</a></p>"
    )
    return shell(f"lane-worker: {bulk.action} {count} runs?", body)


def _retry_groups(groups: RetryGroups) -> str:
    """Where the retries go, per target release, and the matching runs that get none."""
    items = "".join(
        f'<li data-field="target" data-release="{escape(release)}" data-queue="{escape(queue)}" '
        f'data-count="{n}">{n} run(s) -&gt; release <b>{escape(release)}</b> '
        f'<span class="note">(lane {escape(queue)})</span></li>'
        for release, queue, n in groups.targets
    )
    html = f'<p>Where the retries go:</p><ul data-field="targets">{items}</ul>'
    if groups.retried:
        html += (
            f'<p class="note" data-field="retried" data-count="{groups.retried}">'
            f"{groups.retried} matching run(s) were retried already: a run is retried once, "
            "so nothing is submitted for them.</p>"
        )
    html += _not_retried(groups)
    return html + (
        '<p class="note">Each run is retried only where this page says; should its target '
        "change before it is retried, it is refused (listed in the audit trail), never sent "
        "elsewhere.</p>"
    )


def _not_retried(groups: RetryGroups) -> str:
    if not groups.refused:
        return ""
    items = "".join(
        f'<li data-field="cannot" data-count="{n}">{n} run(s): {escape(why)}</li>'
        for why, n in groups.refused
    )
    return f'<p>Not retried (left as they are):</p><ul data-field="not-retried">{items}</ul>'


def nothing_to_retry(groups: RetryGroups) -> str:
    """The sentence when a retry preview finds no run that would get a new retry."""
    parts = []
    if groups.retried:
        parts.append(f"{groups.retried} matching run(s) were retried already")
    parts += [f"{n} run(s) cannot be retried: {why.rstrip('.')}" for why, n in groups.refused[:3]]
    return "nothing to retry: " + "; ".join(parts or ["no run would get a new retry"]) + "."


def refused_page(status: int, sentence: str, back: str = "/runs") -> str:
    """A refused POST: one sentence, and the way back."""
    body = (
        f'<h1>not done</h1><p class="refused" data-error="{status}" data-field="problem">'
        f'{escape(sentence)}</p><p><a href="{escape(back)}">back</a></p>'
    )
    return shell("lane-worker: not done", body)


def _refusals(action: PageAction) -> str:
    if not action.refusals:
        return ""
    items = "".join(
        f"<li><code>{escape(str(r.get('runId') or ''))}</code> {escape(str(r.get('reason')))}</li>"
        for r in action.refusals
    )
    return (
        f'<details data-field="refusals"><summary>why refused</summary><ul>{items}</ul></details>'
    )


def _audit_row(a: PageAction) -> str:
    state = "done" if a.finished_at is not None else "in progress (or stopped)"
    flt = json.dumps(a.filter, ensure_ascii=False, sort_keys=True)
    return (
        f'<tr data-action-id="{a.action_id}" data-state="{"done" if a.finished_at else "open"}">'
        f'<td class="n">{a.action_id}</td><td data-field="at">{escape(when(a.at))}</td>'
        f'<td data-field="who">{escape(a.who)} <span class="note">{escape(a.remote or "")}'
        f'</span></td><td data-field="kind">{escape(a.action)}'
        f"{escape(' to ' + a.target) if a.target else ''}</td>"
        f'<td><code data-field="filter">{escape(flt)}</code></td>'
        f'<td class="n" data-field="seen">{a.count_seen}</td>'
        f'<td class="n" data-field="acted">{a.acted}</td>'
        f'<td class="n" data-field="unchanged">{a.unchanged}</td>'
        f'<td class="n" data-field="refused">{a.refused}{_refusals(a)}</td>'
        f'<td data-field="state">{state}<br><span class="note">'
        f"{escape(when(a.finished_at))}</span></td></tr>"
    )


def audit_page(actions: list[PageAction]) -> str:
    """The audit trail: every bulk action, newest first."""
    rows = "".join(_audit_row(a) for a in actions) or (
        '<tr><td colspan="10" data-field="none">no action yet.</td></tr>'
    )
    busy = any(a.finished_at is None for a in actions)
    body = (
        "<h1>actions from this page</h1>"
        '<p class="note">Every bulk action: who (the name given at sign-in, the address), '
        "when, on which filter, how many runs were confirmed, acted on, left unchanged "
        "(already ended, already retried) and refused. Stored in the store's "
        "<code>page_actions</code> table.</p>"
        '<table data-field="audit"><thead><tr><th>#</th><th>when</th><th>who</th>'
        "<th>action</th><th>filter</th><th>confirmed</th><th>acted</th><th>unchanged</th>"
        f"<th>refused</th><th>state</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    # While an action runs, the trail follows it (its row is brought up to date every 50 runs).
    return shell("lane-worker actions", body, refresh_s=3 if busy else None)
