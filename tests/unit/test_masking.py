"""The one masking rule (worker/masking.py) every outbound client applies to what it keeps."""

from __future__ import annotations

import base64
import html
import json
import unicodedata
from html.entities import codepoint2name
from urllib.parse import quote

import pytest

from worker.config.dburl import url_secrets
from worker.masking import mask, mask_response, mask_value, secret_forms

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


# A long token as an app may send it, and a Fly-like one with base64's own characters.
LONG = "exec_" + "a1b2c3d4e5" * 30
FLY = "fm2_revoked0token0f00d/k+Y="


def _pieces(secret: str, n: int = 8) -> list[str]:
    return [secret[i : i + n] for i in range(len(secret) - n + 1)]


def test_a_token_echoed_raw_several_times_and_cut_by_the_read_keeps_no_piece() -> None:
    """D5: three raw copies of a 305-character token, read 800 bytes: masking the whole
    copies leaves the text under the limit, and the copy the read cut (150 characters of
    it) must not stay; a short beginning at a read's cut goes when the caller says so."""
    secrets = secret_forms(LONG)
    body = json.dumps({"token": LONG, "echo": LONG, "again": LONG})[:800]
    kept = mask_response(body, secrets, 200)
    assert kept.startswith('{"token": "***"'), kept
    for piece in _pieces(LONG):
        assert piece not in kept, (piece, kept)
    assert mask_response("ok " + LONG[:6], secrets, 200, cut=True) == "ok ***"
    assert mask_response("ok " + LONG[:6], secrets, 200) == "ok " + LONG[:6]  # whole text


