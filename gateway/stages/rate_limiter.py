"""Rate limiter: GCRA limits keyed by any of principal, tool, tier, backend, with per-tool costs.

A store that is down fails closed: the call is refused with `backend_unavailable` and a message
naming the store (see `gateway.stages.store_down` for why that code), unless the limit says
`store_down: allow`, or the limit says nothing and the profile says `rate_limit_store_down: allow`;
such a limit is then skipped (fails open) while the store is down.
"""

from __future__ import annotations

import structlog

from gateway.core.call import BlockClass, CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stages import store_down
from gateway.stores.base import LimiterStore, StoreUnavailable

log = structlog.get_logger()


def limit_key(limit_id: str, fields: list[str], ctx: CallContext) -> str:
    parts = [limit_id]
    for f in fields:
        if f == "principal":
            value = ctx.principal.id if ctx.principal else ""
        elif f == "tool":
            value = ctx.call.tool
        elif f == "tier":
            value = (ctx.principal.tier or "") if ctx.principal else ""
        else:
            value = ctx.tool.backend if ctx.tool else ""
        parts.append(f"{f}={value}")
    return "\x1f".join(parts)


class RateLimiter:
    name = "rate_limiter"

    def __init__(self, store: LimiterStore) -> None:
        self.store = store

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        if ctx.call.dry_run:
            return None
        cost = policy.cost_of(ctx.call.tool)
        for limit in policy.rate_limits_for(ctx.call.tool):
            try:
                wait = await self.store.acquire(
                    limit_key(limit.id, limit.key, ctx),
                    interval=limit.per_seconds / limit.rate,
                    burst=limit.burst,
                    cost=cost,
                    now=ctx.clock,
                )
            except StoreUnavailable as exc:
                fails_open = (limit.store_down or policy.rate_limit_store_down) == "allow"
                log.warning("rate_limit.store_down", limit=limit.id, fails_open=fails_open, error=str(exc))
                if fails_open:
                    continue
                return store_down(exc, self.name)
            if wait > 0:
                return Decision.block(
                    ErrorCode.RATE_LIMITED,
                    f"rate limit {limit.id} exceeded for {ctx.call.tool}; retry in {wait:.2f}s",
                    BlockClass.RATE_LIMIT,
                    stage=self.name,
                    retry_after=max(round(wait, 3), 0.001),  # never "retry in 0 s" for a refusal
                )
        return None
