"""The 2026-07-28 routing headers (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`): check them against
the body, and compute them again for what the gateway forwards. Pure: no I/O.

The gateway decides on the body. A request whose headers say something else is refused
(-32020 HeaderMismatch, HTTP 400) so that nothing routing on the headers downstream can be told
a different story; and the headers it forwards are always recomputed from the forwarded body
(tool-name prefix removed, arguments as rewritten by the sanitizer), never copied.
Same rules and value codec as the spec and the SDK (`mcp/shared/inbound.py`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.mcp.versions import META_VERSION

PROTOCOL_VERSION = "mcp-protocol-version"
METHOD = "mcp-method"
NAME = "mcp-name"
PARAM_PREFIX = "mcp-param-"
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

_B64 = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")
_SAFE = re.compile(r"^[\x20-\x7E]*$")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def encode_value(value: str) -> str:
    if _SAFE.fullmatch(value) and value == value.strip() and not _B64.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def decode_value(value: str | None) -> str | None:
    if value is None:
        return None
    m = _B64.fullmatch(value)
    if m is None:
        return value
    try:
        raw = base64.b64decode(m.group("payload"), validate=True)
    except binascii.Error:
        return None
    if base64.b64encode(raw).decode("ascii") != m.group("payload"):
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def header_map(schema: Any) -> dict[tuple[str, ...], tuple[str, Any]] | None:
    """{property path: (header token, property type)} for `x-mcp-header` annotations reachable by a
    chain of `properties`; None when an annotation is invalid (clients then drop the tool)."""
    if not isinstance(schema, dict):
        return {}
    return _header_map(schema)


def _header_map(schema: dict[str, Any]) -> dict[tuple[str, ...], tuple[str, Any]] | None:
    out: dict[tuple[str, ...], tuple[str, Any]] = {}
    seen: set[str] = set()
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        token = node.get("x-mcp-header")
        if token is not None and path:
            if not isinstance(token, str) or not _TOKEN.fullmatch(token) or node.get("type") not in ("string", "integer", "boolean"):
                return None
            if token.lower() in seen:
                return None
            seen.add(token.lower())
            out[path] = (token, node.get("type"))
        props = node.get("properties")
        if isinstance(props, dict):
            stack.extend(((*path, k), v) for k, v in props.items())
    return out


def _at(arguments: Any, path: tuple[str, ...]) -> Any:
    node = arguments
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _render(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        try:
            return str(value)
        except ValueError:
            return None
    return None


def param_headers(schema: Any, arguments: Any) -> dict[str, str]:
    """The `Mcp-Param-*` headers a tools/call with these arguments must carry."""
    mapping = header_map(schema) or {}
    out: dict[str, str] = {}
    for path, (token, _type) in mapping.items():
        rendered = _render(_at(arguments, path))
        if rendered is not None:
            out[f"Mcp-Param-{token}"] = encode_value(rendered)
    return out


def _same(prop_type: Any, value: Any, rendered: str, decoded: str) -> bool:
    if prop_type == "integer" and not isinstance(value, bool) and isinstance(value, (int, float)) \
            and re.fullmatch(r"-?[0-9]+(\.0+)?", decoded):
        try:
            return float(value).is_integer() and int(decoded.partition(".")[0]) == int(value)
        except (ValueError, OverflowError):
            return False
    return decoded == rendered


def check(raw_headers: Iterable[tuple[str, str]], body: Mapping[str, Any], schema: Any = None) -> str | None:
    """Why the request's routing headers disagree with its body (a -32020 message), or None."""
    folded: dict[str, str] = {}
    dup: set[str] = set()
    for name, value in raw_headers:
        key = name.lower()
        if key in folded and (key in (PROTOCOL_VERSION, METHOD, NAME) or key.startswith(PARAM_PREFIX)):
            dup.add(key)
        folded[key] = value
    if dup:
        return f"{sorted(dup)[0]} header appears more than once"
    params = _obj(body.get("params"))
    meta = _obj(params.get("_meta"))
    if META_VERSION in meta and folded.get(PROTOCOL_VERSION) != meta[META_VERSION]:
        return "mcp-protocol-version header does not match the request envelope's protocol version"
    method = body.get("method")
    if folded.get(METHOD) != method:
        return "mcp-method header does not match the request body's method"
    field_name = NAME_BEARING.get(method) if isinstance(method, str) else None
    if field_name is not None and params.get(field_name) is not None and decode_value(folded.get(NAME)) != params.get(field_name):
        return f"mcp-name header does not match the request body's {field_name!r} parameter"
    if method == "tools/call" and schema is not None:
        mapping = header_map(schema)
        arguments = _obj(params.get("arguments"))
        for path, (token, prop_type) in (mapping or {}).items():
            raw = folded.get(PARAM_PREFIX + token.lower())
            value = _at(arguments, path)
            where = ".".join(path)
            rendered = _render(value) if value is not None else None
            if rendered is None:
                if raw is not None:
                    return f"Mcp-Param-{token} header is present but the request body's {where!r} argument is absent"
                continue
            if raw is None:
                return f"Mcp-Param-{token} header is missing but the request body's {where!r} argument is present"
            decoded = decode_value(raw)
            if decoded is None:
                return f"Mcp-Param-{token} header carries a malformed base64 sentinel value"
            if not _same(prop_type, value, rendered, decoded):
                return f"Mcp-Param-{token} header does not match the request body's {where!r} argument"
    return None


def forwarded(headers: Mapping[str, str], body: Mapping[str, Any], schema: Any = None) -> dict[str, str]:
    """`headers` with Mcp-Method/Mcp-Name/Mcp-Param-* recomputed from `body` (the forwarded one).

    Unrecognised `Mcp-Param-*` headers pass on untouched (an intermediary must forward them);
    those the tool's schema declares are always rebuilt from the arguments.
    """
    declared = {f"{PARAM_PREFIX}{t.lower()}" for t, _ in (header_map(schema) or {}).values()}
    out = {k: v for k, v in headers.items() if k.lower() not in (METHOD, NAME) and k.lower() not in declared}
    method = body.get("method")
    if isinstance(method, str):
        out["Mcp-Method"] = method
    params = _obj(body.get("params"))
    key = NAME_BEARING.get(method) if isinstance(method, str) else None
    if key is not None and isinstance(params.get(key), str):
        out["Mcp-Name"] = encode_value(params[key])
    if method == "tools/call" and schema is not None:
        out.update(param_headers(schema, params.get("arguments")))
    return out


def _obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}
