"""Forward: the decision's consequence, and the one place a call reaches its backend.

A blocked call is answered `blocked` (or `pending_approval`), a dry run `dry_run`. An allowed call
with an `idempotency_key` already answered replays the stored answer (the record step stores
fresh ones). Otherwise the circuit breaker admits the call right before it is sent, and records
how the backend answered right after — admit → send → record — or releases the probe if the
call ended without an answer (cancelled), so the breaker never waits for an outcome that never
comes. The backend's failures arrive as `CallError` (timeout, backend_unavailable, backend_error).
A shared store (idempotency, breaker) that cannot be reached before the send refuses the call
with `backend_unavailable` naming it: nothing is sent. After the send, a store failure is logged
and the backend's answer still returned (the call happened; refusing would only invite a retry).
Nothing is sent (nor replayed) unless the call's decision record is committed (`RecordDecision`):
without it the call fails closed with `internal_error`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import structlog

from gateway.core.call import CallContext, Status
from gateway.core.errors import CallError, ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stages import store_down
from gateway.stages.circuit_breaker import CircuitBreaker
from gateway.stores.base import IdempotencyStore, StoreUnavailable

log = structlog.get_logger()
_BREAKER_FAILURES = (ErrorCode.TIMEOUT, ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.BACKEND_ERROR)
UNRECORDED = "the karma ledger could not record the decision, so the call was not forwarded"


def replay_key(ctx: CallContext) -> str | None:
    """Where an idempotent answer is stored: per principal, tool and key."""
    if not ctx.call.idempotency_key or ctx.principal is None:
        return None
    return f"{ctx.principal.id}\x1f{ctx.call.tool}\x1f{ctx.call.idempotency_key}"


class Forward:
    name = "forward"

    def __init__(self, breaker: CircuitBreaker, idempotency: IdempotencyStore, clock: Callable[[], float]) -> None:
        self.breaker = breaker
        self.idempotency = idempotency
        self.clock = clock

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        decision = ctx.decision
        assert decision is not None
        ctx.message = decision.message
        if decision.blocks:
            ctx.error_code = decision.code
            pending = decision.code is ErrorCode.APPROVAL_REQUIRED
            ctx.status = Status.PENDING_APPROVAL if pending else Status.BLOCKED
        elif ctx.call.dry_run:
            ctx.status, ctx.message = Status.DRY_RUN, ctx.message or "dry run: the call would be allowed"
        else:
            await self._send(ctx, policy)

    async def _send(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        backend, tool = ctx.backend, ctx.tool
        assert backend is not None and tool is not None
        if not ctx.decision_committed:
            ctx.status, ctx.error_code, ctx.message = Status.ERROR, ErrorCode.INTERNAL_ERROR, UNRECORDED
            return
        key = replay_key(ctx)
        try:
            stored = None if key is None else await self.idempotency.get(key)
            refusal = None if stored is not None else await self.breaker.admit(backend.id, now=self.clock(), policy=policy)
        except StoreUnavailable as exc:
            log.error("forward.store_down", backend=backend.id, tool=ctx.call.tool, error=str(exc))
            refusal = store_down(exc, self.name)
            stored = None
        if stored is not None:
            if stored["argument_digest"] != ctx.argument_digest:
                ctx.status, ctx.error_code = Status.BLOCKED, ErrorCode.INVALID_PARAMS
                ctx.message = "idempotency_key was already used with different arguments"
                return
            ctx.warnings.append("replayed: this idempotency_key was already answered")
            ctx.status, ctx.result, ctx.disclosure_note = Status.OK, stored["result"], stored["disclosure"]
            return
        if refusal is not None:  # another call took the half-open probe since the breaker check, or a store is down
            ctx.decision = refusal
            ctx.status, ctx.error_code, ctx.message = Status.BLOCKED, refusal.code, refusal.message
            return
        try:
            answer = await backend.send(tool.name, ctx.arguments, timeout=policy.backend_timeout_seconds)
        except CallError as exc:
            await self._record(backend.id, exc.code not in _BREAKER_FAILURES, policy)
            ctx.status, ctx.error_code, ctx.message = Status.ERROR, exc.code, exc.message
            return
        except Exception as exc:
            log.exception("backend.failed", backend=backend.id, tool=ctx.call.tool)
            await self._record(backend.id, False, policy)
            ctx.status, ctx.error_code = Status.ERROR, ErrorCode.BACKEND_ERROR
            ctx.message = f"backend {backend.id} failed: {type(exc).__name__}"
            return
        except BaseException:
            with contextlib.suppress(StoreUnavailable):
                await self.breaker.release(backend.id)
            raise
        await self._record(backend.id, True, policy)
        ctx.status, ctx.answer, ctx.result, ctx.remember_key = Status.OK, answer, answer.result, key

    async def _record(self, backend: str, ok: bool, policy: CompiledPolicy) -> None:
        """Tell the breaker how the backend answered; a store that is down cannot undo the call."""
        try:
            await self.breaker.record(backend, ok=ok, now=self.clock(), policy=policy)
        except StoreUnavailable as exc:
            log.error("breaker.record_failed", backend=backend, ok=ok, error=str(exc))
