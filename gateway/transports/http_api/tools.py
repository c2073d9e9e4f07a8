"""The tool API of the HTTP front: `POST /v1/tools/{name}:call`, `GET /v1/tools`, and the same
under a named tool group (`/v1/groups/{group}/tools...`).

Endpoints only translate HTTP to and from ToolCall/Outcome; every decision is the pipeline's.
Bodies are checked here: size, UTF-8, JSON, no duplicate keys (a second `arguments` or `name`
must not smuggle a different call past the one the policy saw).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from audit.canon import sha256_hex
from gateway.core.call import BlockClass, Credentials, Decision, ToolCall
from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway
from gateway.stages.tier_gate import unserved
from gateway.transports.groups import Group, group_for, groups_from
from gateway.transports.http_api.common import (
    BadRequest,
    credentials_from,
    error_envelope,
    http_status,
    parse_json_body,
    read_body,
    request_id_from,
    retry_headers,
)

_CALL_FIELDS = {"arguments", "purpose", "disclosure_mode", "depth", "session_id", "idempotency_key", "approval_id", "dry_run"}


def call_body(raw: bytes, limit: int) -> dict[str, Any]:
    """The `:call` body as a checked JSON object: known fields only, the text ones strings, `dry_run` a bool."""
    body = parse_json_body(raw, limit)
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
    return body


def tool_call(tool: str, body: dict[str, Any], request_id: str, credentials: Credentials, group: str | None) -> ToolCall:
    """The call a checked `:call` body asks for."""
    return ToolCall(
        tool=tool,
        arguments=body.get("arguments"),
        request_id=request_id,
        credentials=credentials,
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


def tool_routes(gateway: Gateway, settings: Any = None, *, max_body_bytes: int) -> list[Route]:
    """The tool API over `gateway` (`settings`: its dharma.yaml, when opened from one: tool groups
    and the note that MCP upstreams are served at the MCP path)."""
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
            body = call_body(raw, max_body_bytes)
        except BadRequest as exc:
            refused = ToolCall(tool=tool, arguments=None, request_id=request_id, credentials=credentials_from(request), method="http/tools.call",
                               group=group)
            block = Decision.block(ErrorCode.INVALID_PARAMS, exc.message, BlockClass.SAFETY_CONTENT, stage="transport")
            governed = await gateway.govern(refused, refusal=block, request={"tool": tool, "body_sha256": sha256_hex(raw) if raw is not None else None})
            return JSONResponse(governed.response, status_code=400)
        call = tool_call(tool, body, request_id, credentials_from(request), group)
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

    return [
        Route("/v1/tools/{name}:call", call_tool, methods=["POST"]),
        Route("/v1/tools", list_tools, methods=["GET"]),
        Route("/v1/groups/{group}/tools/{name}:call", call_group_tool, methods=["POST"]),
        Route("/v1/groups/{group}/tools", list_group_tools, methods=["GET"]),
    ]


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