def test_odd_spellings_of_a_token_are_masked() -> None:
    """D6: upper-cased, base64 (standard and URL-safe, padded or not, of the token and of
    `Bearer <token>`, and inside a longer encoded string at each alignment), split over a
    line break, and any piece of 8 characters or more wherever it stands."""
    bypass = "byp_ZZ9yy8XX7ww6VV5uu4TT3ss2"
    secrets = secret_forms(FLY, bypass)
    echoes = [FLY.upper(), FLY.lower(), bypass.upper(), f"auth={FLY[:10]}\n {FLY[10:]}",
              f"saw ...{FLY[5:14]}... in the middle"]  # fmt: skip
    for whole in (FLY, f"Bearer {FLY}"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(whole.encode()).decode()
            echoes += [encoded, encoded.rstrip("=")]
    for lead in ("", "x", "xy", "user|", "Bearer "):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            echoes.append(encode(f"{lead}{FLY}|tail".encode()).decode())
    for echo in echoes:
        masked = mask_response(f"unauthorized: {echo}", secrets)
        assert "***" in masked, (echo, masked)
        for secret in (FLY, bypass):
            for piece in _pieces(secret):
                assert piece.lower() not in masked.lower(), (echo, piece, masked)
        # No run of the token's encoded characters long enough to decode 6 bytes of it.
        for lead in range(3):
            core = base64.b64encode(b"\0" * lead + FLY.encode()).decode()[lead + 1 : -2]
            for piece in _pieces(core, 10):
                for spelled in (piece, piece.replace("+", "-").replace("/", "_")):
                    assert spelled not in masked, (echo, spelled, masked)


def test_the_piece_rule_keeps_false_positives_rare() -> None:
    """Pieces count only for a secret of 16 characters or more, and only from 8 characters
    on; a shorter secret goes only whole (any case; under 8, as a whole word)."""
    secrets = secret_forms(LONG)
    assert mask_response("a1b2c3d", secrets) == "a1b2c3d"  # 7 characters of it: kept
    short = secret_forms("pass-word-12")  # 12 characters: whole only
    assert mask_response("pass-word here, PASS-WORD-12 there", short) == "pass-word here, *** there"
    assert mask("runs_rel_a RUN run_x", ("run",)) == "runs_rel_a *** run_x"


# A token with letters beyond ASCII, and one whose UTF-8 holds bytes that Windows-1252
# and Latin-1 read differently (€ is E2 82 AC: 0x82 is a quotation mark in one, a
# control character in the other).
UMLAUT = "tökén-sécret-ümlaut-0123456789"
EURO = "p€ss-wörd-€-abcdefghij-987"
_MOJIBAKE = UMLAUT.encode().decode("latin-1")  # "tÃ¶kÃ©n-..."
MISREAD = {
    "latin-1 bytes read as utf-8": UMLAUT.encode("latin-1").decode("utf-8", errors="replace"),
    "utf-8 read as latin-1": _MOJIBAKE,
    "utf-8 read as windows-1252": EURO.encode().decode("cp1252"),
    "percent-encoded utf-8": quote(UMLAUT, safe=""),
    "percent-encoded, lower-case hex": quote(UMLAUT, safe="").lower(),
    "percent-encoded latin-1": quote(UMLAUT, safe="", encoding="latin-1"),
    "json \\u escapes": json.dumps(UMLAUT)[1:-1],
    "json \\u escapes of the mojibake": json.dumps(_MOJIBAKE)[1:-1],
    "percent-encoded mojibake": quote(_MOJIBAKE, safe=""),
    "upper-cased": UMLAUT.upper(),
}


@pytest.mark.parametrize("how", sorted(MISREAD))
def test_a_non_ascii_token_echoed_in_another_encoding_is_masked(how: str) -> None:
    """An endpoint in another encoding gives a token with non-ASCII characters back
    misread, percent-encoded or JSON-escaped: whole, cut at the end of a read, or in
    part, none of it is kept."""
    echo = MISREAD[how]
    secrets = secret_forms(UMLAUT, EURO)
    assert mask_response(f"unauthorized: {echo} (bad)", secrets) == "unauthorized: *** (bad)"
    assert mask_response(f"bad {echo[:12]}", secrets, 200, cut=True) == "bad ***"
    assert mask_response(f"saw ..{echo[3:15]}.. there", secrets) == "saw ..***.. there"


def test_a_misreading_the_token_cannot_take_is_skipped() -> None:
    """€ has no Latin-1 byte, and Windows-1252 leaves 0x81 undefined (Á is C3 81): such
    a misreading does not exist, and the token's other forms are still made."""
    for token in (EURO, "Áccess-tökén-0123456789"):
        forms = secret_forms(token)
        assert mask_response(f"x {token} {quote(token, safe='')} y", forms) == "x *** *** y"


# Issue 29, F6: the same tokens as an endpoint that escapes HTML, normalises Unicode or
# prints bytes gives them back. DECOMPOSED is sent with its accents as combining marks;
# LIGATURE holds characters NFKC replaces; SPECIAL is ASCII with HTML's own characters.
DECOMPOSED = unicodedata.normalize("NFD", "dëcomposéd-tökén-0123456789")
LIGATURE = "ﬁle-tökén-①②-0123456789"
SPECIAL = "k3y&s3cr3t<x>\"q'-0123456789"
ESCAPED = {
    "html decimal entities": UMLAUT.encode("ascii", "xmlcharrefreplace").decode(),
    "html hex entities": "".join(c if c.isascii() else f"&#x{ord(c):x};" for c in UMLAUT),
    "html hex entities, upper-case": "".join(
        c if c.isascii() else f"&#X{ord(c):X};" for c in UMLAUT
    ),
    "html named entities": "".join(
        c if c.isascii() else f"&{codepoint2name[ord(c)]};" for c in UMLAUT
    ),
    "html.escape of an ascii token": html.escape(SPECIAL),
    "html.escape without quotes": html.escape(SPECIAL, quote=False),
    "html entities with &apos;": html.escape(SPECIAL).replace("&#x27;", "&apos;"),
    "html decimal entities for ascii": SPECIAL.replace("&", "&#38;").replace("<", "&#60;"),
    "nfd": unicodedata.normalize("NFD", UMLAUT),
    "nfc of a decomposed token": unicodedata.normalize("NFC", DECOMPOSED),
    "nfkc": unicodedata.normalize("NFKC", LIGATURE),
    "nfkd": unicodedata.normalize("NFKD", LIGATURE),
    "bytes repr of its utf-8": repr(UMLAUT.encode())[2:-1],
    "bytes repr of its latin-1": repr(UMLAUT.encode("latin-1"))[2:-1],
    "hex of its utf-8": UMLAUT.encode().hex(),
    "hex of its utf-8, upper-case": UMLAUT.encode().hex().upper(),
    "hex of an ascii token": SPECIAL.encode().hex(),
}


@pytest.mark.parametrize("how", sorted(ESCAPED))
def test_a_token_echoed_html_escaped_normalised_or_as_bytes_is_masked(how: str) -> None:
    """Issue 29, F6: whole, cut at the end of a read, or in part, none of it is kept."""
    echo = ESCAPED[how]
    assert echo not in (UMLAUT, DECOMPOSED, LIGATURE, SPECIAL)  # a spelling of its own
    secrets = secret_forms(UMLAUT, DECOMPOSED, LIGATURE, SPECIAL)
    assert mask_response(f"unauthorized: {echo} (bad)", secrets) == "unauthorized: *** (bad)"
    assert mask_response(f"bad {echo[:12]}", secrets, 200, cut=True) == "bad ***"
    assert mask_response(f"saw ..{echo[3:15]}.. there", secrets) == "saw ..***.. there"


def test_the_forms_of_a_token_are_computed_once() -> None:
    """The relay asks for a fact's token forms at each refusal it keeps: the same tuple."""
    assert secret_forms(UMLAUT, EURO) is secret_forms(UMLAUT, EURO)
