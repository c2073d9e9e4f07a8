"""Strict JSON-RPC 2.0 parsing and error builders for the MCP proxy. No I/O.

`parse(line)` turns one framed message (one stdio line, one HTTP body) into a `Parsed` value:
a request, a notification, a response, a batch of those, or an `Invalid` carrying the error the
sender must get back. It never raises. JSON is decoded by the gateway's one strict decoder
(`gateway.crypto.strict_json`: no duplicate keys, no NaN/Infinity, bounded nesting, valid
Unicode); what it refuses becomes -32700 Parse error, except duplicate keys and lone surrogates
(valid JSON grammar, a meaningless message), which are -32600 Invalid Request answered to the
message's id only when that id can be echoed safely, else to `id: null`. Ids must be strings or
integers (never null, floats or booleans), and `jsonrpc` must be exactly "2.0". `dumps` never
raises on anything `parse` accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgspec

from audit.canon import plain
from gateway.crypto import strict_json
from gateway.crypto.strict_json import StrictJSONError

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
#: Our own code for "the upstream server failed"; outside the reserved -32768..-32000 range.
BACKEND_FAILED = -31001
#: Our own code for "a bounded resource of the gateway is full" (open sessions, server processes):
#: HTTP 429 with Retry-After; `data.limit` names the setting. -31002 is /mcp's "unauthorized".
LIMIT_REACHED = -31003

RpcId = str | int


def loads(data: bytes | str) -> Any:
    """Decode JSON with the gateway's one strict decoder. Raises StrictJSONError (a ValueError)."""
    return strict_json.loads(data)


#: Compact encoders built once: `json.dumps` with keyword arguments builds a `JSONEncoder` on every
#: call, a microsecond of the few per message the proxy writes.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


#: msgspec's encoder writes the same bytes as `_COMPACT` for a `plain` value (string keys; strings,
#: booleans, null and integers within ±2**53: no float, whose exponent it writes another way) in an
#: eighth of the time. `dumps` writes every answer and every forwarded call.
_FAST = msgspec.json.Encoder().encode


def dumps(message: Any) -> bytes:
    """Compact UTF-8 JSON, as the SDKs write it (non-ASCII kept as is).

    Never raises on a value `loads` accepted. A lone surrogate (only a value the gateway built
    itself can hold one) is written as its `\\uXXXX` escape rather than crashing the writer.
    """
    if plain(message):
        try:
            return _FAST(message)
        except UnicodeEncodeError:  # a lone surrogate: the escape below
            pass
    try:
        return _COMPACT(message).encode("utf-8")
    except UnicodeEncodeError:
        return _COMPACT_ASCII(message).encode("ascii")


def recover_id(line: bytes) -> RpcId | None:
    """The id of a message whose handling failed, when it can be read (else None)."""
    try:
        value = loads(line)
    except Exception:
        return sniff_id(line)
    rpc_id = value.get("id") if isinstance(value, dict) else None
    return rpc_id if valid_id(rpc_id) else None


def valid_id(value: Any) -> TypeGuard[RpcId]:
    """A JSON-RPC id as MCP allows it: a string or an integer (never null, a float or a boolean)."""
    return (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)))


@dataclass(frozen=True, slots=True)
class Request:
    id: RpcId
    method: str
    params: Any
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: Any
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    id: RpcId | None
    message: dict[str, Any]

    @property
    def is_error(self) -> bool:
        return "error" in self.message


@dataclass(frozen=True, slots=True)
class Invalid:
    """A message that must not travel on: `error` is the JSON-RPC error to send back to `id`."""

    id: RpcId | None
    code: int
    reason: str
    method: str | None = None


Single = Request | Notification | Response | Invalid


@dataclass(frozen=True, slots=True)
class Batch:
    items: tuple[Single, ...] = field(default_factory=tuple)


Parsed = Single | Batch


_ID_PREFIX = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


def sniff_id(prefix: bytes) -> RpcId | None:
    """The id of a message we will not parse (too large), when it is written first, else None."""
    m = _ID_PREFIX.match(prefix[:4096])
    if not m:
        return None
    try:
        value = loads(m.group(1))
    except StrictJSONError:
        return None
    return value if valid_id(value) else None


