"""Circuit breaker per backend: closed → open after repeated failures → half-open probe → closed.

While open, calls fail fast with `backend_unavailable` and a retry hint instead of piling up on
a backend that is down. This early stage only *checks* (no state change), so a call that a
later stage blocks cannot leave the breaker waiting for an outcome that never comes. The forward
step *admits* the call right before sending it (claiming the one half-open probe), then
*records* how the backend answered, or *releases* the probe if the call never got that far.

The states live in a `BreakerStore`: this process's memory by default (the state machine is
`gateway.stores.memory`), or Redis so that a backend open on one replica is open on all. A store
that cannot be reached raises `StoreUnavailable`: the check and the admit then refuse the call
(nothing is forwarded), see `Forward`.
"""

from __future__ import annotations

from gateway.core.call import CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stores.base import BreakerStore


class CircuitBreaker:
    """The per-backend breaker over a `BreakerStore`; as a stage, the fail-fast check while a backend is down."""

    name = "circuit_breaker"

    def __init__(self, store: BreakerStore) -> None:
        self.store = store

    async def admit(self, backend: str, *, now: float, policy: CompiledPolicy) -> Decision | None:
        """None if the call may be sent now (the caller then records or releases), else the refusal."""
        wait = await self.store.admit(backend, now=now, reset_seconds=policy.breaker_reset_seconds)
        return self.refusal(backend, wait) if wait > 0 else None

    async def record(self, backend: str, *, ok: bool, now: float, policy: CompiledPolicy) -> None:
        await self.store.record(backend, ok=ok, now=now, threshold=policy.breaker_threshold)

    async def release(self, backend: str) -> None:
        await self.store.release(backend)

    def refusal(self, backend: str, wait: float) -> Decision:
        return Decision.block(
            ErrorCode.BACKEND_UNAVAILABLE,
            f"backend {backend} is failing; the gateway stopped sending it calls. Retry in {wait:.1f}s.",
            None,
            stage=self.name,
            retry_after=round(wait, 3),
        )

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        if ctx.tool is None or ctx.call.dry_run:
            return None
        wait = await self.store.check(ctx.tool.backend, now=ctx.clock, reset_seconds=policy.breaker_reset_seconds)
        return self.refusal(ctx.tool.backend, wait) if wait > 0 else None
