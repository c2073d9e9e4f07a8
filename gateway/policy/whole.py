"""Decide a call with the whole pipeline's deciding stages, with nothing forwarded and nothing recorded.

`dharma test` (cases that name a principal), `dharma eval` and `dharma replay` use this, so the
tier gate, sensitivity and purpose, escalation, rate limits, rules and approval decide there
exactly as they do in the live gateway: the stages are the ones `gateway.core.pipeline.steps()`
declares, cut at `record_decision`. What differs is only what they are wired to:

* rate limits use an in-memory limiter the caller owns (a test case's prior calls, or replay's
  simulation of the recorded traffic); nothing touches a shared store;
* nobody is there to approve, so a call that would be held answers `approval_required`
  (would-hold) at once, whatever the profile's `hold_seconds`; approvals go to a throwaway store;
* the session history and karma rules see are what the caller passes in.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.core.call import CallContext, Decision, Effect, Principal, Status, ToolCall, ToolInfo
from gateway.core.errors import ErrorCode
from gateway.core.pipeline import Wiring, decide, split, steps
from gateway.policy.compile import CompiledPolicy
from gateway.stages import Stage
from gateway.stages.circuit_breaker import CircuitBreaker
from gateway.stores.memory import (
    MemoryApprovalStore, MemoryBreakerStore, MemoryIdempotencyStore, MemoryLimiterStore, SessionHistory,
)  # fmt: skip


class DiscardLedger:
    """The ledger of a decision that is never recorded: appends go nowhere (held approvals' events)."""

    async def append(self, entry: dict[str, Any]) -> None:
        return None

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class Decider:
    """The deciding stages wired to in-memory stores; one per test case or per replay run."""

    limiter: MemoryLimiterStore = field(default_factory=MemoryLimiterStore)
    stages: tuple[Stage, ...] = ()

    def __post_init__(self) -> None:
        ledger = DiscardLedger()
        wiring = Wiring(
            ledger=ledger,
            keys=None,  # type: ignore[arg-type]  # the receipt step is past the cut and never runs
            limiter_store=self.limiter,
            approvals=MemoryApprovalStore(),
            idempotency=MemoryIdempotencyStore(),
            history=SessionHistory(),
            breaker=CircuitBreaker(MemoryBreakerStore()),
            clock=time.time,
        )
        self.stages, _ = split(steps(wiring))


@dataclass(frozen=True, slots=True)
class Decided:
    """The pipeline's decision for one call and the context the stages left (sensitivity, findings, …)."""

    decision: Decision
    ctx: CallContext

    @property
    def status(self) -> Status:
        return outcome_status(self.decision)

    @property
    def error_code(self) -> ErrorCode | None:
        return self.decision.code if self.decision.blocks else None

    @property
    def rules_decision(self) -> Decision | None:
        return self.ctx.rules_decision


def outcome_status(decision: Decision) -> Status:
    """The envelope status a decision gives a call that is not forwarded yet (`ok`: it would be)."""
    if not decision.blocks:
        return Status.OK
    return Status.PENDING_APPROVAL if decision.code is ErrorCode.APPROVAL_REQUIRED else Status.BLOCKED


def verdict_of(decision: Decision) -> str:
    """`deny`, `hold` or `allow`: what the caller would see of a decision (replay's classes)."""
    if not decision.blocks:
        return "allow"
    return "hold" if decision.code is ErrorCode.APPROVAL_REQUIRED or decision.effect is Effect.REQUIRE_APPROVAL else "deny"


async def decide_call(
    decider: Decider,
    policy: CompiledPolicy,
    call: ToolCall,
    principal: Principal | None,
    tool: ToolInfo | None,
    *,
    at: float,
    session: list[dict[str, Any]] | None = None,
    karma: dict[str, int] | None = None,
) -> Decided:
    """Run `call` through the deciding stages at time `at` (seconds since the epoch).

    `principal` None is a caller nobody knows (`unauthenticated`); `tool` None is a tool no backend
    serves (`tool_not_found`). The policy's approval hold is taken as zero: see the module doc.
    """
    held = dataclasses.replace(policy, approval_hold_seconds=0.0) if policy.approval_hold_seconds else policy
    ctx = CallContext(call=call, now=datetime.fromtimestamp(at, UTC), clock=at)
    ctx.principal, ctx.tool = principal, tool
    ctx.session = list(session or [])
    ctx.karma = dict(karma or {"calls": len(ctx.session), "denials": 0})
    decision = await decide(decider.stages, ctx, held)
    return Decided(decision, ctx)