def classify(obj: Any) -> Single:
    """Classify one decoded JSON value as a request, notification, response or invalid message."""
    if not isinstance(obj, dict):
        return Invalid(None, INVALID_REQUEST, f"Invalid Request: a JSON-RPC message must be an object, not {kind(obj)}")
    raw_id = obj.get("id")
    rpc_id = raw_id if valid_id(raw_id) else None
    if obj.get("jsonrpc") != "2.0":
        what = "missing" if "jsonrpc" not in obj else f"{obj['jsonrpc']!r}"
        return Invalid(rpc_id, INVALID_REQUEST, f'Invalid Request: "jsonrpc" must be "2.0" (got {what})')
    if "method" in obj:
        method = obj["method"]
        if not isinstance(method, str) or not method:
            return Invalid(rpc_id, INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string')
        if "result" in obj or "error" in obj:
            return Invalid(rpc_id, INVALID_REQUEST, "Invalid Request: a message cannot be both a request and a response")
        params = obj.get("params")
        if "params" in obj and not isinstance(params, (dict, list)):
            return Invalid(rpc_id, INVALID_REQUEST, 'Invalid Request: "params" must be an object or an array', method)
        if "id" not in obj:
            return Notification(method, params, obj)
        if not valid_id(raw_id):
            return Invalid(None, INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer', method)
        return Request(raw_id, method, params, obj)
    if "result" in obj or "error" in obj:
        if ("result" in obj) == ("error" in obj):
            return Invalid(None, INVALID_REQUEST, "Invalid Request: a response has exactly one of result and error")
        if raw_id is not None and not valid_id(raw_id):
            return Invalid(None, INVALID_REQUEST, 'Invalid Request: response "id" must be a string or an integer')
        return Response(raw_id, obj)
    return Invalid(rpc_id, INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response")


def parse(data: bytes | str) -> Parsed:
    """Parse one framed message strictly (see module docstring)."""
    try:
        obj = loads(data)
    except StrictJSONError as exc:
        if exc.kind == "duplicate":
            return Invalid(_top_level_id(data), INVALID_REQUEST, f"Invalid Request: duplicate key {exc.key!r} in the message")
        if exc.kind == "surrogate":
            return Invalid(_top_level_id(data), INVALID_REQUEST, f"Invalid Request: {exc.message}; strings must be valid Unicode")
        return Invalid(None, PARSE_ERROR, f"Parse error: {exc.message}")
    if isinstance(obj, list):
        if not obj:
            return Invalid(None, INVALID_REQUEST, "Invalid Request: empty batch")
        return Batch(tuple(classify(item) for item in obj))
    return classify(obj)


class _Members(list):  # type: ignore[type-arg]
    """An object's members as decoded leniently: (name, value) pairs, duplicates kept."""


def _members(data: bytes | str) -> _Members | None:
    """The top-level members of a message the strict decoder refused for a duplicate key or a
    lone surrogate, decoded leniently; None when it is not an object or not JSON at all."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        strict_json.check_depth(text)
        obj = json.loads(text, object_pairs_hook=_Members)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, _Members) else None


def _echoable_id(members: _Members | None) -> RpcId | None:
    """The message's id when it is neither duplicated nor holds a lone surrogate, so echoing it
    is safe; else None (JSON-RPC answers a message whose id cannot be known with `id: null`)."""
    ids = [value for name, value in members or () if name == "id"]
    if len(ids) != 1 or not valid_id(ids[0]):
        return None
    return None if isinstance(ids[0], str) and strict_json.has_surrogate(ids[0]) else ids[0]


def _top_level_id(data: bytes | str) -> RpcId | None:
    return _echoable_id(_members(data))


def refused_answer_id(data: bytes | str) -> RpcId | None:
    """The id of a response (result or error, no method) that `parse` refused for a duplicate
    key or a lone surrogate: the request it answers can then be failed instead of waiting."""
    members = _members(data)
    names = {name for name, _ in members or ()}
    if "method" in names or not names & {"result", "error"}:
        return None
    return _echoable_id(members)


def kind(obj: Any) -> str:
    """How to name a JSON value's type in an error message ("an array", "null", ...)."""
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(obj), "a number" if isinstance(obj, (int, float)) else type(obj).__name__
    )


# ---- builders ---------------------------------------------------------------------------


def error(rpc_id: RpcId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": rpc_id, "error": body}


def result(rpc_id: RpcId | None, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": value}


def request(rpc_id: RpcId, method: str, params: Any = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def notification(method: str, params: Any = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg
