"""The one masking rule (worker/masking.py) every outbound client applies to what it keeps."""

from __future__ import annotations

import json
from urllib.parse import quote

from worker.config.dburl import url_secrets
from worker.masking import mask_response, mask_value, secret_forms

TOKEN = "fm2_lJPECAAAAAAAB/7+xZ9q"
PASSWORD = "pg-Pass/w0rd#x"


def test_a_token_is_masked_in_every_form_an_echo_takes() -> None:
    """Bare, after Bearer, JSON-escaped (also with \\/), percent-encoded, inside repr, and
    in headers echoed as text: none of the token survives."""
    secrets = secret_forms(TOKEN)
    echoes = [
        TOKEN,
        f"Bearer {TOKEN}",
        json.dumps({"headers": {"Authorization": f"Bearer {TOKEN}"}}),
        json.dumps(json.dumps({"authorization": f"Bearer {TOKEN}"})),  # JSON inside JSON
        json.dumps(TOKEN).replace("/", "\\/"),
        f"token={quote(TOKEN, safe='')}",
        repr({"Authorization": f"Bearer {TOKEN}"}),
        f"GET /v1/apps/x/machines HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nHost: x\r\n",
    ]
    for echo in echoes:
        masked = mask_response(echo, secrets)
        for part in ("fm2_lJPEC", "xZ9q", "7+xZ", "%2F7"):
            assert part not in masked, (echo, masked)
        assert "***" in masked


def test_an_unknown_credential_in_a_header_is_masked_too() -> None:
    """A credential the client did not know of (another header, another token) is masked
    where an Authorization header or a Bearer scheme carries it; prose is left alone."""
    assert mask_response('{"Authorization":"Bearer other-secret-42"}', ()) == (
        '{"Authorization":"***"}'
    )
    assert mask_response("sent bearer abc.def.ghi1 here", ()) == "sent bearer *** here"
    prose = "invalid token: a bearer token is required (basic auth is off)"
    assert mask_response(prose, ()) == prose


def test_a_secret_cut_by_the_length_limit_is_masked_too() -> None:
    """What is kept is cut to a limit after masking; a secret the cut (or the read before
    it) splits leaves none of its beginning."""
    assert mask_response("x" * 190 + TOKEN, secret_forms(TOKEN), 200) == "x" * 190 + "***"
    kept = mask_response("x" * 194 + TOKEN[:12], secret_forms(TOKEN), 200)
    assert kept == "x" * 194 + "***"


def test_database_passwords_and_nested_values() -> None:
    """The database URL's password in every spelling, in every string of a JSON value."""
    url = f"postgresql://lane:{quote(PASSWORD, safe='')}@db:5432/runtime"
    value = {"error": f"echo {PASSWORD}", "list": [quote(PASSWORD, safe=""), 3], "n": None}
    masked = mask_value(value, url_secrets(url))
    assert PASSWORD not in repr(masked)
    assert quote(PASSWORD, safe="") not in repr(masked)
    assert masked["list"][1] == 3
    assert masked["n"] is None


def test_a_fly_token_of_several_parts_is_masked_part_by_part() -> None:
    """A macaroon token is a comma-separated list: an echo of one part is masked too."""
    token = "FlyV1 fm2_first0part0aaaa,fm2_second0part0bbbb"
    masked = mask_response("saw fm2_second0part0bbbb only", secret_forms(token))
    assert "second0part" not in masked
