"""The HTTP front (Starlette): the tool API, approvals, JWKS and health.

Endpoints only translate HTTP to and from ToolCall/Outcome; every decision is the pipeline's.
Bodies are checked here: size, UTF-8, JSON, no duplicate keys (a second `arguments` or `name`
must not smuggle a different call past the one the policy saw).
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Lifespan, Receive, Scope, Send

from audit.canon import sha256_hex
from gateway.core.call import BlockClass, Credentials, Decision, Outcome, Status, ToolCall
from gateway.core.errors import ErrorCode
from gateway.crypto import strict_json
from gateway.crypto.strict_json import StrictJSONError
from gateway.transports.http_auth import (
    HttpAuth,
    credentials_in,
    http_auth_options,
    protected_resource_routes,
    resource_url_for,
    route_path,
)
from gateway.core.gateway import ENVELOPE_VERSION, Gateway, new_request_id, rfc3339
from gateway.stages.tier_gate import unserved
from gateway.transports.groups import Group, group_for, groups_from

log = structlog.get_logger()


class BadRequest(Exception):
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


_CALL_FIELDS = {"arguments", "purpose", "disclosure_mode", "depth", "session_id", "idempotency_key", "approval_id", "dry_run"}


def build_app(
    gateway: Gateway,
    *,
    max_body_bytes: int = 2_097_152,
    lifespan: Lifespan[Starlette] | None = None,
    mcp: Any = None,
) -> Starlette:
    """The Starlette app over one Gateway; `lifespan` lets the server close the gateway on shutdown.

    `/mcp` (MCP Streamable HTTP) is mounted when `mcp` (a `McpHttpApp`) is given, or when the
    gateway was opened from Settings that name MCP upstreams (`type: mcp_http | mcp_stdio`).
    """
    settings = getattr(gateway, "settings", None)  # set by runtime.open_gateway
    if mcp is None and settings is not None:
        from gateway.transports.mcp_http.app import build_mcp_app

        mcp = build_mcp_app(gateway, settings, max_body_bytes=max_body_bytes)
    mcp_only = mcp_only_note(settings)
    groups = groups_from(settings)

    async def call_tool(request: Request) -> Response:
        return await govern_call(request, None)

    async def govern_call(request: Request, group: str | None, outside: Decision | None = None) -> Response:
        """One `:call`: the body checked, then governed (`outside`: refused as an unknown tool, for
        a tool outside the group the call came through)."""
        tool = request.path_params["name"]
        request_id = request_id_from(request)
        raw: bytes | None = None
        try:
            raw = await read_body(request, max_body_bytes)
            body = parse_json_body(raw, max_body_bytes)
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object like {\"arguments\": {...}}")
            unknown = set(body) - _CALL_FIELDS
            if unknown:
                raise BadRequest(f"unknown field(s) {', '.join(sorted(unknown))}; expected some of {', '.join(sorted(_CALL_FIELDS))}")
            for name in ("purpose", "disclosure_mode", "depth", "session_id", "idempotency_key", "approval_id"):
                if body.get(name) is not None and not isinstance(body[name], str):
                    raise BadRequest(f"`{name}` must be a string")
            if not isinstance(body.get("dry_run", False), bool):
                raise BadRequest("`dry_run` must be true or false")
        except BadRequest as exc:
            refused = ToolCall(tool=tool, arguments=None, request_id=request_id, credentials=credentials_from(request), method="http/tools.call",
                               group=group)
            block = Decision.block(ErrorCode.INVALID_PARAMS, exc.message, BlockClass.SAFETY_CONTENT, stage="transport")
            governed = await gateway.govern(refused, refusal=block, request={"tool": tool, "body_sha256": sha256_hex(raw) if raw is not None else None})
            return JSONResponse(governed.response, status_code=400)
        call = ToolCall(
            tool=tool,
            arguments=body.get("arguments"),
            request_id=request_id,
            credentials=credentials_from(request),
            purpose=body.get("purpose"),
            disclosure_mode=body.get("disclosure_mode"),
            depth=body.get("depth"),
            session_id=body.get("session_id"),
            idempotency_key=body.get("idempotency_key"),
            approval_id=body.get("approval_id"),
            dry_run=bool(body.get("dry_run", False)),
            method="http/tools.call",
            group=group,
        )
        governed = await gateway.govern(call, request={"tool": tool, "body": body}, refusal=outside)
        return JSONResponse(governed.response, status_code=http_status(governed.outcome), headers=retry_headers(governed.response))

    async def list_tools(request: Request) -> Response:
        return _listing(request, None)

    def _listing(request: Request, group: Group | None) -> Response:
        creds = credentials_from(request)
        if gateway.principal_for(creds) is None:
            return JSONResponse(error_envelope("", ErrorCode.UNAUTHENTICATED, "no valid API key"), status_code=401)
        tools = [t for t in gateway.tools_for(creds) if group is None or group.has(t.name)]
        listing: dict[str, Any] = {
            "tools": [
                {"name": t.name, "description": t.description, "inputSchema": t.input_schema, "annotations": t.annotations}
                for t in tools
            ]
        }
        if mcp_only is not None:
            listing["mcp"] = mcp_only
        return JSONResponse(listing)

    def _group(request: Request) -> Group | Response:
        """The group the path names, if the caller may use it; else the answer (401 without a
        principal, 404 for a group that does not exist or is not theirs: told apart by nobody)."""
        principal = gateway.principal_for(credentials_from(request))
        if principal is None:
            return JSONResponse(error_envelope("", ErrorCode.UNAUTHENTICATED, "no valid API key"), status_code=401)
        name = request.path_params["group"]
        group = group_for(groups, name, principal)
        if group is None:
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, f"unknown tool group {name!r}"), status_code=404)
        return group

    async def list_group_tools(request: Request) -> Response:
        group = _group(request)
        return group if isinstance(group, Response) else _listing(request, group)

    async def call_group_tool(request: Request) -> Response:
        group = _group(request)
        if isinstance(group, Response):
            return group
        tool = request.path_params["name"]
        return await govern_call(request, group.name, None if group.has(tool) else unserved(tool))

    def approver(request: Request) -> str | None:
        principal = gateway.principal_for(credentials_from(request))
        if principal is None or not ({"admin", "approver"} & set(principal.roles)):
            return None
        return principal.id

    async def list_approvals(request: Request) -> Response:
        if approver(request) is None:
            return JSONResponse(error_envelope("", ErrorCode.FORBIDDEN, "approvals need a principal with role approver or admin"), status_code=403)
        items = await gateway.approvals.pending(time.time())
        return JSONResponse({"approvals": [_approval_json(a) for a in items]})

    async def decide_approval(request: Request) -> Response:
        who = approver(request)
        if who is None:
            return JSONResponse(error_envelope("", ErrorCode.FORBIDDEN, "approvals need a principal with role approver or admin"), status_code=403)
        approval_id, verb = request.path_params["id"], request.path_params["verb"]
        if verb not in ("approve", "deny"):
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, f"unknown action {verb!r}: use :approve or :deny"), status_code=404)
        try:
            body = parse_json_body(await read_body(request, max_body_bytes), max_body_bytes)
        except BadRequest as exc:
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, str(exc)), status_code=400)
        reason = body.get("reason", "") if isinstance(body, dict) else None
        if not isinstance(reason, str):
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, 'the body, if any, must be a JSON object with an optional text "reason"'), status_code=400)
        try:
            item = await gateway.decide(approval_id, approve=verb == "approve", by=who, via="http", reason=reason)
        except KeyError:
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, f"unknown approval {approval_id}"), status_code=404)
        except PermissionError as exc:
            return JSONResponse(error_envelope("", ErrorCode.FORBIDDEN, str(exc)), status_code=403)
        except ValueError as exc:
            return JSONResponse(error_envelope("", ErrorCode.INVALID_PARAMS, str(exc)), status_code=409)
        log.info("approval.decided", approval_id=approval_id, state=item.state, by=who)
        return JSONResponse({"approval": _approval_json(item)})

    async def jwks(request: Request) -> Response:
        return JSONResponse(gateway.keys.jwks(), headers={"cache-control": "public, max-age=300"})

    async def healthz(request: Request) -> Response:
        """200 when every dependency answers, else 503 naming what is down (`dependencies`). A failed
        policy reload is "degraded" with 200: the last good policy still serves (`policy_status`)."""
        deps = await gateway.health()
        down = {name: why for name, why in deps.items() if why is not None}
        policy = gateway.policy_status()
        body = {
            "status": "degraded" if down or policy.state != "ok" else "ok",
            "policy": policy.name,
            "policy_version": policy.version,
            "policy_status": policy.model_dump(),
            "dependencies": {name: {"status": "down", "error": why} if why else {"status": "up"} for name, why in deps.items()},
        }
        problems = [*down.values(), *([f"policy reload failed, serving the last good policy: {policy.last_reload.error}"]
                                      if policy.state != "ok" and policy.last_reload else [])]
        if problems:
            body["message"] = "; ".join(problems)
        return JSONResponse(body, status_code=503 if down else 200)

    routes = [
        Route("/v1/tools/{name}:call", call_tool, methods=["POST"]),
        Route("/v1/tools", list_tools, methods=["GET"]),
        Route("/v1/groups/{group}/tools/{name}:call", call_group_tool, methods=["POST"]),
        Route("/v1/groups/{group}/tools", list_group_tools, methods=["GET"]),
        Route("/v1/approvals", list_approvals, methods=["GET"]),
        Route("/v1/approvals/{id}:{verb}", decide_approval, methods=["POST"]),
        Route("/.well-known/jwks.json", jwks, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    from gateway.transports.http_api.audit import audit_routes

    routes += audit_routes(gateway)
    from gateway.transports.http_api.ops import ops_routes

    routes += ops_routes(gateway, settings)
    if mcp is not None:
        path = getattr(getattr(getattr(gateway, "settings", None), "mcp", None), "path", "/mcp")
        routes.append(Route(path, mcp))  # a pure ASGI app: SSE is streamed, never buffered
        routes.append(Route(path + "/{group}", mcp))  # the named tool groups (`McpHttpApp` reads the path)
        lifespan = _closing(mcp, lifespan)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("http.unhandled", path=request.url.path)
        return JSONResponse(error_envelope("", ErrorCode.INTERNAL_ERROR, "internal error; the call was not forwarded"), status_code=500)

    async def client_gone(request: Request, exc: Exception) -> Response:
        """The client went away mid-body (or `dharma serve` cut it off at a body deadline): nobody
        to answer and nothing wrong with the gateway, so no error line (a client could write one
        per connection)."""
        return Response(status_code=400)

    middleware: list[Middleware] = []
    direct: Any = mcp  # what serves the MCP path without Starlette's layers
    if settings is not None:
        auth = settings.auth
        routes += protected_resource_routes(
            resource_url_for(auth, settings.server, settings.mcp.path), auth.authorization_servers, auth.scopes_supported
        )
        guard = HttpAuth(
            mcp,
            **http_auth_options(settings, resolve=gateway.principal_for),
            error_body=lambda code, message: error_envelope("", code, message),
            refusals=gateway.refusals,
        )
        middleware.append(Middleware(guard.around))
        direct = guard if mcp is not None else None
    from gateway.transports.ui import UiSessions, ui_routes

    routes += ui_routes(gateway, guard if settings is not None else None,
                        allowed_origins=settings.auth.allowed_origins if settings is not None else (),
                        sessions=UiSessions(getattr(gateway, "ui_session_store", None)),  # Redis: set by open_gateway
                        oidc=settings.ui.oidc if settings is not None else None)
    app = HttpFront(routes=routes, middleware=middleware, exception_handlers={ClientDisconnect: client_gone, Exception: server_error}, lifespan=lifespan)
    if direct is not None:
        app.direct_path, app.direct = path, direct
    return app


class HttpFront(Starlette):
    """The Starlette app, with the MCP path served straight by its endpoint (behind the one
    authentication check): the per-request layers (error and exception middleware, routing) cost
    every `/mcp` call CPU and do nothing for a pure ASGI endpoint that answers its own errors."""

    direct_path: str | None = None
    direct: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.direct is not None and _under(route_path(scope), self.direct_path):
            scope["app"] = self
            try:
                await self.direct(scope, receive, send)
            except Exception:  # the endpoint answers its own errors; this is a bug: log it, uvicorn answers 500
                log.exception("http.unhandled", path=scope["path"])
                raise
            return
        await super().__call__(scope, receive, send)


def _under(path: str, base: str | None) -> bool:
    """Whether `path` is the MCP path or a group below it (`/mcp/{group}`)."""
    return base is not None and (path == base or (path.startswith(base) and path[len(base):len(base) + 1] == "/"))


def mcp_only_note(settings: Any) -> dict[str, Any] | None:
    """What `GET /v1/tools` says about MCP upstreams: their tools are not on `/v1` (the tool API
    serves python and http upstreams); they are listed and called, per session, at the MCP path."""
    names = [u.id for u in getattr(settings, "upstreams", ()) if u.is_mcp]
    if not names:
        return None
    path = settings.mcp.path
    return {
        "endpoint": path,
        "upstreams": names,
        "note": f"tools of MCP upstreams ({', '.join(names)}) are not listed or callable here: "
                f"/v1 serves python and http upstreams only; use an MCP client at {path}",
    }


def _closing(mcp: Any, inner: Lifespan[Starlette] | None) -> Lifespan[Starlette]:
    """Run the MCP endpoint (its upstreams' background tasks) around `inner` (if any)."""
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        async with mcp.running():
            if inner is None:
                yield
            else:
                async with inner(app):
                    yield

    return lifespan


def _approval_json(a: Any) -> dict[str, Any]:
    return {
        "id": a.id,
        "principal": a.principal,
        "tool": a.tool,
        "argument_digest": a.argument_digest,
        "policy_version": a.policy_version,
        "request_id": a.request_id,
        "reason": a.reason,
        "state": a.state,
        "decided_by": a.decided_by,
        "created_at": rfc3339(a.created_at),
        "expires_at": rfc3339(a.expires_at),
        "arguments_preview": a.arguments_preview,
    }
