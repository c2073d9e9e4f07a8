"""Circuit breaker per backend: closed → open after repeated failures → half-open probe → closed.

While open, calls fail fast with `backend_unavailable` and a retry hint instead of piling up on
a backend that is down. This early stage only *checks* (no state change), so a call that a
later stage blocks cannot leave the breaker waiting for an outcome that never comes. The forward
step *admits* the call right before sending it (claiming the one half-open probe), then
*records* how the backend answered, or *releases* the probe if the call never got that far.
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


def _probe_wait(reset_seconds: float) -> float:
    return max(reset_seconds / 10, 0.1)


def check(s: BreakerState, *, now: float, reset_seconds: float) -> float:
    """0.0 if a call could go to the backend now, else seconds to wait. Changes nothing."""
    if s.state == "open":
        waited = now - s.opened_at
        return reset_seconds - waited if waited < reset_seconds else 0.0
    if s.state == "half_open" and s.probing:
        return _probe_wait(reset_seconds)
    return 0.0


def admit(s: BreakerState, *, now: float, reset_seconds: float) -> float:
    """Like `check`, but claims the call's place: after the reset time the breaker half-opens and
    this call becomes its one probe. Every admitted call must end in `record` or `release`."""
    if s.state == "open":
        waited = now - s.opened_at
        if waited < reset_seconds:
            return reset_seconds - waited
        s.state, s.probing = "half_open", False
    if s.state == "half_open":
        if s.probing:
            return _probe_wait(reset_seconds)
        s.probing = True
    return 0.0


def record(s: BreakerState, *, ok: bool, now: float, threshold: int) -> None:
    """The backend answered an admitted call: success closes the breaker, failures open it."""
    if ok:
        s.state, s.failures, s.probing = "closed", 0, False
        return
    s.failures += 1
    if s.state == "half_open" or s.failures >= threshold:
        s.state, s.opened_at, s.probing = "open", now, False


def release(s: BreakerState) -> None:
    """An admitted call ended without a backend answer (cancelled): free the probe for the next call."""
    s.probing = False


class CircuitBreaker:
    """The per-backend breaker states; as a stage, the fail-fast check while a backend is down."""

    name = "circuit_breaker"

    def __init__(self) -> None:
        self._states: dict[str, BreakerState] = {}

    def state(self, backend: str) -> BreakerState:
        s = self._states.get(backend)
        if s is None:
            s = self._states[backend] = BreakerState()
        return s

    def admit(self, backend: str, *, now: float, policy: CompiledPolicy) -> Decision | None:
        """None if the call may be sent now (the caller then records or releases), else the refusal."""
        wait = admit(self.state(backend), now=now, reset_seconds=policy.breaker_reset_seconds)
        return self.refusal(backend, wait) if wait > 0 else None

    def record(self, backend: str, *, ok: bool, now: float, policy: CompiledPolicy) -> None:
        record(self.state(backend), ok=ok, now=now, threshold=policy.breaker_threshold)

    def release(self, backend: str) -> None:
        release(self.state(backend))

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
        wait = check(self.state(ctx.tool.backend), now=ctx.clock, reset_seconds=policy.breaker_reset_seconds)
        return self.refusal(ctx.tool.backend, wait) if wait > 0 else None
