"""`/ui/approvals` (approver, admin): the pending held calls, newest first, kept current over
server-sent events by reading the approval store (shared by replicas and the CLI); approve or deny
goes through `Gateway.decide`, the one approval path the CLI and `/v1/approvals` use."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.core.call import Effect
from gateway.core.gateway import rfc3339
from gateway.policy.compile import CompiledPolicy, glob_match
from gateway.stages.approval import ApprovalRefused
from gateway.stores.base import Approval
from gateway.transports.ui.web import APPROVE_ROLES, HEADERS, PREFIX, Refused, Ui, pretty_json

log = structlog.get_logger()

POLL_SECONDS = 1.0
"""How often an open approvals page's event stream reads the approval store."""
STREAM_SECONDS = 60.0
"""An event stream ends after this long and the browser reconnects (so a stopping server never waits on one)."""
KEEPALIVE_SECONDS = 15.0


def arguments_text(preview: str) -> tuple[str, bool]:
    """The approval's stored, redacted arguments, indented when whole; True when the store cut them short."""
    try:
        return pretty_json(json.loads(preview)), False
    except ValueError:
        return preview, bool(preview)


def holding_rules(policy: CompiledPolicy, a: Approval, message: str) -> list[str]:
    """The rules of the loaded policy that hold `a`'s tool with exactly this message, as `id (file:line)`.

    The approval store keeps the held call's messages, not its rule ids, so they are found again
    here, and only under the policy version the call was held by (else none is named)."""
    if policy.version != a.policy_version:
        return []
    return [f"{r.id} ({r.file}:{r.line})" for r in policy.rules
            if r.effect is Effect.REQUIRE_APPROVAL and r.message == message and any(glob_match(a.tool, g) for g in r.tools)]


def approval_view(a: Approval, now: float, policy: CompiledPolicy) -> dict[str, Any]:
    """What the page shows of one held call."""
    args, cut = arguments_text(a.arguments_preview)
    messages = [part for part in a.reason.split("; ") if part] or ["(no message)"]
    return {
        "id": a.id, "principal": a.principal, "tool": a.tool, "arguments": args, "cut": cut,
        "reasons": [(message, holding_rules(policy, a, message)) for message in messages],
        "policy_version": a.policy_version, "request_id": a.request_id, "created": rfc3339(a.created_at),
        "expires_at": a.expires_at, "expires": rfc3339(a.expires_at), "left": max(0, int(a.expires_at - now)),
    }


def approval_routes(ui: Ui) -> list[Route]:
    """The approvals page, its event stream, and the approve/deny form."""
    gateway = ui.gateway

    async def pending() -> list[Approval]:
        items = await gateway.approvals.pending(time.time())
        return sorted(items, key=lambda a: (a.created_at, a.id), reverse=True)

    async def approvals(request: Request) -> Response:
        found = await ui.require(request, APPROVE_ROLES, "the approvals page")
        now = time.time()
        return await ui.page(request, "approvals.html", found, items=[approval_view(a, now, gateway.policy) for a in await pending()])

    async def events(request: Request) -> Response:
        found = await ui.require(request, APPROVE_ROLES, "the approvals stream")
        session_id = found[0].id
        item = ui.env.get_template("_approval.html")

        async def stream() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            started = last_sent = anyio.current_time()
            shown: tuple[str, ...] | None = None
            while anyio.current_time() - started < STREAM_SECONDS:
                again = await ui.current(request)
                if again is None or again[0].id != session_id or not APPROVE_ROLES & set(again[1].roles):
                    yield b"event: logout\ndata: {}\n\n"
                    return
                items = await pending()
                ids = tuple(a.id for a in items)
                if ids != shown:
                    now = time.time()
                    data = {"items": [{"id": a.id, "html": item.render(a=approval_view(a, now, gateway.policy), csrf=again[0].csrf, prefix=PREFIX)}
                                      for a in items]}
                    yield b"event: pending\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
                    shown, last_sent = ids, anyio.current_time()
                elif anyio.current_time() - last_sent > KEEPALIVE_SECONDS:
                    yield b": keep-alive\n\n"
                    last_sent = anyio.current_time()
                await anyio.sleep(POLL_SECONDS)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={**HEADERS, "x-accel-buffering": "no"})

    async def decide(request: Request) -> Response:
        found = await ui.require(request, APPROVE_ROLES, "approving or denying")
        fields = await ui.form(request)
        ui.checked_post(found, request, fields)
        approval_id, action = request.path_params["id"], fields.get("action")
        if action not in ("approve", "deny"):
            raise Refused(400, "the form's `action` must be approve or deny")
        reason = fields.get("reason", "").strip()
        try:
            decided = await gateway.decide(approval_id, approve=action == "approve", by=found[1].id, via="ui", reason=reason)
        except KeyError:
            raise Refused(404, f"there is no approval {approval_id}") from None
        except ApprovalRefused as exc:
            raise Refused(403, str(exc)) from None
        except ValueError as exc:
            raise Refused(409, str(exc)) from None
        log.info("approval.decided", approval_id=approval_id, state=decided.state, by=found[1].id, via="ui")
        await ui.sessions.set_flash(found[0], f"{approval_id} ({decided.tool} for {decided.principal}): {decided.state}")
        return RedirectResponse(f"{PREFIX}/approvals", status_code=303, headers=HEADERS)

    return [
        Route(f"{PREFIX}/approvals", ui.guarded(approvals), methods=["GET"]),
        Route(f"{PREFIX}/approvals/events", ui.guarded(events), methods=["GET"]),
        Route(PREFIX + "/approvals/{id}/decide", ui.guarded(decide), methods=["POST"]),
    ]
