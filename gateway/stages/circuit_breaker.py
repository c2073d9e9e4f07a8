"""Circuit breaker per backend: closed → open after repeated failures → half-open probe → closed.

While open, calls fail fast with `backend_unavailable` and a retry hint instead of piling up on
a backend that is down. The forward step reports each outcome with `record()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.call import CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy


@dataclass(slots=True)
class BreakerState:
    state: str = "closed"  # closed | open | half_open
    failures: int = 0
    opened_at: float = 0.0
    probing: bool = False


def admit(s: BreakerState, *, now: float, reset_seconds: float) -> float:
    """0.0 if a call may go to the backend now, else seconds until the breaker half-opens."""
    if s.state == "open":
        waited = now - s.opened_at
        if waited < reset_seconds:
            return reset_seconds - waited
        s.state, s.probing = "half_open", False
    if s.state == "half_open":
        if s.probing:
            return max(reset_seconds / 10, 0.1)
        s.probing = True
    return 0.0


def record(s: BreakerState, *, ok: bool, now: float, threshold: int) -> None:
    if ok:
        s.state, s.failures, s.probing = "closed", 0, False
        return
    s.failures += 1
    if s.state == "half_open" or s.failures >= threshold:
        s.state, s.opened_at, s.probing = "open", now, False


class CircuitBreaker:
    name = "circuit_breaker"

    def __init__(self) -> None:
        self._states: dict[str, BreakerState] = {}

    def state(self, backend: str) -> BreakerState:
        s = self._states.get(backend)
        if s is None:
            s = self._states[backend] = BreakerState()
        return s

    def record(self, backend: str, *, ok: bool, now: float, policy: CompiledPolicy) -> None:
        record(self.state(backend), ok=ok, now=now, threshold=policy.breaker_threshold)

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        if ctx.tool is None or ctx.call.dry_run:
            return None
        wait = admit(self.state(ctx.tool.backend), now=ctx.clock, reset_seconds=policy.breaker_reset_seconds)
        if wait <= 0:
            return None
        return Decision.block(
            ErrorCode.BACKEND_UNAVAILABLE,
            f"backend {ctx.tool.backend} is failing; the gateway stopped sending it calls. Retry in {wait:.1f}s.",
            None,
            stage=self.name,
            retry_after=round(wait, 3),
        )
