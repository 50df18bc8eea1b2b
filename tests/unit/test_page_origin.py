"""Which POSTs count as posted from the page itself (worker/daemon/page_auth.same_origin)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from worker.daemon.page_auth import same_origin

HOST = "127.0.0.1:8080"


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"Origin": f"http://{HOST}"}, True),
        ({"Origin": "http://evil.example"}, False),
        ({"Origin": "null"}, False),  # a sandboxed frame or a file
        ({}, False),
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, False),
        # Behind a proxy that rewrites Host: the browser's Origin is the public name.
        ({"Origin": "https://ops.example.com"}, False),
        ({"Origin": "https://ops.example.com", "X-Forwarded-Host": "ops.example.com"}, True),
        ({"Origin": "https://ops.example.com", "Sec-Fetch-Site": "same-origin"}, True),
        ({"Origin": "http://evil.example", "X-Forwarded-Host": "ops.example.com"}, False),
    ],
)
def test_a_post_is_the_page_s_own_only_when_the_browser_says_so(
    headers: dict[str, str], allowed: bool
) -> None:
    request = make_mocked_request("POST", "/signin", headers={"Host": HOST, **headers})
    assert same_origin(request) is allowed
