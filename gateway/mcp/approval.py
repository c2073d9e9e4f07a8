"""Asking a human over MCP, shared by the stdio and HTTP transports: the approval form (legacy
`elicitation/create`, or a 2026 `input_required` request), the progress note sent while a call is
held, how an answer reads, and the signed `requestState` of a 2026 approval round trip.

The `requestState` is attacker-controlled on the wire, so it is sealed (HMAC-SHA256 with a key
that never leaves the process) and bound to the approval, principal, tool, an argument digest and
an expiry (notes §5). No I/O; the caller passes the clock reading in.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from gateway.core.call import Outcome
from gateway.crypto.b64 import b64url_decode, b64url_encode
from gateway.mcp import jsonrpc
from gateway.mcp.versions import at_least

#: The key of the gateway's own entry in `inputRequests` / `inputResponses` (2026).
APPROVAL_INPUT = "dharma.gateway/approval"
#: Every `requestState` the gateway issues starts with this.
STATE_PREFIX = "dgw1."


def can_elicit(capabilities: Any) -> bool:
    """Whether the client declared the elicitation capability (so the gateway may ask through it)."""
    return isinstance(capabilities, dict) and isinstance(capabilities.get("elicitation"), dict)


def approval_form(outcome: Outcome, name: str, arguments: Any, *, version: str | None, modern: bool = False) -> dict[str, Any]:
    """The `elicitation/create` params asking to approve a held call (`mode` from 2025-11-25 on)."""
    preview = jsonrpc.dumps(arguments or {}).decode()
    if len(preview) > 300:
        preview = preview[:297] + "..."
    form: dict[str, Any] = {
        "message": f"Dharma Gateway asks: allow the call to '{name}' with {preview}? "
                   f"({outcome.message}; approval {outcome.approval_id})",
        "requestedSchema": {
            "type": "object",
            "properties": {"approve": {"type": "boolean", "title": "Approve this call",
                                       "description": f"Dharma Gateway approval {outcome.approval_id}"}},
            "required": ["approve"],
        },
    }
    if modern or at_least(version, "2025-11-25"):
        form = {"mode": "form", **form}
    return form


def accepted(answer: Any) -> bool:
    """Whether an `ElicitResult` approves: action `accept` with `approve: true`."""
    if not isinstance(answer, dict) or answer.get("action") != "accept":
        return False
    content = answer.get("content")
    return isinstance(content, dict) and content.get("approve") is True


def deciders(approval_id: str, *, over_http: bool) -> str:
    """Who decides a held call and where, in words a model can pass on to its user.

    Only a principal with role `approver` or `admin` decides (unless the policy lets the caller
    answer an elicitation). Over HTTP (`dharma serve`) the gateway's own `/ui` and `/v1` routes
    serve the approvals; over stdio there is no HTTP server, only the CLI on the gateway's machine
    (or a `dharma serve` that shares its state).
    """
    if over_http:
        return (f"A principal with role approver or admin decides it: on this gateway's /ui/approvals page, with "
                f"`dharma approvals approve {approval_id}`, or by POST /v1/approvals/{approval_id}:approve.")
    return (f"A principal with role approver or admin decides it with `dharma approvals approve {approval_id}` on "
            "the machine running this gateway (or on /ui/approvals of a `dharma serve` sharing its state).")


def hold_note(token: Any, count: int, approval_id: str, where: str) -> dict[str, Any]:
    """The progress notification sent on the client's token while a call waits for a human
    (`where`: `deciders` of the approval)."""
    return jsonrpc.notification("notifications/progress", {
        "progressToken": token,
        "progress": count,
        "message": f"Dharma Gateway: waiting for a human to approve {approval_id}. {where}",
    })


def args_digest(arguments: Any) -> str:
    """A digest of the call's arguments, binding a `requestState` to them."""
    return hashlib.sha256(jsonrpc.dumps(arguments or {})).hexdigest()


@dataclass(frozen=True, slots=True)
class StateSealer:
    """Seals and opens the gateway's 2026 `requestState` tokens with a process-local key."""

    key: bytes

    def seal(self, payload: dict[str, Any]) -> str:
        body = b64url_encode(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        mac = hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()
        return f"{STATE_PREFIX}{body}.{mac}"

    def input_required(self, outcome: Outcome, *, principal: str, tool: str, arguments: Any, expires: float,
                       decision_meta: dict[str, Any]) -> dict[str, Any]:
        """The `InputRequiredResult` asking the client to approve (no backend call made)."""
        state = self.seal({"a": outcome.approval_id, "p": principal, "t": tool, "d": args_digest(arguments), "e": int(expires)})
        return {
            "resultType": "input_required",
            "inputRequests": {APPROVAL_INPUT: {"method": "elicitation/create",
                                               "params": approval_form(outcome, tool, arguments, version=None, modern=True)}},
            "requestState": state,
            "_meta": decision_meta,
        }

    def open(self, token: str, *, principal: str, tool: str, arguments: Any, now: float) -> str | tuple[str]:
        """The approval id a `requestState` carries, or `(reason,)` when it must be refused."""
        body, _, mac = token[len(STATE_PREFIX):].rpartition(".")
        good = hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, good):
            return ("Invalid params: requestState was not issued by this gateway or was altered",)
        try:
            state = jsonrpc.loads(b64url_decode(body, "requestState"))
        except ValueError:
            return ("Invalid params: requestState is malformed",)
        if not isinstance(state, dict) or state.get("e", 0) < now:
            return ("Invalid params: requestState has expired; call the tool again",)
        if state.get("p") != principal or state.get("t") != tool or state.get("d") != args_digest(arguments):
            return ("Invalid params: requestState belongs to a different call",)
        return str(state["a"])


def strip_state(params: dict[str, Any]) -> dict[str, Any]:
    """The call's params without the gateway's `requestState` and approval answer (what goes upstream)."""
    out = dict(params)
    out.pop("requestState", None)
    answers = out.get("inputResponses")
    if isinstance(answers, dict):
        rest = {k: v for k, v in answers.items() if k != APPROVAL_INPUT}
        if rest:
            out["inputResponses"] = rest
        else:
            out.pop("inputResponses")
    return out
