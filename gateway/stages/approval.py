"""Approval stage: holds a call that a rule sent to a human.

An approval is bound to the exact call (principal, tool, argument digest, policy version), is
single use and expires. A call that comes back with an approved `approval_id` goes through once;
otherwise the gateway holds it (up to the profile's `hold_seconds`) or answers
`approval_required` with the id to come back with. A timeout denies.

Every approval event (held, approved, denied, expired) is a chained ledger record
(`kind: "approval"`), written by `ApprovalRecorder` from the append-only approval store: the
store is where the CLI, in another process, appends its decision; a gateway copies each event
into the chain (with PostgreSQL, any replica: the store's `recording()` claim and a mark written
in the record's own transaction keep each event in the chain exactly once). A call is released
only once its approval is in the chain (fail closed). `approver_refusal` is the one rule of who
may decide.

A held call sleeps until `ApprovalSignals` wakes it (a decision in this process, or from another
replica over Redis) and re-reads the store at least every `poll_seconds` (the safety poll) in
case a wake-up was lost: the store, never the wake-up, says whether the call may go.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import anyio
import structlog

from audit.canon import canonical_bytes
from audit.records import KIND_APPROVAL

from gateway.core.call import BlockClass, CallContext, Decision, Effect
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stages.record import Ledger, rfc3339
from gateway.stages.sanitizer.walk import redact_secrets
from gateway.stores.base import Approval, ApprovalEvent, ApprovalSignals, ApprovalStore

log = structlog.get_logger()
VIA_ELICITATION = "elicitation"
"""`via` of a decision the MCP client's user gave by answering an elicitation."""
SAFETY_POLL_SECONDS = 1.0
"""How often a held call reads its approval again without a wake-up (`approvals.poll_seconds`)."""


def new_approval_id() -> str:
    return "apr_" + secrets.token_urlsafe(12)


class ApprovalRefused(PermissionError):
    """The principal may not make this decision (self-approval, or elicitation not allowed)."""


def approver_refusal(policy: CompiledPolicy, approval: Approval, *, by: str, approve: bool, via: str,
                     tier: str | None = None) -> str | None:
    """Why principal `by` (of `tier`) may not approve `approval` under `policy`, or None if it may.

    Denying is always allowed (it only refuses). An elicitation answer is the calling principal
    approving its own call, and the MCP client that answers may be the agent itself: it counts
    only where `approval.allow_elicitation` allows it for the caller's tier (off by default) and
    only for that principal. Anyone else approving their own call is refused unless
    `approval.allow_self_approval` (default false).
    """
    if not approve:
        return None
    if via == VIA_ELICITATION:
        if not policy.elicitation_allowed(tier):
            return (f"approval {approval.id}: the policy does not let {by} approve its own call by answering an "
                    "elicitation (approval.allow_elicitation); a principal with role approver or admin decides it")
        if by != approval.principal:
            return f"approval {approval.id}: an elicitation answer counts only for the principal that made the call"
        return None
    if by == approval.principal and not policy.approval_allow_self:
        return (
            f"approval {approval.id}: {by} made this call and may not approve it (self-approval is refused "
            "unless the policy sets approval.allow_self_approval)"
        )
    return None


def approval_entry(event: ApprovalEvent) -> dict[str, Any]:
    """The ledger record of one approval event (contract: keep every field and its meaning)."""
    a = event.approval
    return {
        "kind": KIND_APPROVAL,
        "event": event.event,
        "approval_id": a.id,
        "time": rfc3339(event.at),
        "by": event.by or None,
        "via": event.via,
        "reason": event.reason,
        "principal": a.principal,
        "tool": a.tool,
        "args_digest": a.argument_digest,
        "policy_version": a.policy_version,
        # null, present as in every record: these name one call's records and decision, and this is neither
        "request_id": None,
        "decision": None,
        "held_request_id": a.request_id,
        "expires_at": rfc3339(a.expires_at),
    }


class ApprovalRecorder:
    """Copies approval events from the store into the karma ledger, oldest first, each once.

    One per gateway; a lock keeps two copies in this process from racing, the store's
    `recording()` claim keeps replicas sharing the store from racing. Where the store can mark an
    event in the ledger's own transaction (`linked_mark`, PostgreSQL), record and mark are one
    commit. An event whose append fails stays unrecorded and is tried again on the next `sync`.
    """

    def __init__(self, store: ApprovalStore, ledger: Ledger) -> None:
        self.store = store
        self.ledger = ledger
        self._lock = anyio.Lock()

    async def sync(self) -> None:
        """Record every unrecorded event; raises what the ledger raised if one cannot be."""
        append_linked = getattr(self.ledger, "append_linked", None)
        async with self._lock, self.store.recording():
            for event in await self.store.unrecorded():
                linked = self.store.linked_mark(event.no)
                if linked is not None and append_linked is not None:
                    await append_linked(approval_entry(event), linked)
                    continue
                appended = await self.ledger.append(approval_entry(event))
                await self.store.mark_recorded(event.no, getattr(appended, "seq", 0), getattr(appended, "hash", ""))

    async def try_sync(self) -> bool:
        """`sync`, logging instead of raising; False if an event could not be recorded."""
        try:
            await self.sync()
        except Exception as exc:
            log.error("approval.record_failed", error=str(exc))
            return False
        return True


