"""The run list (``/runs`` on the health port): every run, filtered, newest first, paged.

The filter form is a GET (reading changes nothing); each page links the next by
keyset (``before``), so deep pages cost what the first does. With
``LANE_WORKER_PAGE_TOKEN`` set and the operator signed in, the page also carries
the bulk-action form (``worker/daemon/page_actions.py``); without it, it shows
none. Every value is escaped: plays, releases and errors come from the app.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from worker.daemon.page import NAV, STYLE, age
from worker.ops.remedies import STATUS_FILTERS
from worker.ops.run_list import MAX_BULK, MAX_PAGE_SIZE, ListedRun, RunFilter, RunPage

EXTRA_STYLE = """
form.filter{display:flex;flex-wrap:wrap;gap:.4rem .8rem;align-items:end;margin:.5rem 0 1rem}
form.filter label{display:flex;flex-direction:column;font-size:12px;color:#444}
form.filter input,form.filter select{font:inherit;padding:.15rem .3rem}
.actions{border:1px solid #ccd;background:#f7f8fc;padding:.5rem .8rem;margin:.8rem 0}
.actions form{display:inline-block;margin-right:1rem}
.error-text{color:#990000}
.refused{color:#990000;font-weight:600}
nav.top a{margin-right:.8rem}
"""


def when(value: datetime | None) -> str:
    """A time as the page prints it (UTC, to the second)."""
    return "" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def shell(title: str, body: str, *, refresh_s: int | None = None) -> str:
    """A whole page of the operator's pages: the shared style, the top links, ``body``."""
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'{meta}<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}{EXTRA_STYLE}</style></head><body>"
        f"{NAV}{body}</body></html>"
    )


def _field(name: str, label: str, value: str | None, hint: str) -> str:
    return (
        f'<label>{escape(label)}<input name="{name}" value="{escape(value or "")}" '
        f'placeholder="{escape(hint)}" size="14"></label>'
    )


def filter_form(flt: RunFilter, limit: int) -> str:
    """The filter form: a GET of ``/runs`` with the filter as its query."""
    options = "".join(
        f'<option value="{s}"{" selected" if flt.status == s else ""}>{s}</option>'
        for s in ("", *STATUS_FILTERS)
    )
    query = flt.as_query()
    return (
        '<form class="filter" method="get" action="/runs" data-field="filter">'
        f'<label>status<select name="status">{options}</select></label>'
        f"{_field('play', 'play', flt.play, 'any')}"
        f"{_field('release', 'release', flt.release, 'any')}"
        f"{_field('queue', 'queue', flt.queue, 'any')}"
        f"{_field('newer', 'newer than', query.get('newer'), 'e.g. 2h')}"
        f"{_field('older', 'older than', query.get('older'), 'e.g. 15m')}"
        f"{_field('error', 'error text', flt.error, 'any')}"
        f"{_field('run', 'run id', None if flt.run is None else str(flt.run), 'any')}"
        f'<label>per page<input name="limit" value="{limit}" size="4" '
        f'title="1 to {MAX_PAGE_SIZE}"></label>'
        '<button type="submit">filter</button> <a href="/runs">clear</a></form>'
    )


def _row(run: ListedRun, now: datetime) -> str:
    run_id = escape(str(run.run_id))
    error = ""
    if run.error_name or run.error_message:
        error = (
            f'<span class="error-text" data-field="error">{escape(run.error_name)}: '
            f"{escape(run.error_message)}</span>"
        )
    adopted = (
        f' <span class="note">(adopted by {escape(run.adopted_release_id)})</span>'
        if run.adopted_release_id
        else ""
    )
    return (
        f'<tr data-run="{run_id}" data-status="{escape(run.status)}">'
        f'<td><a href="/runs/{run_id}"><code>{run_id}</code></a></td>'
        f'<td data-field="status">{escape(run.status)}</td>'
        f'<td data-field="play">{escape(run.play)}</td>'
        f'<td data-field="release">{escape(run.release_id)}{adopted}</td>'
        f'<td><code data-field="queue">{escape(run.queue)}</code></td>'
        f'<td class="n" data-field="attempts">{run.attempts}</td>'
        f'<td data-field="created" title="{escape(when(run.created_at))}">'
        f"{age((now - run.created_at).total_seconds())} ago</td>"
        f"<td>{error}</td></tr>"
    )


def render(flt: RunFilter, page: RunPage, limit: int, *, first: bool, actions: str) -> str:
    """The run list page: the filter, ``actions`` (already rendered, or ''), the runs, paging."""
    rows = "".join(_row(r, page.as_of) for r in page.runs) or (
        '<tr><td colspan="8" data-field="none">no runs match.</td></tr>'
    )
    links = []
    if not first:
        links.append(
            f'<a href="{escape(flt.url(limit=str(limit)))}" data-field="newest">newest</a>'
        )
    if page.next is not None:
        link = flt.url(limit=str(limit), before=page.next.token())
        links.append(f'<a href="{escape(link)}" data-field="next">older runs</a>')
    body = (
        "<h1>runs</h1>"
        f'<p class="note">Newest first, {limit} to a page, as of '
        f'<span data-field="asOf">{escape(when(page.as_of))}</span>. Matching: '
        f'<span data-field="filterText">{escape(flt.describe())}</span>. The same list: '
        "<code>lane-worker runs</code>.</p>"
        f"{filter_form(flt, limit)}{actions}"
        "<table data-field=runs><thead><tr><th>run</th><th>status</th><th>play</th>"
        "<th>release</th><th>queue</th><th>attempts</th><th>created</th><th>error</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>"
        f'<p class="note" data-field="paging">{" ".join(links)}</p>'
    )
    return shell("lane-worker runs", body)


def render_problem(status: int, sentence: str, flt: RunFilter | None = None) -> str:
    """A page saying why the list (or an action) cannot be shown: a bad field, a slow read."""
    form = filter_form(flt, 50) if flt is not None else ""
    body = (
        f'<h1>runs</h1><p class="refused" data-error="{status}" data-field="problem">'
        f"{escape(sentence)}</p>{form}"
    )
    return shell("lane-worker runs", body)


TOO_SLOW = (
    "the list took longer than the page allows (its statement timeout): narrow the filter "
    "(a status, a release, newer than ...) or use lane-worker runs."
)
TOO_MANY = (
    f"more than {MAX_BULK} runs match: a bulk action acts on at most {MAX_BULK}; narrow the "
    "filter (newer than, older than, a release, a play)."
)
