"""Headless Chromium driven over the DevTools protocol: type into a page's forms and click.

No browser library is needed: Debian's chromium (``make chromium``) is started with
``--remote-debugging-port=0``, and one page of it is driven through its WebSocket
with aiohttp (a dependency already). The browser does what an operator's does: it
keeps the cookies, sends ``Origin`` with a form's POST, follows redirects.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from support.page import CHROMIUM_FLAGS, chromium
from support.runtime import eventually

_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


class Page:
    """One tab of a headless Chromium."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session_id: str) -> None:
        self._ws = ws
        self._session = session_id
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command to the tab; return its result (events are skipped)."""
        return await _call(self._ws, next(self._ids) + 1000, method, params, self._session)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        said = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in said, said
        return said["result"].get("value")

    async def loaded(self, path: str) -> None:
        """Wait until the tab shows ``path`` (a pathname), fully loaded."""

        async def there() -> bool:
            # A new document (the mark set before a click is gone), at path, loaded.
            now = await self.evaluate(
                "[location.pathname, document.readyState, typeof window.__lwOld]"
            )
            return bool(now == [path, "complete", "undefined"])

        await eventually(there, what=f"the browser at {path}")

    async def goto(self, url: str, path: str) -> None:
        """Load ``url``; wait until it shows ``path``."""
        await self.send("Page.navigate", url=url)
        await self.loaded(path)

    async def fill(self, selector: str, value: str) -> None:
        """Type ``value`` into the field ``selector`` (as a person would, without events)."""
        found = await self.evaluate(
            f"(e => e ? (e.value = {json.dumps(value)}, true) : false)"
            f"(document.querySelector({json.dumps(selector)}))"
        )
        assert found, f"no field {selector}"

    async def click(self, selector: str, then: str) -> None:
        """Click ``selector`` (a form's button); wait until the tab shows path ``then``."""
        found = await self.evaluate(
            "window.__lwOld = true; (e => e ? (e.click(), true) : false)"
            f"(document.querySelector({json.dumps(selector)}))"
        )
        assert found, f"nothing to click at {selector}"
        await self.loaded(then)

    async def html(self) -> str:
        """The DOM the tab shows now."""
        return str(await self.evaluate("document.documentElement.outerHTML"))

    async def screenshot(self, path: Path) -> Path:
        """Save what the tab shows as a PNG at ``path``."""
        said = await self.send("Page.captureScreenshot", format="png")
        await asyncio.to_thread(path.write_bytes, base64.b64decode(said["data"]))
        return path


async def _call(
    ws: aiohttp.ClientWebSocketResponse,
    call_id: int,
    method: str,
    params: dict[str, Any],
    session_id: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"id": call_id, "method": method, "params": params}
    if session_id is not None:
        message["sessionId"] = session_id
    await ws.send_str(json.dumps(message))
    while True:
        reply = json.loads(await ws.receive_str())
        if reply.get("id") == call_id:
            assert "error" not in reply, reply
            result: dict[str, Any] = reply["result"]
            return result


@asynccontextmanager
async def browser_page() -> AsyncIterator[Page]:
    """A tab of a fresh headless Chromium (its own profile), closed afterwards."""
    browser, env = chromium()
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(  # noqa: ASYNC220 (started once; its output read in a thread)
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--remote-debugging-port=0", "--window-size=1400,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        try:
            url = await asyncio.to_thread(_devtools_url, proc)
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(url, max_msg_size=0) as ws,
            ):
                target = await _call(ws, 1, "Target.createTarget", {"url": "about:blank"})
                attached = await _call(
                    ws,
                    2,
                    "Target.attachToTarget",
                    {"targetId": target["targetId"], "flatten": True},
                )
                page = Page(ws, attached["sessionId"])
                await page.send("Page.enable")
                yield page
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for reader in threading.enumerate():
                if reader.name == "chromium-stderr":
                    reader.join(timeout=10)
            if proc.stderr is not None:
                proc.stderr.close()


def _devtools_url(proc: subprocess.Popen[str]) -> str:
    """Read Chromium's stderr until it says where its DevTools WebSocket listens."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        match = _LISTENING.search(line)
        if match:
            # Keep reading what it says after, or a full pipe would stall it.
            threading.Thread(target=proc.stderr.read, daemon=True, name="chromium-stderr").start()
            return match[1]
    raise AssertionError("chromium exited before listening:\n" + "".join(seen[-20:]))
