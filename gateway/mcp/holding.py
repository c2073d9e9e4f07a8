"""Holding a call for a human, shared by the stdio and HTTP transports: wait for the approval to
be decided (by an approver on the UI, CLI or HTTP API, or, where the policy opts in, by the
client's elicitation answer) or to time out, sending progress on the client's token meanwhile
(so its request does not time out, and each note says who decides and where). The transports
only say how a note reaches their client.

An elicitation answer is recorded as the session's own principal deciding `via: elicitation`
(self-approval by nature: the client may be the agent itself): it counts only where the policy's
`approval.allow_elicitation` allows it for the caller's tier (off by default, and then the gateway
does not ask); otherwise the approval stays pending for an approver or admin.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gateway.core.gateway import Gateway
from gateway.mcp import approval as ap
from gateway.stages.approval import VIA_ELICITATION, ApprovalRefused, wait_decided

log = structlog.get_logger()

async def hold(gateway: Gateway, approval_id: str, token: Any, notify: Callable[[dict[str, Any]], Awaitable[None]],
               *, seconds: float, interval: float, where: str) -> None:
    """Wait until `approval_id` is decided or `seconds` pass (then it expires); progress every
    `interval`, each note saying who decides and `where` (`approval.deciders`).

    Woken by the gateway's approval signals (a decision on this replica, or on another over Redis),
    with the gateway's safety poll underneath (`stages.approval.wait_decided`).
    """
    started = time.monotonic()
    count = 0
    while True:
        left = seconds - (time.monotonic() - started)
        step = 0.0 if token is not None and count == 0 else min(interval, left) if token is not None else left
        current = await wait_decided(gateway.approvals, gateway.approval_signals, approval_id,
                                     seconds=max(step, 0.0), poll_seconds=gateway.approval_poll_seconds)
        if current is not None:
            await gateway.approval_recorder.try_sync()
            return
        if time.monotonic() - started >= seconds:
            break
        if token is not None:
            count += 1
            await notify(ap.hold_note(token, count, approval_id, where))
    await gateway.approvals.expire(approval_id)
    await gateway.approval_recorder.try_sync()


async def answer(gateway: Gateway, approval_id: str, approve: bool, *, by: str, tier: str | None) -> None:
    """Record principal `by`'s (of `tier`) elicitation answer; one the policy refuses leaves the approval pending."""
    try:
        await gateway.decide(approval_id, approve=approve, by=by, via=VIA_ELICITATION, reason="answered the elicitation",
                             tier=tier)
    except ApprovalRefused as exc:
        log.warning("approval.elicitation_refused", approval_id=approval_id, reason=str(exc))


async def settle(gateway: Gateway, approval_id: str, verdict: bool | None, *, by: str, tier: str | None) -> None:
    """Record the client's elicitation answer (`by` is the session's principal, of `tier`): approve,
    deny, or (no answer) let the approval expire."""
    if verdict is None:
        await gateway.approvals.expire(approval_id)
        await gateway.approval_recorder.try_sync()
    else:
        await answer(gateway, approval_id, verdict, by=by, tier=tier)


async def apply_state(gateway: Gateway, sealer: ap.StateSealer, params: dict[str, Any], *, principal: str,
                      tier: str | None, tool: str, arguments: Any, now: float) -> str | tuple[str]:
    """Verify the gateway's `requestState` on a 2026 retry and record the approval answer it carries.

    Returns the approval id to retry the call with, or `(reason,)` when the state must be refused
    (altered, expired, or issued for another principal, tool or arguments).
    """
    opened = sealer.open(params["requestState"], principal=principal, tool=tool, arguments=arguments, now=now)
    if isinstance(opened, tuple):
        return opened
    answers = params.get("inputResponses")
    response = answers.get(ap.APPROVAL_INPUT) if isinstance(answers, dict) else None
    current = await gateway.approvals.get(opened)
    if current is not None and current.state == "pending":
        if ap.accepted(response):
            await answer(gateway, opened, True, by=principal, tier=tier)
        elif isinstance(response, dict):
            await answer(gateway, opened, False, by=principal, tier=tier)
    return opened
