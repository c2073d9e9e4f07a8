"""What the record of an auth-layer refusal says about the request (the edge half of
`gateway.core.refusals`): where it came from, what it asked for, and what kind of credential it
carried, never the credential itself, nor a hash of one.

Only the first refusal of a record is described: its body is read (at most `max_body_bytes`, for
at most `BODY_SECONDS`) for its SHA-256 and, on `/mcp`, its JSON-RPC method and tool name. Every
other refusal costs the recorder's counters alone, and is answered without its body being read.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
from starlette.types import Receive, Scope

from audit.canon import sha256_hex
from gateway.core.call import VerifiedJwt
from gateway.core.refusals import MAX_TEXT, RefusalRecorder, Seen
from gateway.crypto import strict_json
from gateway.crypto.jwt import TokenInvalid, claims_set, looks_like_jwt, split_jws
from gateway.crypto.strict_json import StrictJSONError

BODY_SECONDS = 5.0
"""How long the first refused request of a record may take to send its body (it is refused either way)."""
_TOOL_CALL = re.compile(r"/v1/tools/([^/]+):call")
TOOL_API_METHOD = "http/tools.call"


def bearer_of(authorization: list[str]) -> str | None:
    """The token of a lone `Authorization: Bearer <token>` header, else None."""
    if len(authorization) == 1 and authorization[0][:7].lower() == "bearer ":
        return authorization[0][7:].strip() or None
    return None


def credential_kind(authorization: list[str], api_keys: list[str], *, jwt: bool) -> str:
    """none, api_key (X-API-Key, or a bearer that is not a JWT the gateway checks), jwt, other (an
    Authorization scheme other than Bearer) or several (more than one credential header)."""
    if len(authorization) + len(api_keys) > 1:
        return "several"
    if api_keys:
        return "api_key"
    if not authorization:
        return "none"
    bearer = bearer_of(authorization)
    if bearer is None:
        return "other"
    return "jwt" if jwt and looks_like_jwt(bearer) else "api_key"


def token_hint(bearer: str | None, verified: VerifiedJwt | None) -> dict[str, Any] | None:
    """A JWT's `iss` and `sub` (truncated), and whether its signature was checked: who the token
    claims to be, which is no secret (the signature is the credential, and is never kept)."""
    if verified is not None:
        claims, ok = verified.claims, True
    else:
        try:
            claims, ok = claims_set(split_jws(bearer or "")[1]), False
        except TokenInvalid:
            return None
    return {name: _short(claims.get(name)) for name in ("iss", "sub")} | {"verified": ok}


def _short(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def client_address(scope: Scope) -> str:
    """The client's address as the server saw it (a trusted proxy's `X-Forwarded-For` applied by uvicorn)."""
    client = scope.get("client")
    return str(client[0])[:64] if client else "unknown"


async def read_body(receive: Receive, limit: int, seconds: float = BODY_SECONDS) -> tuple[bytes | None, int]:
    """(the whole body, or None when it is over `limit`, cut short or late; the bytes received)."""
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(seconds):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                break
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), size
    return None, size


def call_of(path: str, body: bytes | None) -> tuple[str | None, str | None]:
    """(method, tool) a request asked for: the tool API's from its path, MCP's from its JSON-RPC body
    (in a batch: the first message's method and the first `tools/call`'s tool)."""
    found = _TOOL_CALL.fullmatch(path)
    if found is not None:
        return TOOL_API_METHOD, found.group(1)[:MAX_TEXT]
    if not body:
        return None, None
    try:
        parsed = strict_json.loads(body)
    except StrictJSONError:
        return None, None
    messages = [m for m in (parsed if isinstance(parsed, list) else [parsed]) if isinstance(m, dict)]
    methods = [m.get("method") for m in messages]
    method = _short(methods[0]) if methods else None
    calls = [m.get("params") for m, name in zip(messages, methods, strict=True) if name == "tools/call"]
    tool = next((_short(p.get("name")) for p in calls if isinstance(p, dict) and isinstance(p.get("name"), str)), None)
    return method, tool


async def record_refusal(recorder: RefusalRecorder, scope: Scope, receive: Receive | None, *, reason: str, status: int,
                         error_code: str, authorization: list[str], api_keys: list[str], jwt: bool,
                         verified: VerifiedJwt | None = None, max_body_bytes: int = 0) -> None:
    """Count a refusal; when it starts a record, describe it (reading its body unless `receive` is
    None: a login form's body holds the credential) and hand it back."""
    span = recorder.note(client_address(scope), reason)
    if span is None:
        return
    try:
        credential = credential_kind(authorization, api_keys, jwt=jwt)
        path = scope["path"]
        span.seen = seen = Seen(
            request=f"{scope['method']} {path}"[:MAX_TEXT], http_status=status, error_code=error_code, credential=credential,
            token=token_hint(bearer_of(authorization), verified) if credential == "jwt" else None)
        body = None
        if receive is not None:
            body, seen.body_bytes = await read_body(receive, max_body_bytes)
            seen.body_sha256 = sha256_hex(body) if body is not None else None
        seen.method, seen.tool = call_of(path, body)
    finally:
        recorder.ready(span)
