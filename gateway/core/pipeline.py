"""THE ordered declaration of every step a governed call goes through, and the loop that runs it.

    authenticate → tool visibility → sanitizer → circuit breaker → rate limiter → tier gate
    → dharma rules → approval → decision record → [forward to the backend] → disclosure rules
    → karma ledger (outcome record) → signed receipt

`steps()` is that line, in code: adding a stage is one line there and one module in
`gateway/stages/`. The stages before `record_decision` decide (the first block ends the
decision; a stage that raises fails closed); the steps from `record_decision` on act on the
decision: its record is committed before `forward` may reach the backend (two-phase records). The
visibility check runs before the sanitizer so a schema error cannot reveal that a hidden tool
exists. No I/O of its own: the ledger, keys and stores come in through `Wiring`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from dataclasses import dataclass

import structlog

from gateway.core.call import ALLOW, CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.crypto.receipts import KeyStore
from gateway.policy.compile import CompiledPolicy
from gateway.stages import Stage, Step, store_down
from gateway.stages.approval import SAFETY_POLL_SECONDS, ApprovalGate, ApprovalRecorder
from gateway.stages.authenticate import Authenticate
from gateway.stages.circuit_breaker import CircuitBreaker
from gateway.stages.dharma_rules import DharmaRules
from gateway.stages.disclosure import DisclosureRules
from gateway.stages.forward import Forward
from gateway.stages.rate_limiter import RateLimiter
from gateway.stages.receipt import Receipt
from gateway.stages.record import Ledger, Record, RecordDecision, safe_digest
from gateway.stages.sanitizer.stage import Sanitizer
from gateway.stages.tier_gate import TierGate
from gateway.stages.visibility import ToolVisibility
from gateway.stores.base import ApprovalSignals, ApprovalStore, HistoryStore, IdempotencyStore, LimiterStore, StoreUnavailable
from gateway.stores.memory import MemoryApprovalSignals

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class Wiring:
    """What the steps need from outside the decision core; the Gateway supplies it."""

    ledger: Ledger
    keys: KeyStore
    limiter_store: LimiterStore
    approvals: ApprovalStore
    idempotency: IdempotencyStore
    history: HistoryStore
    breaker: CircuitBreaker
    clock: Callable[[], float]
    approval_recorder: ApprovalRecorder | None = None  # the Gateway's, shared with approve/deny; else one of its own
    approval_signals: ApprovalSignals | None = None  # the Gateway's, which its decisions notify; else one of its own
    approval_poll_seconds: float = SAFETY_POLL_SECONDS


def steps(w: Wiring) -> tuple[Stage | Step, ...]:
    """Every step of a governed call, in order (the README's pipeline line)."""
    return (
        Authenticate(),  # unauthenticated
        ToolVisibility(),  # tool_not_found (hidden looks unknown)
        Sanitizer(),  # invalid_params
        w.breaker,  # backend_unavailable (check only, fail fast while open)
        RateLimiter(w.limiter_store),  # rate_limited
        TierGate(),  # forbidden, purpose_required
        DharmaRules(),  # policy_blocked
        ApprovalGate(w.approvals, w.approval_recorder or ApprovalRecorder(w.approvals, w.ledger),
                     w.approval_signals or MemoryApprovalSignals(),
                     poll_seconds=w.approval_poll_seconds),  # approval_required / _denied / _timeout
        RecordDecision(w.ledger),  # decision record committed (fails closed: nothing is forwarded)
        Forward(w.breaker, w.idempotency, w.clock),  # [backend]: replay, admit → send → record
        DisclosureRules(),  # PERMIT / REDACT / WITHHOLD
        Record(w.ledger, w.history, w.idempotency, w.clock),  # outcome record, or the one record of a refusal
        Receipt(w.keys, w.clock),  # signed receipt
    )


#: The first step that acts on the decision instead of deciding.
FIRST_AFTER_DECISION = RecordDecision


def split(all_steps: Sequence[Stage | Step]) -> tuple[tuple[Stage, ...], tuple[Step, ...]]:
    """The declaration cut at `record_decision`: the deciding stages, then the steps that act on the decision."""
    at = next(i for i, s in enumerate(all_steps) if isinstance(s, FIRST_AFTER_DECISION))
    return tuple(all_steps[:at]), tuple(all_steps[at:])  # type: ignore[arg-type]


Timer = Callable[[str, float], None]
"""Told each step's name and the seconds it took (the gateway's metrics)."""


async def decide(stages: Sequence[Stage], ctx: CallContext, policy: CompiledPolicy, timer: Timer | None = None) -> Decision:
    """The pipeline's decision for one call: the first block, else the rules' verdict, else allow."""
    for stage in stages:
        started = perf_counter()
        try:
            decision = await stage(ctx, policy)
        except StoreUnavailable as exc:
            log.error("pipeline.store_down", stage=stage.name, tool=ctx.call.tool, error=str(exc))
            return store_down(exc, stage.name)
        except Exception:
            log.exception("pipeline.stage_failed", stage=stage.name, tool=ctx.call.tool, request_id=ctx.call.request_id)
            return Decision.block(
                ErrorCode.INTERNAL_ERROR,
                "the gateway could not decide this call; it was not forwarded",
                None,
                stage=stage.name,
            )
        if timer is not None:
            timer(stage.name, perf_counter() - started)
        if decision is not None:
            return decision
    return ctx.rules_decision or ALLOW


async def run(
    stages: Sequence[Stage], after: Sequence[Step], ctx: CallContext, policy: CompiledPolicy, timer: Timer | None = None
) -> CallContext:
    """Run one call through the declaration: decide (unless a decision is already on `ctx`), then act.
    `timer`, if given, hears how long each step took."""
    if ctx.decision is None:
        ctx.decision = await decide(stages, ctx, policy, timer)
    if not ctx.argument_digest:  # the sanitizer did not get to it: digest what arrived
        ctx.argument_digest = safe_digest(ctx.call.arguments)
    for step in after:
        started = perf_counter()
        await step(ctx, policy)
        if timer is not None:
            timer(step.name, perf_counter() - started)
    return ctx
