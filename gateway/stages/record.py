"""Record: the karma ledger append, before the response leaves (invariant 1).

Builds the call's `Outcome` and its ledger entry (the entry's fields are a contract: auditors
and `dharma audit` read them), appends it, and notes the call in the session history rules see.
A fresh answer to a call with an `idempotency_key` is stored here too, as returned, for replay.
If the ledger cannot be written the call fails closed: the outcome becomes `internal_error`
and nothing of the result is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from audit.canon import NotCanonicalizable, digest, sha256_hex
from gateway.core.call import CallContext, Decision, Outcome, Status
from gateway.core.errors import ErrorCode
from gateway.crypto.receipts import strip_receipt
from gateway.policy.compile import CompiledPolicy
from gateway.stages.sanitizer.walk import redact_secrets
from gateway.stores.base import IdempotencyStore

log = structlog.get_logger()


class Ledger(Protocol):
    """What the gateway needs of the karma ledger (audit.sqlite.SqliteLedger provides it)."""

    async def append(self, entry: dict[str, Any]) -> Any: ...
    async def aclose(self) -> None: ...


class History(Protocol):
    """Where recent calls are noted for sequence and karma rules (gateway.stores.memory.SessionHistory)."""

    def record(self, *, session_id: str | None, principal: str, tool: str, decision: str, denied: bool,
               now: float, time: str) -> None: ...


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def safe_digest(value: Any) -> str:
    """Digest of canonical JSON, or of a tagged repr for values that are not I-JSON (never raises)."""
    try:
        return digest(value)
    except NotCanonicalizable:
        return "nonjson:" + sha256_hex(repr(value).encode("utf-8", "surrogatepass"))


def decision_name(decision: Decision) -> str:
    """The decided effect; with `enforced` false it reads as "would deny" and so on."""
    return decision.effect.value


def outcome_of(ctx: CallContext) -> Outcome:
    """The call's outcome as the forward and disclosure steps left it."""
    assert ctx.decision is not None
    return Outcome(
        request_id=ctx.call.request_id,
        tool=ctx.call.tool,
        status=ctx.status,
        decision=ctx.decision,
        result=ctx.result,
        error_code=ctx.error_code,
        message=ctx.message if ctx.status is not Status.OK else "",
        warnings=tuple(dict.fromkeys(ctx.warnings)) if ctx.disclosure_note != "WITHHOLD" else (),
        approval_id=ctx.approval_id,
        idempotency_key=ctx.call.idempotency_key,
        timestamp=rfc3339(ctx.clock),
    )


def ledger_entry(
    ctx: CallContext, policy: CompiledPolicy, outcome: Outcome, *, response_digest: str, latency_us: int
) -> dict[str, Any]:
    """The ledger record of one call (contract: keep every field and its meaning)."""
    call, decision = ctx.call, outcome.decision
    stored_args, _ = redact_secrets(ctx.arguments) if ctx.arguments else (None, ())
    matched = list(decision.matched)
    if ctx.rules_decision is not None and ctx.rules_decision is not decision:
        matched = list(ctx.rules_decision.matched)
    if ctx.disclosure is not None:
        matched.extend(ctx.disclosure.matched)
    return {
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
        "decision": decision_name(decision),
        "enforced": decision.enforced,
        "matched_rules": list(dict.fromkeys(m.rule_id for m in matched)),
        "block_class": decision.block_class.value if decision.block_class else None,
        "stage": decision.stage or None,
        "sensitivity": ctx.sensitivity.value,
        "purpose": call.purpose,
        "disclosure": ctx.disclosure_note,
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


class Record:
    name = "record"

    def __init__(
        self, ledger: Ledger, history: History, idempotency: IdempotencyStore, clock: Callable[[], float]
    ) -> None:
        self.ledger = ledger
        self.history = history
        self.idempotency = idempotency
        self.clock = clock

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        call = ctx.call
        assert ctx.render is not None
        if ctx.remember_key is not None:
            await self.idempotency.put(
                ctx.remember_key,
                {"argument_digest": ctx.argument_digest, "result": ctx.result, "disclosure": ctx.disclosure_note},
            )
        outcome = outcome_of(ctx)
        body = ctx.render(outcome)
        ctx.response_digest = safe_digest(strip_receipt(body))  # the form verifiers digest
        ctx.latency_us = int((self.clock() - ctx.clock) * 1_000_000)
        entry = ledger_entry(ctx, policy, outcome, response_digest=ctx.response_digest, latency_us=ctx.latency_us)
        try:
            ctx.appended = await self.ledger.append(entry)
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
            ctx.outcome, ctx.response = failed, ctx.render(failed)  # final: nothing to sign
            return
        self.history.record(
            session_id=call.session_id,
            principal=ctx.principal.id if ctx.principal else "",
            tool=call.tool,
            decision=entry["decision"],
            denied=outcome.decision.blocks,
            now=ctx.clock,
            time=outcome.timestamp,
        )
        ctx.outcome, ctx.body, ctx.entry = outcome, body, entry
