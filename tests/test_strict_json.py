"""The one strict JSON decoder (gateway/crypto/strict_json.py) and the loaders that use it:
every refusal is a StrictJSONError naming what is wrong, never a RecursionError or a value that
crashes whoever writes it back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.core.errors import ConfigError
from gateway.crypto import strict_json
from gateway.crypto.keys import KeyStore
from gateway.crypto.receipts import ReceiptInvalid, load_jwks, verify_receipt
from gateway.crypto.strict_json import MAX_DEPTH, StrictJSONError
from gateway.mcp import jsonrpc


@pytest.mark.parametrize("data, kind, words", [
    (b"[" * 5000, "depth", f"deeper than {MAX_DEPTH} levels"),
    (b'{"a":' * 3000 + b"1" + b"}" * 3000, "depth", f"deeper than {MAX_DEPTH} levels"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "depth", "(the limit)"),
    (b'{"id":"\\ud800"}', "surrogate", "lone surrogate U+D800"),
    (b'["ok","\\udfff"]', "surrogate", "U+DFFF"),
    (b'{"\\ud800":1}', "surrogate", "member name"),
    (b'"\\ude00\\ud83d"', "surrogate", "U+"),  # a pair in the wrong order is two lone halves
    ('"\ud800"', "surrogate", "the text"),  # a str handed in with a raw surrogate
    (b'{"a":1,"a":2}', "duplicate", "'a'"),
    (b'[{"x":{"y":1,"y":1}}]', "duplicate", "'y'"),
    (b"NaN", "constant", "NaN"),
    (b'{"n":-Infinity}', "constant", "-Infinity"),
    (b"[1e400]", "number", "out of the range of a double"),
    (b"[-1e999]", "number", "out of the range"),
    (b"9" * 5000, "number", "more than 4300 digits"),
    (b"\xef\xbb\xbf{}", "bom", "byte order mark"),
    (b"\xff{}", "encoding", "offset 0"),
    (b'{"a":"\xed\xa0\x80"}', "encoding", "not UTF-8"),  # a surrogate encoded as UTF-8 bytes
    (b'{"a":', "syntax", "line 1 column 6"),
    (b"{} {}", "syntax", "Extra data"),
    (b"", "syntax", "Expecting value"),
])
def test_refusals_name_what_is_wrong(data: bytes | str, kind: str, words: str) -> None:
    with pytest.raises(StrictJSONError) as caught:
        strict_json.loads(data)
    assert caught.value.kind == kind and words in caught.value.message, caught.value.message
    assert isinstance(caught.value, ValueError)  # callers that catch ValueError keep working


@pytest.mark.parametrize("data, value", [
    (b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, None),  # exactly the limit
    (b'{"a":"' + b"[" * 5000 + b'"}', {"a": "[" * 5000}),  # brackets inside strings do not nest
    (b'{"a":"\\"[[[[' + b"[" * 300 + b'"}', {"a": '"' + "[" * 304}),
    (b'"\\ud83d\\ude00"', "\U0001f600"),  # a surrogate pair is one character
    (b'"\\\\ud800"', "\\ud800"),  # an escaped backslash, not a surrogate
    (b'{"n":1e308,"m":-0.0,"i":12345678901234567890}', {"n": 1e308, "m": -0.0, "i": 12345678901234567890}),
    (b' \r\n\t{"a":[]}\r\n', {"a": []}),  # JSON whitespace includes CR
])
def test_accepts_what_is_json(data: bytes, value: object) -> None:
    decoded = strict_json.loads(data)
    if value is not None:
        assert decoded == value


def test_a_lower_limit_can_be_asked_for() -> None:
    assert strict_json.loads(b"[[1]]", max_depth=2) == [[1]]
    with pytest.raises(StrictJSONError, match="deeper than 2 levels"):
        strict_json.loads(b"[[[1]]]", max_depth=2)


def test_jsonrpc_loads_is_the_strict_decoder() -> None:
    for data in (b"[" * 5000, b'{"id":"\\ud800"}', b"[1e400]"):
        with pytest.raises(StrictJSONError):
            jsonrpc.loads(data)


def test_dumps_never_raises_on_a_lone_surrogate_the_gateway_built() -> None:
    """Only gateway-built values can hold one (the parser refuses them): it is escaped, losslessly."""
    data = jsonrpc.dumps({"text": "a\ud800b", "ok": "é"})
    assert data == b'{"text":"a\\ud800b","ok":"\\u00e9"}'
    assert json.loads(data) == {"text": "a\ud800b", "ok": "é"}
    assert jsonrpc.dumps({"ok": "é"}) == '{"ok":"é"}'.encode()


# ---- the loaders that use it ---------------------------------------------------------------


def test_receipts_refuse_duplicate_members(tmp_path: Path) -> None:
    """A receipt whose signed header says `kid` twice is refused (the old decoder kept the last)."""
    import base64

    keys = KeyStore.open(tmp_path / "keys")
    head = b'{"alg":"Ed25519","typ":"dharma-receipt+jws","kid":"x","kid":"' + keys.kid.encode() + b'"}'
    token = base64.urlsafe_b64encode(head).rstrip(b"=").decode() + ".eyJ2IjoxfQ.AAAA"
    with pytest.raises(ReceiptInvalid, match="header is not strict JSON: duplicate member name 'kid'"):
        verify_receipt(token, keys.jwks())


@pytest.mark.parametrize("content, words", [
    ('{"keys": [], "keys": [{"kty": "OKP"}]}', "duplicate member name 'keys'"),
    ("\ufeff" + '{"keys": []}', "byte order mark"),
    ('{"keys": [' * 200 + "]}" * 200, "deeper than"),
])
def test_jwks_files_are_read_strictly(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{path}: not valid JSON: .*{words}"):
        load_jwks(path)


def test_retired_key_file_is_read_strictly(tmp_path: Path) -> None:
    store = KeyStore.open(tmp_path)
    (store.directory / "retired.json").write_text('{"keys": [], "keys": []}')
    with pytest.raises(ConfigError, match="retired.json: not valid JSON: duplicate member name 'keys'"):
        KeyStore.open(tmp_path)