async def wait_decided(store: ApprovalStore, signals: ApprovalSignals, approval_id: str, *, seconds: float,
                       poll_seconds: float = SAFETY_POLL_SECONDS) -> Approval | None:
    """The approval once it is no longer pending, or None if `seconds` pass first (or it is unknown).

    Sleeps until `signals` wakes it, reading the store again at least every `poll_seconds`; the
    watch is registered before the first read, so a decision made in between is not missed.
    """
    deadline = anyio.current_time() + seconds
    async with signals.watch(approval_id) as watch:
        while True:
            current = await store.get(approval_id)
            if current is not None and current.state != "pending":
                return current
            left = deadline - anyio.current_time()
            if left <= 0:
                return None
            await watch.wait(min(poll_seconds, left))


class ApprovalGate:
    name = "approval"

    def __init__(self, store: ApprovalStore, recorder: ApprovalRecorder, signals: ApprovalSignals, *,
                 poll_seconds: float = SAFETY_POLL_SECONDS) -> None:
        self.store = store
        self.recorder = recorder
        self.signals = signals
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
        if not await self.recorder.try_sync():
            await self.store.expire(approval.id, now=ctx.clock)
            return self._unrecorded(ctx, approval.id)
        if policy.approval_hold_seconds <= 0:
            return self._block(
                ErrorCode.APPROVAL_REQUIRED,
                f"needs human approval ({decision.message}). Ask a principal with role approver or admin to "
                f"approve {approval.id}, then call again with approval_id={approval.id}",
                ctx,
                approval.id,
            )
        return await self._hold(ctx, approval, policy.approval_hold_seconds)

    def _unrecorded(self, ctx: CallContext, approval_id: str) -> Decision:
        """Fail closed: an approval event the ledger could not record releases nothing."""
        return self._block(
            ErrorCode.INTERNAL_ERROR,
            f"the karma ledger could not record approval {approval_id}, so the call was refused",
            ctx,
            approval_id,
        )

    async def _hold(self, ctx: CallContext, approval: Approval, hold: float) -> Decision | None:
        current = await wait_decided(self.store, self.signals, approval.id, seconds=hold, poll_seconds=self.poll_seconds)
        if current is None:  # one last look: a decision may have landed as the hold ended
            current = await self.store.get(approval.id)
        if current is not None and current.state == "approved":
            return await self._redeem(ctx, approval.id, (approval.principal, approval.tool, approval.argument_digest, approval.policy_version))
        if current is not None and current.state == "denied":
            await self.recorder.try_sync()
            return self._block(ErrorCode.APPROVAL_DENIED, f"approval {approval.id} was denied by {current.decided_by or 'an operator'}", ctx, approval.id)
        await self.store.expire(approval.id, now=ctx.clock + hold)
        await self.recorder.try_sync()
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
                await self.store.expire(approval_id, now=ctx.clock)
                await self.recorder.try_sync()
                return self._block(ErrorCode.APPROVAL_TIMEOUT, f"approval {approval_id} expired before anyone decided", ctx, approval_id)
            return self._block(ErrorCode.APPROVAL_REQUIRED, f"approval {approval_id} is still pending", ctx, approval_id)
        if approval.state == "denied":
            return self._block(ErrorCode.APPROVAL_DENIED, f"approval {approval_id} was denied", ctx, approval_id)
        if approval.state == "expired" or (approval.state == "approved" and approval.expires_at <= ctx.clock):
            return self._block(ErrorCode.APPROVAL_TIMEOUT, f"approval {approval_id} expired", ctx, approval_id)
        if approval.state == "approved" and not await self.recorder.try_sync():
            return self._unrecorded(ctx, approval_id)
        if approval.state == "used" or not await self.store.consume(approval_id, now=ctx.clock):
            return self._block(ErrorCode.APPROVAL_DENIED, f"approval {approval_id} was already used (approvals are single use)", ctx, approval_id)
        ctx.approval_id = approval_id
        if ctx.rules_decision is not None:
            ctx.rules_decision = dataclasses.replace(ctx.rules_decision, approved_by=approval_id)
        return None


def _preview(ctx: CallContext) -> str:
    redacted, _ = redact_secrets(ctx.arguments)
    return canonical_bytes(redacted).decode()[:500]
