"""The Gateway: one governed call from request to signed, recorded outcome.

    decide (pipeline stages) → forward (idempotent replay, timeout, breaker) → disclosure rules
    → karma ledger append → receipt

Invariant 1: nothing reaches a backend without a decision, and every call is in the ledger
before its outcome is returned; if the ledger cannot be written the call fails closed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from audit.canon import NotCanonicalizable, digest, sha256_hex
from gateway.core.backends import Backend
from gateway.core.call import (
    CallContext,
    Credentials,
    Decision,
    Outcome,
    Principal,
    Status,
    ToolCall,
    ToolInfo,
)
from gateway.core.errors import CallError, ErrorCode, PolicyErrors
from gateway.logging import ensure_logging
from gateway.core.pipeline import decide
from gateway.policy.compile import CompiledPolicy, load_policy
from gateway.stages.sanitizer.walk import redact_secrets
from gateway.crypto.receipts import KeyStore, build_receipt, strip_receipt
from gateway.stages import Stage
from gateway.stages.approval import ApprovalGate
from gateway.stages.circuit_breaker import CircuitBreaker
from gateway.stages.dharma_rules import DharmaRules
from gateway.stages.disclosure import disclose
from gateway.stages.rate_limiter import RateLimiter
from gateway.stages.sanitizer.stage import Sanitizer
from gateway.stages.tier_gate import Authenticate, TierGate, ToolVisibility, authenticate, visible_tools
from gateway.stores.base import ApprovalStore, IdempotencyStore, LimiterStore
from gateway.stores.memory import MemoryApprovalStore, MemoryIdempotencyStore, MemoryLimiterStore, SessionHistory

log = structlog.get_logger()
ENVELOPE_VERSION = "1"
LEDGER_ORIGIN = "dharma-gateway/karma-ledger"


class Ledger(Protocol):
    """What the gateway needs of the karma ledger (audit.sqlite.SqliteLedger provides it)."""

    async def append(self, entry: dict[str, Any]) -> Any: ...
    async def aclose(self) -> None: ...


class Clock(Protocol):
    def __call__(self) -> float: ...


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def safe_digest(value: Any) -> str:
    """Digest of canonical JSON, or of a tagged repr for values that are not I-JSON (never raises)."""
    try:
        return digest(value)
    except NotCanonicalizable:
        return "nonjson:" + sha256_hex(repr(value).encode("utf-8", "surrogatepass"))


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
        clock: Clock = time.time,
        policy_path: Path | None = None,
    ) -> None:
        ensure_logging()
        self.policy = policy
        self.policy_path = policy_path
        self.ledger = ledger
        self.keys = keys
        self.clock = clock
        self.approvals = approval_store or MemoryApprovalStore()
        self.idempotency = idempotency_store or MemoryIdempotencyStore()
        self.history = SessionHistory()
        self.breaker = CircuitBreaker()
        self.stages: tuple[Stage, ...] = (
            Authenticate(),
            ToolVisibility(),
            Sanitizer(),
            self.breaker,
            RateLimiter(limiter_store or MemoryLimiterStore()),
            TierGate(),
            DharmaRules(),
            ApprovalGate(self.approvals),
        )
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

    def tools_for(self, credentials: Credentials) -> list[ToolInfo]:
        """The tools this caller may see: the same decision that gates their calls."""
        principal = authenticate(self.policy, credentials)
        if principal is None:
            return []
        return visible_tools(self.policy, principal, [info for info, _ in self._tools.values()])

    def principal_for(self, credentials: Credentials) -> Principal | None:
        return authenticate(self.policy, credentials)

    # ---- policy ----------------------------------------------------------------------

    def reload(self, path: Path | None = None) -> PolicyErrors | None:
        """Load the policy again; on failure keep serving the last good one and return the errors."""
        target = path or self.policy_path
        if target is None:
            return None
        try:
            fresh = load_policy(target, engine=self.policy.engine)
        except PolicyErrors as exc:
            log.error("policy.reload_failed", path=str(target), problems=[str(p) for p in exc.problems],
                      keeping=self.policy.version)
            return exc
        self.policy, self.policy_path = fresh, target
        log.info("policy.reloaded", path=str(target), version=fresh.version)
        return None

    # ---- approvals -------------------------------------------------------------------

    async def pending_approvals(self) -> list[Any]:
        """Held calls waiting for a human, oldest first."""
        return await self.approvals.pending(self.clock())

    async def approve(self, approval_id: str, *, by: str) -> Any:
        """Approve a held call; the caller then repeats it with `approval_id` (single use)."""
        return await self.approvals.decide(approval_id, approve=True, by=by, now=self.clock())

    async def deny(self, approval_id: str, *, by: str) -> Any:
        return await self.approvals.decide(approval_id, approve=False, by=by, now=self.clock())

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
    ) -> Governed:
        """Run one call through the pipeline, the backend, the ledger and the signer.

        `render` turns the outcome into the response body the transport returns; the receipt is
        signed over exactly that body. `request` is what the receipt's request digest covers
        (default: the tool name and arguments as received). `refusal` is a block the transport
        already decided (malformed input): it is recorded and signed like any other decision.
        `tool` and `backend` let a transport that proxies one upstream session (MCP) supply the
        tool definition it saw and the connection to forward on, instead of the catalog's.
        """
        started = self.clock()
        policy = self.policy
        ctx = CallContext(call=call, now=datetime.fromtimestamp(started, UTC), clock=started)
        entry = (tool, backend) if tool is not None and backend is not None else self._tools.get(call.tool)
        if entry is not None:
            ctx.tool = entry[0]
        ctx.principal = authenticate(policy, call.credentials)
        if ctx.principal is not None:
            ctx.session = self.history.session(call.session_id)
            ctx.karma = self.history.karma(ctx.principal.id, started)
        decision = refusal or await decide(self.stages, ctx, policy)
        if not ctx.argument_digest:
            ctx.argument_digest = safe_digest(call.arguments)
        result: Any = None
        status = Status.BLOCKED if decision.blocks else Status.OK
        error_code = decision.code if status is Status.BLOCKED else None
        message = decision.message
        disclosure_note: str | None = None
        if status is Status.BLOCKED and decision.code is ErrorCode.APPROVAL_REQUIRED:
            status = Status.PENDING_APPROVAL
        elif status is Status.OK and call.dry_run:
            status, message = Status.DRY_RUN, message or "dry run: the call would be allowed"
        elif status is Status.OK:
            assert entry is not None
            status, result, error_code, message, disclosure_note = await self._forward(ctx, policy, entry[1])
        outcome = Outcome(
            request_id=call.request_id,
            tool=call.tool,
            status=status,
            decision=decision,
            result=result,
            error_code=error_code,
            message=message if status is not Status.OK else "",
            warnings=tuple(dict.fromkeys(ctx.warnings)) if disclosure_note != "WITHHOLD" else (),
            approval_id=ctx.approval_id,
            idempotency_key=call.idempotency_key,
            timestamp=rfc3339(started),
        )
        return await self._record_and_sign(ctx, policy, outcome, disclosure_note, started, render, request)

    async def _forward(
        self, ctx: CallContext, policy: CompiledPolicy, backend: Backend
    ) -> tuple[Status, Any, ErrorCode | None, str, str | None]:
        call = ctx.call
        replay_key = None
        if call.idempotency_key and ctx.principal is not None:
            replay_key = f"{ctx.principal.id}\x1f{call.tool}\x1f{call.idempotency_key}"
            stored = await self.idempotency.get(replay_key)
            if stored is not None:
                if stored["argument_digest"] != ctx.argument_digest:
                    return (Status.BLOCKED, None, ErrorCode.INVALID_PARAMS,
                            "idempotency_key was already used with different arguments", None)
                ctx.warnings.append("replayed: this idempotency_key was already answered")
                return Status.OK, stored["result"], None, "", stored["disclosure"]
        assert ctx.tool is not None
        try:
            answer = await backend.send(ctx.tool.name, ctx.arguments, timeout=policy.backend_timeout_seconds)
        except CallError as exc:
            failed = exc.code in (ErrorCode.TIMEOUT, ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.BACKEND_ERROR)
            self.breaker.record(backend.id, ok=not failed, now=self.clock(), policy=policy)
            return Status.ERROR, None, exc.code, exc.message, None
        except Exception as exc:
            log.exception("backend.failed", backend=backend.id, tool=call.tool)
            self.breaker.record(backend.id, ok=False, now=self.clock(), policy=policy)
            return Status.ERROR, None, ErrorCode.BACKEND_ERROR, f"backend {backend.id} failed: {type(exc).__name__}", None
        self.breaker.record(backend.id, ok=True, now=self.clock(), policy=policy)
        result, verdict = disclose(ctx, policy, answer.result, answer.is_error)
        note = verdict.verdict.value if verdict is not None and verdict.enforced else None
        if replay_key is not None:
            await self.idempotency.put(
                replay_key, {"argument_digest": ctx.argument_digest, "result": result, "disclosure": note}
            )
        ctx.disclosure = verdict
        return Status.OK, result, None, "", note

    async def _record_and_sign(
        self,
        ctx: CallContext,
        policy: CompiledPolicy,
        outcome: Outcome,
        disclosure: str | None,
        started: float,
        render: Callable[[Outcome], dict[str, Any]],
        request: Any,
    ) -> Governed:
        call, decision = ctx.call, outcome.decision
        body = render(outcome)
        response_digest = safe_digest(strip_receipt(body))  # the form verifiers digest
        stored_args, _ = redact_secrets(ctx.arguments) if ctx.arguments else (None, ())
        latency_us = int((self.clock() - started) * 1_000_000)
        matched = list(decision.matched)
        if ctx.rules_decision is not None and ctx.rules_decision is not decision:
            matched = list(ctx.rules_decision.matched)
        disclosure_verdict = ctx.disclosure
        if disclosure_verdict is not None:
            matched.extend(disclosure_verdict.matched)
        entry = {
            "time": outcome.timestamp,
            "request_id": call.request_id,
            "principal": ctx.principal.id if ctx.principal else None,
            "tier": ctx.principal.tier if ctx.principal else None,
            "backend": ctx.tool.backend if ctx.tool else None,
            "tool": call.tool,
            "method": call.method,
            "session_id": call.session_id,
            "args_digest": ctx.argument_digest,
            "args": stored_args,  # sanitized arguments: canonical JSON by construction
            "findings": [f.kind + "@" + f.path for f in ctx.findings],
            "decision": _decision_name(decision),
            "enforced": decision.enforced,
            "matched_rules": list(dict.fromkeys(m.rule_id for m in matched)),
            "block_class": decision.block_class.value if decision.block_class else None,
            "stage": decision.stage or None,
            "sensitivity": ctx.sensitivity.value,
            "purpose": call.purpose,
            "disclosure": disclosure,
            "policy_version": policy.version,
            "approval_id": outcome.approval_id,
            "idempotency_key": call.idempotency_key,
            "response_digest": response_digest,
            "status": outcome.status.value,
            "error_code": outcome.error_code.value if outcome.error_code else None,
            "latency_us": latency_us,
            "tool_digest": ctx.tool.digest if ctx.tool else None,
            "dry_run": call.dry_run,
        }
        try:
            appended = await self.ledger.append(entry)
        except Exception as exc:
            log.error("ledger.append_failed", request_id=call.request_id, error=str(exc))
            failed = replace(
                outcome,
                status=Status.ERROR,
                result=None,
                error_code=ErrorCode.INTERNAL_ERROR,
                message="the karma ledger could not record this call, so it was refused",
                warnings=(),
            )
            return Governed(failed, render(failed))
        self.history.record(
            session_id=call.session_id,
            principal=ctx.principal.id if ctx.principal else "",
            tool=call.tool,
            decision=entry["decision"],
            denied=decision.blocks,
            now=started,
            time=outcome.timestamp,
        )
        req = request if request is not None else {"tool": call.tool, "arguments": call.arguments}
        try:
            token = build_receipt(
                self.keys,
                request_id=call.request_id,
                request=req,
                request_sha256=safe_digest(req),
                response=body,
                ledger_seq=appended.seq,
                ledger_hash=appended.hash,
                now=datetime.fromtimestamp(self.clock(), UTC),
                response_sha256=response_digest,
            )
        except NotCanonicalizable:
            token = None
        final = replace(outcome, receipt=token, ledger_seq=appended.seq, ledger_hash=appended.hash, latency_ms=latency_us / 1000)
        response = dict(body)
        if token is not None:
            response["receipt"] = token
        log.info(
            "call.decided",
            request_id=call.request_id,
            tool=call.tool,
            principal=entry["principal"],
            decision=entry["decision"],
            status=entry["status"],
            seq=appended.seq,
        )
        return Governed(final, response)

    async def aclose(self) -> None:
        """Close backends, sign a checkpoint of the ledger head into the ledger, close it."""
        for backend in self._backends.values():
            await backend.aclose()
        checkpoint = getattr(self.ledger, "checkpoint", None)
        if checkpoint is not None and self.keys is not None and getattr(self.ledger, "size", None):
            try:
                await checkpoint(self.keys.checkpoint_key, self.keys.checkpoint_key_name, LEDGER_ORIGIN)
            except Exception as exc:
                log.warning("ledger.checkpoint_failed", error=str(exc))
        await self.ledger.aclose()


def _decision_name(decision: Decision) -> str:
    """The decided effect; with `enforced` false it reads as "would deny" and so on."""
    return decision.effect.value
