"""The Gateway: wires the dependencies (policy, backends, stores, ledger, keys, clock) and runs
every governed call through the one declaration in `gateway.core.pipeline`.

Invariant 1: nothing reaches a backend without a decision, and every call is in the ledger
before its outcome is returned; if the ledger cannot be written the call fails closed.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog

from gateway.core.backends import Backend
from gateway.core.call import CallContext, Credentials, Decision, Outcome, Principal, ToolCall, ToolInfo
from gateway.core.errors import PolicyErrors, PolicyProblem
from gateway.core.refusals import RefusalLimits, RefusalRecorder
from gateway.core.reload import PolicyStatus, ReloadAttempt, Trigger, failure_text, reload_entry
from gateway.core.pipeline import Wiring, run, split, steps
from gateway.crypto.receipts import KeyStore
from gateway.logging import ensure_logging
from gateway.metrics import Metrics
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.stages import HISTORY, store_down
from gateway.stages.approval import SAFETY_POLL_SECONDS, ApprovalRecorder, ApprovalRefused, approver_refusal
from gateway.stages.authenticate import authenticate
from gateway.stages.circuit_breaker import CircuitBreaker
from gateway.stages.record import Ledger, history_session, rfc3339, safe_digest
from gateway.stages.visibility import visible_tools
from gateway.stores.base import (
    ApprovalSignals, ApprovalStore, BreakerStore, HistoryStore, IdempotencyStore, LimiterStore, PinStore,
    StoreUnavailable,
)  # fmt: skip
from gateway.stores.memory import (
    MemoryApprovalSignals, MemoryApprovalStore, MemoryBreakerStore, MemoryIdempotencyStore, MemoryLimiterStore,
    SessionHistory,
)  # fmt: skip

__all__ = [
    "ENVELOPE_VERSION", "LEDGER_ORIGIN", "Clock", "Gateway", "Governed", "Ledger",
    "envelope", "new_request_id", "rfc3339", "safe_digest",
]  # fmt: skip

log = structlog.get_logger()
ENVELOPE_VERSION = "1"
LEDGER_ORIGIN = "dharma-gateway/karma-ledger"


class Clock(Protocol):
    def __call__(self) -> float: ...


class Dependency(Protocol):
    """Something the gateway needs that can be down (a shared store's link), for /healthz and close."""

    name: str

    async def ping(self) -> str | None:
        """None when it answers, else why not (never a secret)."""
        ...

    async def aclose(self) -> None: ...


class CallTracer(Protocol):
    """Spans around governed calls (`gateway.tracing.OtelTracer` when `tracing.otel` is on, else none)."""

    def call_span(self, call: ToolCall) -> contextlib.AbstractContextManager[Any]: ...
    def finish(self, span: Any, outcome: Outcome, policy_version: str, ledger_seq: int | None) -> None: ...
    def outgoing(self) -> dict[str, str]: ...


def new_request_id() -> str:
    """`req_` and 8 random bytes in hex. (Ids cut from shared blocks of random bytes saved ~0.3 µs a
    call, not worth their thread and fork care: docs/performance-history.md, issue 26.)"""
    return "req_" + secrets.token_hex(8)


def envelope(outcome: Outcome) -> dict[str, Any]:
    """The stable HTTP/in-process envelope (design §6), without the receipt."""
    return {
        "status": outcome.status.value,
        "tool": outcome.tool,
        "request_id": outcome.request_id,
        "idempotency_key": outcome.idempotency_key,
        "message": outcome.message,
        "error_code": outcome.error_code.value if outcome.error_code else None,
        "retryable": outcome.retryable,
        "retry_after": outcome.decision.retry_after,
        "approval_id": outcome.approval_id,
        "result": outcome.result,
        "warnings": list(outcome.warnings),
        "timestamp": outcome.timestamp,
        "envelope_version": ENVELOPE_VERSION,
    }


@dataclass(frozen=True, slots=True)
class Governed:
    """An outcome plus the response body exactly as returned (receipt attached)."""

    outcome: Outcome
    response: dict[str, Any]


class Gateway:
    """Governs tool calls against backends under one compiled policy."""

    def __init__(
        self,
        policy: CompiledPolicy,
        backends: Sequence[Backend],
        *,
        ledger: Ledger,
        keys: KeyStore,
        limiter_store: LimiterStore | None = None,
        approval_store: ApprovalStore | None = None,
        idempotency_store: IdempotencyStore | None = None,
        breaker_store: BreakerStore | None = None,
        history_store: HistoryStore | None = None,
        pin_store: PinStore | None = None,
        approval_signals: ApprovalSignals | None = None,
        approval_poll_seconds: float = SAFETY_POLL_SECONDS,
        clock: Clock = time.time,
        policy_path: Path | None = None,
        dependencies: Sequence[Dependency] = (),
        policy_loader: Callable[[], CompiledPolicy] | None = None,
        refusal_limits: RefusalLimits | None = None,
    ) -> None:
        ensure_logging()
        self.policy = policy
        self.policy_path = policy_path
        # reads and compiles the policy files again (a reload); by default the profile at policy_path
        self.policy_loader = policy_loader or (
            functools.partial(load_policy, policy_path, engine=policy.engine) if policy_path is not None else None
        )
        self.policy_loaded_at = clock()
        self.last_reload: ReloadAttempt | None = None
        self._reload_lock = anyio.Lock()
        self.metrics = Metrics()
        self.tracer: CallTracer | None = None  # set by runtime when tracing.otel is on
        self.ledger = ledger
        self.keys = keys
        self.clock = clock
        self.approvals = approval_store or MemoryApprovalStore()
        self.approval_recorder = ApprovalRecorder(self.approvals, ledger)
        # the HTTP auth layer's refusals, aggregated onto the ledger (gateway.core.refusals)
        self.refusals = RefusalRecorder(ledger, self.metrics, refusal_limits, policy_version=lambda: self.policy.version,
                                        clock=clock)
        self.approval_signals = approval_signals or MemoryApprovalSignals()
        self.approval_poll_seconds = approval_poll_seconds
        self.idempotency = idempotency_store or MemoryIdempotencyStore()
        self.history = history_store or SessionHistory()
        self.breaker = CircuitBreaker(breaker_store or MemoryBreakerStore())
        self.dependencies = tuple(dependencies)
        self.pins = pin_store  # tool pins for the MCP transports (None: theirs, under the state root)
        self._closed = False
        self.steps = steps(
            Wiring(
                ledger=ledger,
                keys=keys,
                limiter_store=limiter_store or MemoryLimiterStore(),
                approvals=self.approvals,
                approval_recorder=self.approval_recorder,
                approval_signals=self.approval_signals,
                approval_poll_seconds=approval_poll_seconds,
                idempotency=self.idempotency,
                history=self.history,
                breaker=self.breaker,
                clock=clock,
            )
        )
        self.stages, self.after_decision = split(self.steps)
        self._backends: dict[str, Backend] = {}
        self._tools: dict[str, tuple[ToolInfo, Backend]] = {}
        for backend in backends:
            self.add_backend(backend)

    # ---- catalog ---------------------------------------------------------------------

    def add_backend(self, backend: Backend) -> None:
        """Register a backend and its tools; a name already served by another backend is refused."""
        for info in backend.tools():
            if info.name in self._tools:
                other = self._tools[info.name][1].id
                raise ValueError(f"tool {info.name!r} of backend {backend.id!r} collides with backend {other!r}")
            self._tools[info.name] = (info, backend)
        self._backends[backend.id] = backend

    def catalog(self) -> list[ToolInfo]:
        """Every tool the backends serve, unfiltered (for start-up reports, never for callers)."""
        return [info for info, _ in self._tools.values()]

    def served(self, tool: str) -> tuple[ToolInfo, Backend] | None:
        """The catalog's definition of `tool` and the backend serving it (None: no backend has it)."""
        return self._tools.get(tool)

    def tools_for(self, credentials: Credentials) -> list[ToolInfo]:
        """The tools this caller may see: the same decision that gates their calls."""
        principal = authenticate(self.policy, credentials)
        if principal is None:
            return []
        return visible_tools(self.policy, principal, [info for info, _ in self._tools.values()])

    def principal_for(self, credentials: Credentials) -> Principal | None:
        return authenticate(self.policy, credentials)

    # ---- policy ----------------------------------------------------------------------

    async def reload(self, *, trigger: Trigger = "api", by: str | None = None) -> ReloadAttempt:
        """Load, compile and check the policy files again; record the attempt in the ledger; then
        serve the new policy. A policy that does not load, or an attempt the ledger cannot record,
        keeps the last good one serving (logged with `file:line`, and shown by `policy_status`).

        Calls already running finish under the policy they started with. Attempts run one at a time.
        """
        async with self._reload_lock:
            old = self.policy
            at = self.clock()
            fresh: CompiledPolicy | None = None
            problems: list[PolicyProblem] = []
            if self.policy_loader is None:
                problems = [PolicyProblem("", 0, "", "this gateway was given a compiled policy, not files to reload")]
            else:
                try:  # compiling can take a while: off the event loop, so calls keep flowing
                    fresh = await anyio.to_thread.run_sync(self.policy_loader)
                except PolicyErrors as exc:
                    problems = list(exc.problems)
                except (OSError, ValueError) as exc:
                    problems = [PolicyProblem(str(self.policy_path or ""), 0, "", f"cannot read the policy: {exc}")]
            attempt = ReloadAttempt(
                at=rfc3339(at), trigger=trigger, by=by, ok=fresh is not None, old_version=old.version,
                new_version=fresh.version if fresh else None, changed=fresh is not None and fresh.version != old.version,
                error=None if fresh else failure_text(problems), problems=[str(p) for p in problems],
            )
            serving = fresh or old
            try:
                appended = await self.ledger.append(reload_entry(attempt, serving=serving.version, files=list(serving.files)))
            except Exception as exc:  # every policy change is in the ledger before it takes effect
                log.error("policy.reload_not_recorded", trigger=trigger, error=str(exc), keeping=old.version)
                attempt = attempt.model_copy(update={
                    "ok": False, "error": f"the karma ledger could not record this reload, so the policy was kept ({exc})"})
            else:
                attempt = attempt.model_copy(update={"ledger_seq": getattr(appended, "seq", None)})
            if attempt.ok and fresh is not None:
                self.policy, self.policy_loaded_at = fresh, at  # one assignment: a call reads it once, when it starts
                log.info("policy.reloaded", trigger=trigger, by=by, old_version=old.version, version=fresh.version,
                         changed=attempt.changed, ledger_seq=attempt.ledger_seq)
            elif problems:
                first = problems[0]
                log.error("policy.reload_failed", trigger=trigger, by=by, file=first.file, line=first.line,
                          error=attempt.error, problems=attempt.problems, keeping=old.version, ledger_seq=attempt.ledger_seq)
            self.last_reload = attempt
            self.metrics.reload(ok=attempt.ok, trigger=trigger)
            return attempt

    def policy_status(self) -> PolicyStatus:
        """The policy being served and the last reload attempt (for /healthz and the approvals page)."""
        policy, last = self.policy, self.last_reload
        return PolicyStatus(
            name=policy.name, version=policy.version, files=list(policy.files), loaded_at=rfc3339(self.policy_loaded_at),
            state="degraded" if last is not None and not last.ok else "ok", last_reload=last,
        )

    # ---- approvals -------------------------------------------------------------------

    async def pending_approvals(self) -> list[Any]:
        """Held calls waiting for a human, oldest first."""
        return await self.approvals.pending(self.clock())

    async def approve(self, approval_id: str, *, by: str, via: str = "api", reason: str = "") -> Any:
        """Approve a held call as principal `by` (an authenticated principal id, never free text);
        the caller then repeats it with `approval_id` (single use).

        Raises KeyError (unknown id), ValueError (not pending) or ApprovalRefused (self-approval
        the policy does not allow). The approved event is in the ledger before the call is released.
        """
        return await self.decide(approval_id, approve=True, by=by, via=via, reason=reason)

    async def deny(self, approval_id: str, *, by: str, via: str = "api", reason: str = "") -> Any:
        """Deny a held call as principal `by`; raises as `approve` does."""
        return await self.decide(approval_id, approve=False, by=by, via=via, reason=reason)

    async def decide(self, approval_id: str, *, approve: bool, by: str, via: str, reason: str, tier: str | None = None) -> Any:
        """Append the decision to the approval store, then record it in the ledger (see `approve`).
        `tier` is the deciding principal's (an elicitation answer counts only for the tiers the policy allows)."""
        current = await self.approvals.get(approval_id)
        if current is None:
            raise KeyError(approval_id)
        refusal = approver_refusal(self.policy, current, by=by, approve=approve, via=via, tier=tier)
        if refusal is not None:
            log.warning("approval.refused", approval_id=approval_id, by=by, via=via, reason=refusal)
            raise ApprovalRefused(refusal)
        try:
            decided = await self.approvals.decide(approval_id, approve=approve, by=by, now=self.clock(), via=via, reason=reason)
        finally:  # the decision, or the `expired` event a late decision found, goes into the chain now
            await self.approval_recorder.try_sync()
        await self.approval_signals.notify(approval_id)  # the holder, on this replica or another, looks again
        return decided

    # ---- calls -----------------------------------------------------------------------

    async def call(
        self,
        tool: str,
        arguments: Any = None,
        *,
        api_key: str | None = None,
        local_user: str | None = None,
        purpose: str | None = None,
        disclosure_mode: str | None = None,
        depth: str | None = None,
        session_id: str | None = None,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        dry_run: bool = False,
        request_id: str | None = None,
    ) -> Outcome:
        """Govern one call from Python. Returns the outcome with its receipt."""
        call = ToolCall(
            tool=tool,
            arguments=arguments,
            request_id=request_id or new_request_id(),
            credentials=Credentials(api_key=api_key, local_user=local_user),
            purpose=purpose,
            disclosure_mode=disclosure_mode,
            depth=depth,
            session_id=session_id,
            idempotency_key=idempotency_key,
            approval_id=approval_id,
            dry_run=dry_run,
        )
        return (await self.govern(call)).outcome

    async def govern(
        self,
        call: ToolCall,
        *,
        render: Callable[[Outcome], dict[str, Any]] = envelope,
        request: Any = None,
        refusal: Decision | None = None,
        tool: ToolInfo | None = None,
        backend: Backend | None = None,
        policy: CompiledPolicy | None = None,
    ) -> Governed:
        """Run one call through the pipeline, the backend, the ledger and the signer.

        `render` turns the outcome into the response body the transport returns; the receipt is
        signed over exactly that body. `request` is what the receipt's request digest covers
        (default: the tool name and arguments as received). `refusal` is a block the transport
        already decided (malformed input): it is recorded and signed like any other decision.
        `tool` and `backend` let a transport that proxies one upstream session (MCP) supply the
        tool definition it saw and the connection to forward on, instead of the catalog's.
        `policy` pins the policy a transport read when the call began (an MCP call governed again
        after its approval stays under the policy that held it); default: the one serving now.
        """
        started = self.clock()
        policy = policy or self.policy  # read once: the call finishes under this policy whatever reloads meanwhile
        ctx = CallContext(
            call=call,
            now=datetime.fromtimestamp(started, UTC),
            clock=started,
            render=render,
            receipt_request=request,
            decision=refusal,
        )
        entry = (tool, backend) if tool is not None and backend is not None else self._tools.get(call.tool)
        if entry is not None:
            ctx.tool, ctx.backend = entry
        ctx.principal = authenticate(policy, call.credentials)
        if ctx.principal is not None:
            try:
                ctx.session, ctx.karma = await self.history.read(history_session(call, ctx.principal.id), ctx.principal.id, started)
            except StoreUnavailable as exc:  # sequence and karma rules cannot be judged: fail closed
                log.error("history.store_down", request_id=call.request_id, error=str(exc))
                ctx.decision = ctx.decision or store_down(exc, HISTORY)
        metrics = self.metrics
        if self.tracer is None:
            await run(self.stages, self.after_decision, ctx, policy, metrics.stage)
        else:
            with self.tracer.call_span(call) as span:
                await run(self.stages, self.after_decision, ctx, policy, metrics.stage)
                if ctx.outcome is not None:
                    self.tracer.finish(span, ctx.outcome, policy.version, ctx.outcome.ledger_seq)
        outcome = ctx.outcome
        assert outcome is not None and ctx.response is not None
        decision = outcome.decision
        metrics.call(
            tool=call.tool, known=ctx.tool is not None, decision=decision.effect.value, status=outcome.status.value,
            error_code=outcome.error_code.value if outcome.error_code else None,
            rules=[(m.rule_id, m.effect.value, m.mode.value) for m in decision.matched],
            backend=ctx.tool.backend if ctx.tool else None, seconds=self.clock() - started,
        )
        return Governed(outcome, ctx.response)

    async def upstreams_up(self, extra: Sequence[str] = ()) -> dict[str, bool]:
        """Per backend (and each of `extra`, e.g. /mcp's upstreams): False while its circuit breaker
        is open (the gateway refuses its calls), else True. A breaker store that is down reads as down."""
        now, policy, out = self.clock(), self.policy, {}
        for name in dict.fromkeys([*self._backends, *extra]):
            try:
                out[name] = await self.breaker.store.check(name, now=now, reset_seconds=policy.breaker_reset_seconds) <= 0
            except StoreUnavailable:
                out[name] = False
        return out

    async def health(self) -> dict[str, str | None]:
        """Each dependency's state: None when up, else why it is down (/healthz)."""
        return {dep.name: await dep.ping() for dep in self.dependencies}

    async def aclose(self) -> None:
        """Write the auth-layer refusal counts still held, record approval events still outside the
        chain (e.g. a CLI decision nobody came back for), close backends, sign a checkpoint of the ledger head into the ledger, close it,
        then close the links to shared stores. Once."""
        if self._closed:
            return
        self._closed = True
        await self.refusals.aclose()
        await self.approval_recorder.try_sync()
        await self.approval_signals.aclose()
        for backend in self._backends.values():
            await backend.aclose()
        checkpoint = getattr(self.ledger, "checkpoint", None)
        if checkpoint is not None and self.keys is not None and getattr(self.ledger, "size", None):
            try:
                await checkpoint(self.keys.checkpoint_key, self.keys.checkpoint_key_name, LEDGER_ORIGIN)
            except Exception as exc:
                log.warning("ledger.checkpoint_failed", error=str(exc))
        await self.ledger.aclose()
        close_store = getattr(self.approvals, "aclose", None)
        if close_store is not None:
            await close_store()
        for dep in self.dependencies:
            await dep.aclose()

