"""Approval stage: holds a call that a rule sent to a human.

An approval is bound to the exact call (principal, tool, argument digest, policy version), is
single use and expires. A call that comes back with an approved `approval_id` goes through once;
otherwise the gateway holds it (up to the profile's `hold_seconds`) or answers
`approval_required` with the id to come back with. A timeout denies.
"""

from __future__ import annotations

import dataclasses
import secrets

import anyio

from audit.canon import canonical_bytes

from gateway.core.call import BlockClass, CallContext, Decision, Effect
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stages.sanitizer.walk import redact_secrets
from gateway.stores.base import Approval, ApprovalStore


def new_approval_id() -> str:
    return "apr_" + secrets.token_urlsafe(12)


class ApprovalGate:
    name = "approval"

    def __init__(self, store: ApprovalStore, *, poll_seconds: float = 0.05) -> None:
        self.store = store
        self.poll_seconds = poll_seconds

    def _block(self, code: ErrorCode, message: str, ctx: CallContext, approval_id: str | None) -> Decision:
        ctx.approval_id = approval_id
        matched = ctx.rules_decision.matched if ctx.rules_decision else ()
        return Decision(
            effect=Effect.REQUIRE_APPROVAL if code is ErrorCode.APPROVAL_REQUIRED else Effect.DENY,
            code=code,
            message=message,
            block_class=BlockClass.APPROVAL,
            matched=matched,
            stage=self.name,
        )

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        decision = ctx.rules_decision
        if decision is None or not (decision.enforced and decision.effect is Effect.REQUIRE_APPROVAL):
            return None
        assert ctx.principal is not None and ctx.tool is not None
        binding = (ctx.principal.id, ctx.tool.name, ctx.argument_digest, policy.version)
        if ctx.call.approval_id:
            return await self._redeem(ctx, ctx.call.approval_id, binding)
        if ctx.call.dry_run:
            return self._block(ErrorCode.APPROVAL_REQUIRED, f"needs approval: {decision.message}", ctx, None)
        approval = Approval(
            id=new_approval_id(),
            principal=binding[0],
            tool=binding[1],
            argument_digest=binding[2],
            policy_version=binding[3],
            request_id=ctx.call.request_id,
            reason=decision.message,
            created_at=ctx.clock,
            expires_at=ctx.clock + policy.approval_expires_seconds,
            arguments_preview=_preview(ctx),
        )
        await self.store.create(approval)
        if policy.approval_hold_seconds <= 0:
            return self._block(
                ErrorCode.APPROVAL_REQUIRED,
                f"needs human approval ({decision.message}). Ask an operator to approve {approval.id}, "
                f"then call again with approval_id={approval.id}",
                ctx,
                approval.id,
            )
        return await self._hold(ctx, approval, policy.approval_hold_seconds)

    async def _hold(self, ctx: CallContext, approval: Approval, hold: float) -> Decision | None:
        with anyio.move_on_after(hold):
            while True:
                current = await self.store.get(approval.id)
                if current is not None and current.state != "pending":
                    break
                await anyio.sleep(self.poll_seconds)
        current = await self.store.get(approval.id)
        if current is not None and current.state == "approved":
            return await self._redeem(ctx, approval.id, (approval.principal, approval.tool, approval.argument_digest, approval.policy_version))
        if current is not None and current.state == "denied":
            return self._block(ErrorCode.APPROVAL_DENIED, f"approval {approval.id} was denied by {current.decided_by or 'an operator'}", ctx, approval.id)
        await self.store.expire(approval.id)
        return self._block(ErrorCode.APPROVAL_TIMEOUT, f"approval {approval.id} was not granted within {hold:g}s; the call is denied", ctx, approval.id)

    async def _redeem(self, ctx: CallContext, approval_id: str, binding: tuple[str, str, str, str]) -> Decision | None:
        approval = await self.store.get(approval_id)
        if approval is None:
            return self._block(ErrorCode.APPROVAL_DENIED, f"unknown approval {approval_id}", ctx, approval_id)
        if not approval.binds(*binding):
            return self._block(
                ErrorCode.APPROVAL_DENIED,
                f"approval {approval_id} was granted for a different call (principal, tool, arguments or policy version differ)",
                ctx,
                approval_id,
            )
        if approval.state == "pending":
            if approval.expires_at <= ctx.clock:
                await self.store.expire(approval_id)
                return self._block(ErrorCode.APPROVAL_TIMEOUT, f"approval {approval_id} expired before anyone decided", ctx, approval_id)
            return self._block(ErrorCode.APPROVAL_REQUIRED, f"approval {approval_id} is still pending", ctx, approval_id)
        if approval.state == "denied":
            return self._block(ErrorCode.APPROVAL_DENIED, f"approval {approval_id} was denied", ctx, approval_id)
        if approval.state == "expired" or (approval.state == "approved" and approval.expires_at <= ctx.clock):
            return self._block(ErrorCode.APPROVAL_TIMEOUT, f"approval {approval_id} expired", ctx, approval_id)
        if approval.state == "used" or not await self.store.consume(approval_id, now=ctx.clock):
            return self._block(ErrorCode.APPROVAL_DENIED, f"approval {approval_id} was already used (approvals are single use)", ctx, approval_id)
        ctx.approval_id = approval_id
        if ctx.rules_decision is not None:
            ctx.rules_decision = dataclasses.replace(ctx.rules_decision, approved_by=approval_id)
        return None


def _preview(ctx: CallContext) -> str:
    redacted, _ = redact_secrets(ctx.arguments)
    return canonical_bytes(redacted).decode()[:500]
