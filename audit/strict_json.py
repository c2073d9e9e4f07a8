"""The one strict JSON decoder: I-JSON (RFC 7493) with a nesting bound. No I/O.

Every JSON text that comes from outside (JSON-RPC messages, HTTP bodies, JWT and receipt
segments, JWKS files, export bundles, the files the CLI reads) is decoded here, so one text
cannot mean two things to two parts of the gateway, and no text can crash the process that
reads it. It lives in `audit`, beside the canonical encoder (`audit.canon`), because the ledger
package imports nothing from `gateway`; the gateway imports it as `gateway.crypto.strict_json`.

- duplicate member names are refused (Python keeps the last value, other parsers the first);
- `NaN`, `Infinity`, `-Infinity` and numbers that overflow a double (`1e400` would become
  `inf`) are refused, as are integers longer than Python converts (4300 digits);
- strings must be Unicode: a lone surrogate escape (`"\\ud800"`) is refused, because it can be
  neither written back as UTF-8 nor canonicalised (RFC 8785), and would crash whoever echoes it;
- nesting of arrays and objects is bounded by `MAX_DEPTH`, checked before decoding, so a line of
  thousands of `[` is an error naming the limit rather than a RecursionError;
- the input is UTF-8 without a byte order mark (RFC 8259 §8.1: a BOM is not part of networked JSON).

Every refusal is one exception type, `StrictJSONError` (a `ValueError`), whose message says what
is wrong and where, and whose `kind` lets a caller pick its own error code.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from typing import Any

import msgspec

#: Deepest nesting of arrays/objects accepted. Far above what MCP messages and JSON Schemas use
#: (the sanitizer's own argument limit is 32) and far below Python's recursion limit.
MAX_DEPTH = 128

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BOM = "\ufeff"


class StrictJSONError(ValueError):
    """A JSON text the gateway refuses. `kind` is one of: encoding, bom, syntax, depth,
    duplicate, constant, number, surrogate; `key` is the duplicated member name, if any."""

    def __init__(self, kind: str, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJSONError("duplicate", f"duplicate member name {key!r}", key=key)
            seen.add(key)
    return out


def _constant(name: str) -> Any:
    raise StrictJSONError("constant", f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError("number", f"number {text[:32]} is out of the range of a double")
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_constant, parse_float=_finite)
_SCAN = _DECODER.scan_once  # the C scanner, with the same hooks
_SPACE = " \t\n\r"  # JSON's whitespace (RFC 8259 §2), what `decode` skips around the value


def loads(data: bytes | bytearray | memoryview | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Decode one JSON text strictly (see the module docstring).

    Raises:
        StrictJSONError: the message names what is wrong (and the line and column for syntax).
    """
    if type(data) is bytes and b"\\u" not in data and data.count(b"[") + data.count(b"{") <= max_depth:
        value = _compact(data)
        if value is not _NOT_COMPACT:
            return value
    text = _text(data)
    if text.startswith(_BOM):
        raise StrictJSONError("bom", "a byte order mark (U+FEFF) precedes the JSON text")
    check_depth(text, max_depth)
    try:  # the scanner `decode` wraps, called directly (see `_decode`)
        start = len(text) - len(text.lstrip(_SPACE)) if text[:1] in _SPACE else 0
        value, end = _SCAN(text, start)
    except StrictJSONError:
        raise
    except (StopIteration, ValueError, RecursionError):  # `decode` says what is wrong
        value = _decode(text, max_depth)
    else:
        if end != len(text) and text[end:].strip(_SPACE):  # data after the value: `decode` names it
            value = _decode(text, max_depth)
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        _refuse_surrogates(value)
    return value


_NOT_COMPACT = object()
_FAST_DECODE = msgspec.json.Decoder().decode
_FAST_ENCODE = msgspec.json.Encoder().encode


def _compact(data: bytes) -> Any:
    """The value of `data` if it is exactly msgspec's own compact encoding of it, else `_NOT_COMPACT`.

    The fast path of `loads` (~4 µs against ~17 for a small JSON-RPC message), for what SDKs and the
    gateway write: msgspec's C decoder keeps the last of duplicate members and reads what this module
    refuses, but the encoding of a decoded value never holds a duplicate member, `NaN`, an overflowed
    number or a BOM, so a text equal to it byte for byte holds none either. `loads` comes here only
    for bytes without `\\u` escapes (no lone surrogate) and with fewer brackets than the depth limit;
    anything else, or any difference, takes the full path, which names what is wrong.
    """
    try:
        value = _FAST_DECODE(data)
        if _FAST_ENCODE(value) == data:
            return value
    except Exception:  # noqa: BLE001 - whatever msgspec refuses, the full path decides and names
        pass
    return _NOT_COMPACT


def _decode(text: str, max_depth: int) -> Any:
    """`JSONDecoder.decode` (JSON whitespace around the value; its errors become StrictJSONError).

    `loads` calls the scanner it wraps directly first, and comes here only for a text that does
    not decode (to raise what `decode` says): `decode` costs ~0.6 µs more a text (two whitespace
    matches, `raw_decode`), and a text decodes to the same value either way.
    """
    try:
        return _DECODER.decode(text)
    except StrictJSONError:
        raise
    except json.JSONDecodeError as exc:
        raise StrictJSONError("syntax", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise StrictJSONError("depth", f"nesting too deep to decode (the limit is {max_depth} levels)") from None
    except ValueError:  # an integer past Python's int-conversion digit limit
        raise StrictJSONError("number", f"an integer has more than {sys.get_int_max_str_digits()} digits") from None


def _text(data: bytes | bytearray | memoryview | str) -> str:
    if isinstance(data, str):
        if has_surrogate(data):
            raise _surrogate_error("the text", data)
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError("encoding", f"not UTF-8 (invalid byte at offset {exc.start})") from None


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse `text` if its arrays/objects nest deeper than `max_depth`, without decoding it.

    Brackets inside strings do not count. Cheap when the text has fewer brackets than the limit.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if brackets and max(itertools.accumulate(map(_STEP.__getitem__, brackets))) > max_depth:
        raise StrictJSONError("depth", f"arrays and objects nest deeper than {max_depth} levels (the limit)")


def has_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point (only a lone one can survive decoding)."""
    return _SURROGATE.search(text) is not None


def _surrogate_error(where: str, text: str) -> StrictJSONError:
    found = _SURROGATE.search(text)
    code = ord(found.group()) if found else 0
    return StrictJSONError("surrogate", f"{where} holds a lone surrogate U+{code:04X} (not Unicode)")


def _refuse_surrogates(value: Any) -> None:
    """Walk a decoded value; the content itself never goes into the message (it may be a secret)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, member in item.items():
                if has_surrogate(key):
                    raise _surrogate_error("a member name", key)
                stack.append(member)
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and has_surrogate(item):
            raise _surrogate_error("a string", item)
