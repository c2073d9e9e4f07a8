"""Run the decision stages in order. A stage's block ends the chain; a fault fails closed.

    authenticate → tool visibility → sanitizer → circuit breaker → rate limiter → tier gate
    → dharma rules → approval

(The tier gate's visibility half runs before the sanitizer so a schema error cannot reveal that
a hidden tool exists.) No I/O of its own: stages reach storage through their stores.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from gateway.core.call import ALLOW, CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stages import Stage

log = structlog.get_logger()


async def decide(stages: Sequence[Stage], ctx: CallContext, policy: CompiledPolicy) -> Decision:
    """The pipeline's decision for one call: the first block, else the rules' verdict, else allow."""
    for stage in stages:
        try:
            decision = await stage(ctx, policy)
        except Exception:
            log.exception("pipeline.stage_failed", stage=stage.name, tool=ctx.call.tool, request_id=ctx.call.request_id)
            return Decision.block(
                ErrorCode.INTERNAL_ERROR,
                "the gateway could not decide this call; it was not forwarded",
                None,
                stage=stage.name,
            )
        if decision is not None:
            return decision
    return ctx.rules_decision or ALLOW
