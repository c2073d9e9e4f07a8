"""What the HTTP front's routers share: body reading and strict JSON, the caller's request id and
credentials, and the error envelope with its HTTP status and `Retry-After`.

Its own module so that the routers (`tools`, `approvals`, `health`, `audit`, `ops`, the `/ui`
pages) import it and never the app factory that mounts them (`http_api.app`).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from starlette.requests import Request

from gateway.core.call import Credentials, Outcome, Status
from gateway.core.errors import ErrorCode
from gateway.core.gateway import ENVELOPE_VERSION, new_request_id, rfc3339
from gateway.crypto import strict_json
from gateway.crypto.strict_json import StrictJSONError
from gateway.transports.http_auth import credentials_in


class BadRequest(Exception):
    """A request body the front refuses with 400, `message` naming what was wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def parse_json_body(raw: bytes, limit: int) -> Any:
    """Strict JSON (the gateway's one decoder): at most `limit` bytes, UTF-8, no duplicate keys,
    no NaN/Infinity, bounded nesting, valid Unicode. An empty body is `{}`."""
    if len(raw) > limit:
        raise BadRequest(f"request body is {len(raw)} bytes; the limit is {limit}")
    if not raw.strip():
        return {}
    try:
        return strict_json.loads(raw)
    except StrictJSONError as exc:
        if exc.kind == "duplicate":
            raise BadRequest(f"duplicate JSON key {exc.key!r}") from None
        raise BadRequest(f"request body is not valid JSON: {exc.message}") from None


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused as soon as it is known to exceed `limit` (never buffered past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"request body is {int(declared)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def request_id_from(request: Request) -> str:
    """The caller's `X-Request-ID` when it is a sane token (it goes into the ledger and receipt), else a new id."""
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.fullmatch(given) else new_request_id()


def credentials_from(request: Request) -> Credentials:
    """What the auth middleware resolved (API key, verified JWT, local user), else the headers."""
    given = credentials_in(request.scope)
    if given is not None:
        return given
    key = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if not key and auth[:7].lower() == "bearer ":
        key = auth[7:].strip()
    return Credentials(api_key=key or None)


def error_envelope(tool: str, code: ErrorCode, message: str, request_id: str | None = None) -> dict[str, Any]:
    return {
        "status": Status.ERROR.value,
        "tool": tool,
        "request_id": request_id or new_request_id(),
        "idempotency_key": None,
        "message": message,
        "error_code": code.value,
        "retryable": code.retryable,
        "retry_after": None,
        "approval_id": None,
        "result": None,
        "warnings": [],
        "timestamp": rfc3339(time.time()),
        "envelope_version": ENVELOPE_VERSION,
    }


def http_status(outcome: Outcome) -> int:
    if outcome.status is Status.PENDING_APPROVAL:
        return 202
    if outcome.error_code is None:
        return 200
    return outcome.error_code.http_status


def retry_headers(envelope: dict[str, Any]) -> dict[str, str]:
    """`Retry-After` (whole seconds, rounded up) for rate-limited and unavailable answers."""
    wait = envelope.get("retry_after")
    if isinstance(wait, (int, float)) and wait > 0:
        return {"retry-after": str(math.ceil(wait))}
    return {}
