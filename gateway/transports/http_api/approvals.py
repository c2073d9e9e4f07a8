"""The approvals of the HTTP front: `GET /v1/approvals` (the pending held calls) and
`POST /v1/approvals/{id}:approve|:deny`, for principals with role `approver` or `admin`.

Deciding goes through `Gateway.decide`, the one approval path the CLI and `/ui` use.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway, rfc3339
from gateway.transports.http_api.common import BadRequest, credentials_from, error_envelope, parse_json_body, read_body

log = structlog.get_logger()


def approval_routes(gateway: Gateway, *, max_body_bytes: int) -> list[Route]:
    """The approval routes over `gateway` (a decision's body, at most `max_body_bytes`, may give a reason)."""

    def approver(request: Request) -> str | None:
        principal = gateway.principal_for(credentials_from(request))
        if principal is None or not ({"admin", "approver"} & set(principal.roles)):
            return None
        return principal.id

    async def list_approvals(request: Request) -> Response:
        if approver(request) is None:
            return JSONResponse(error_envelope("", ErrorCode.FORBIDDEN, "approvals need a principal with role approver or admin"), status_code=403)
        items = await gateway.approvals.pending(time.time())
        return JSONResponse({"approvals": [approval_json(a) for a in items]})

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
        return JSONResponse({"approval": approval_json(item)})

    return [
        Route("/v1/approvals", list_approvals, methods=["GET"]),
        Route("/v1/approvals/{id}:{verb}", decide_approval, methods=["POST"]),
    ]


def approval_json(a: Any) -> dict[str, Any]:
    """One approval as the API shows it (its arguments only as the store's redacted preview)."""
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
