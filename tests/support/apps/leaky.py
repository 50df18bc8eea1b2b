"""A play that leaks the database URL into its error (`--app support.apps.leaky:app`).

The secrets e2e test checks that the daemon's logs, the stored error and `status`
show none of the password a careless driver message quoted.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit

from worker import App, TaskContext

app = App()


def password_spellings(url: str) -> tuple[str, str]:
    """Return the password of ``url`` as written and as the driver decodes it."""
    parts = urlsplit(url)
    if parts.password:
        return parts.password, unquote(parts.password)
    written = next(
        v for k, _, v in (p.partition("=") for p in parts.query.split("&")) if k == "password"
    )
    return written, unquote_plus(written)


@app.play("leak-url")
async def leak_url(ctx: TaskContext, params: Any) -> None:
    """Raise an error quoting the database URL and its password, as a careless driver might."""
    url = os.environ["WORKFLOW_RUNTIME_POSTGRES"]
    written, decoded = password_spellings(url)
    raise RuntimeError(f"cannot connect to {url}: bad password {decoded} (as written: {written})")
