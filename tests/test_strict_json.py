"""The one strict JSON decoder (gateway/crypto/strict_json.py) and the loaders that use it:
every refusal is a StrictJSONError naming what is wrong, never a RecursionError or a value that
crashes whoever writes it back."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import ConfigError
from audit import strict_json as audit_strict_json
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


# ---- the scanner called directly: the same value or the same refusal as `JSONDecoder.decode` ----


def _reference(data: bytes) -> object:
    """The decoder as it was (`JSONDecoder.decode` with a duplicate-refusing hook), for the checks
    `loads` makes while decoding: duplicates, constants, numbers, syntax, surrounding whitespace."""

    def unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out = dict(pairs)
        if len(out) != len(pairs):
            key = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
            raise StrictJSONError("duplicate", f"duplicate member name {key!r}", key=key)
        return out

    def finite(text: str) -> float:
        if not math.isfinite(float(text)):
            raise StrictJSONError("number", f"number {text[:32]} is out of the range of a double")
        return float(text)

    def constant(name: str) -> object:
        raise StrictJSONError("constant", f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")

    decoder = json.JSONDecoder(object_pairs_hook=unique, parse_constant=constant, parse_float=finite)
    try:
        return decoder.decode(data.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise StrictJSONError("syntax", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None


def _outcome(decode: Callable[[bytes], object], data: bytes) -> tuple[str, object]:
    try:
        value = decode(data)
    except StrictJSONError as exc:
        return exc.kind, (exc.message, exc.key)
    return "value", (value, json.dumps(value))  # the dump tells 1 from 1.0 and True from 1


@pytest.mark.parametrize("data", [
    b'{"a":1}', b' {"a":1}', b'{"a":1} ', b'\r\n\t {"a":[1, 2.5, "x"]}\n', b"  7  ", b'"s"\n',
    b" ", b"", b"\n\n", b'{"a":1} x', b'{"a":1}\n{"b":2}', b'{"a":1,}', b'[1,2', b'{"a" 1}', b"  nul",
    b'{"a":1,"a":2}', b' {"a":1,"a":2} ', b'[{"x":[{"y":{"z":1,"z":2}}]}]', b'{"a":1,"a":2} trailing',
    b'{"a":{"b":1,"b":2},"a":3}', b'  [1e400]', b"[NaN] ", b'{"k":"v","k":"v"}',
])
def test_loads_decodes_and_refuses_as_json_decode_does(data: bytes) -> None:
    assert _outcome(strict_json.loads, data) == _outcome(_reference, data)


_SPACE = st.text(alphabet=" \t\n\r", max_size=3)


@st.composite
def _json_texts(draw: st.DrawFn, depth: int = 3) -> str:
    """JSON-ish text with JSON whitespace anywhere and object members drawn from two names (so
    duplicates at every depth are common); sometimes not JSON at all."""
    kind = draw(st.sampled_from(["scalar", "list", "object", "object"] if depth else ["scalar"]))
    if kind == "scalar":
        return draw(st.sampled_from(["1", "-0", "2.5", "1e400", '"x"', '"a:b"', "true", "null", "NaN", "1 2", "", "[", '"\\u00e9"']))
    if kind == "list":
        items = draw(st.lists(_json_texts(depth - 1), max_size=3))
        return "[" + ",".join(draw(_SPACE) + i + draw(_SPACE) for i in items) + "]"
    members = draw(st.lists(st.tuples(st.sampled_from(["a", "b"]), _json_texts(depth - 1)), max_size=3))
    return "{" + ",".join(f'{draw(_SPACE)}"{k}"{draw(_SPACE)}:{draw(_SPACE)}{v}' for k, v in members) + "}"


@given(text=_json_texts(), before=_SPACE, after=_SPACE, junk=st.sampled_from(["", "", "", "x", "{}", ","]))
@settings(max_examples=400, deadline=None)
def test_loads_agrees_with_json_decode_on_generated_texts(text: str, before: str, after: str, junk: str) -> None:
    data = (before + text + after + junk).encode()
    assert _outcome(strict_json.loads, data) == _outcome(_reference, data)


@pytest.mark.parametrize("data", [
    b'{"a":1,"a":2}', b'[{"x":{"y":1,"y":1}}]', b'{"k":"v","k":"v"}', b"[1e400]", b"[NaN]", b"[-Infinity]",
    b"9" * 5000, b'{"a":"\xed\xa0\x80"}', b"\xef\xbb\xbf{}", b'{"a":1} x', b'{"a":1,}', b"-0", b"[1.0e2]",
])
def test_the_compact_fast_path_leaves_every_refusal_to_the_full_path(data: bytes) -> None:
    """msgspec (the fast path) keeps the last of duplicate members and reads some of what the strict
    decoder refuses; none of these is its own exact encoding, so the full path decides."""
    assert audit_strict_json._compact(data) is audit_strict_json._NOT_COMPACT


def test_compact_messages_take_the_fast_path() -> None:
    message = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"t":"hé","n":[1,2.5,true,null,-3]}}}'
    assert audit_strict_json._compact(message.encode()) == json.loads(message)


@given(text=_json_texts())
@settings(max_examples=400, deadline=None)
def test_the_fast_path_agrees_with_json_decode_on_compact_texts(text: str) -> None:
    data = text.encode()
    value = audit_strict_json._compact(data)
    if value is not audit_strict_json._NOT_COMPACT:
        assert _outcome(lambda _: value, data) == _outcome(_reference, data)
