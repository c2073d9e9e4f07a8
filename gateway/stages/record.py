"""Record and RecordDecision: the karma ledger appends of a call (invariant 1), two-phase.

A call about to reach its backend is recorded twice: `RecordDecision` commits a *decision*
record (`kind: "decision"`) before `Forward` may send anything, and `Record` commits the
*outcome* record (`kind: "outcome"`, linked by `decision_seq` / `decision_hash`) before the
answer leaves. A decision with no outcome therefore means the gateway stopped mid-call. A
refused call (blocked, dry run, a transport's refusal) never reaches a backend and stays one
record with no `kind`, the form older ledgers hold throughout.

`Record` builds the call's `Outcome` and its ledger entry (the entry's fields are a contract:
auditors and `dharma audit` read them), appends it, and notes the call in the session history
rules see. A fresh answer to a call with an `idempotency_key` is stored here too, as returned,
for replay. If the ledger cannot be written the call fails closed: the outcome becomes
`internal_error` and nothing of the result is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from audit.canon import NotCanonicalizable, digest, sha256_hex
from audit.records import KIND_DECISION, KIND_OUTCOME
from gateway.core.call import CallContext, Decision, Outcome, RuleMatch, Status, ToolCall
from gateway.core.errors import ErrorCode
from gateway.crypto.receipts import strip_receipt
from gateway.policy.compile import CompiledPolicy
from gateway.stages.sanitizer.walk import redact_secrets
from gateway.stages import HISTORY
from gateway.stages.classify import history_detail
from gateway.stores.base import HistoryStore, IdempotencyStore, StoreUnavailable

log = structlog.get_logger()


class Ledger(Protocol):
    """What the gateway needs of the karma ledger (audit.sqlite.SqliteLedger provides it)."""

    async def append(self, entry: dict[str, Any]) -> Any: ...
    async def aclose(self) -> None: ...


def rfc3339(ts: float) -> str:
    """`ts` as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def safe_digest(value: Any) -> str:
    """Digest of canonical JSON, or of a tagged repr for values that are not I-JSON (never raises)."""
    try:
        return digest(value)
    except NotCanonicalizable:
        return "nonjson:" + sha256_hex(repr(value).encode("utf-8", "surrogatepass"))


def history_session(call: ToolCall, principal: str) -> str:
    """The session whose history a call reads and extends: the transport's (the stdio connection,
    the MCP HTTP session, the tool API's `session_id`), or, when it has none (sessionless
    2026-07-28 MCP requests, tool API calls without `session_id`), every such call of the
    principal, so leaving the session out cannot break a sequence apart."""
    return call.session_id or f"principal:{principal}"


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


def decided_matches(ctx: CallContext, decision: Decision) -> list[RuleMatch]:
    """The rule matches behind `decision`: the rules' own when another stage's decision won."""
    if ctx.rules_decision is not None and ctx.rules_decision is not decision:
        return list(ctx.rules_decision.matched)
    return list(decision.matched)


def stored_arguments(ctx: CallContext) -> Any:
    """The sanitized arguments with secrets redacted, as both of a call's records store them (made once)."""
    if ctx.stored_arguments is None and ctx.arguments:
        ctx.stored_arguments, _ = redact_secrets(ctx.arguments)
    return ctx.stored_arguments


def call_part(ctx: CallContext, policy: CompiledPolicy) -> dict[str, Any]:
    """The fields of `call_fields` that do not depend on the decision: who, what, with which arguments.

    Built once per call (kept on `ctx`) and shared by its decision record and outcome record: nothing
    they read changes once the call is decided.
    """
    part = ctx.record_part
    if part is None:
        call, principal, tool = ctx.call, ctx.principal, ctx.tool
        part = ctx.record_part = {
            "time": rfc3339(ctx.clock),
            "request_id": call.request_id,
            "principal": principal.id if principal else None,
            "tier": principal.tier if principal else None,
            "backend": tool.backend if tool else None,
            "tool": call.tool,
            "method": call.method,
            "session_id": call.session_id,
            "args_digest": ctx.argument_digest,
            "args": stored_arguments(ctx),  # sanitized arguments: canonical JSON by construction
            "findings": [f.kind + "@" + f.path for f in ctx.findings],
            "sensitivity": ctx.sensitivity.value,
            "purpose": call.purpose,
            "policy_version": policy.version,
            "approval_id": ctx.approval_id,
            "idempotency_key": call.idempotency_key,
            "tool_digest": tool.digest if tool else None,
            "dry_run": call.dry_run,
        }
        if call.group is not None:  # only through a named group: records of other calls keep their bytes
            part["group"] = call.group
    return part


def call_fields(ctx: CallContext, policy: CompiledPolicy, decision: Decision, matched: list[RuleMatch]) -> dict[str, Any]:
    """The fields the decision record and the outcome (or single) record share: who, what, decided how."""
    return {
        **call_part(ctx, policy),
        "decision": decision_name(decision),
        "enforced": decision.enforced,
        "matched_rules": list(dict.fromkeys(m.rule_id for m in matched)),
        "block_class": decision.block_class.value if decision.block_class else None,
        "stage": decision.stage or None,
    }


def decision_entry(ctx: CallContext, policy: CompiledPolicy) -> dict[str, Any]:
    """The decision record of a call about to be forwarded (contract: keep every field and its meaning).

    `matched_by_error` names the matched rules whose condition errored (counted as holding).
    """
    assert ctx.decision is not None
    matched = decided_matches(ctx, ctx.decision)
    entry = call_fields(ctx, policy, ctx.decision, matched)  # a fresh dict: completed in place, not copied
    entry["kind"] = KIND_DECISION
    entry["matched_by_error"] = list(dict.fromkeys(m.rule_id for m in matched if m.by_error is not None))
    return entry


def ledger_entry(
    ctx: CallContext, policy: CompiledPolicy, outcome: Outcome, *, response_digest: str, latency_us: int
) -> dict[str, Any]:
    """The ledger record of one call's outcome (contract: keep every field and its meaning).

    `matched_by_error` names the matched rules whose condition errored, as the decision record does.

    Self-contained, as the single record of older ledgers was; an outcome record adds `kind` and
    the link to its decision record (see `Record`).
    """
    matched = decided_matches(ctx, outcome.decision)
    if ctx.disclosure is not None:
        matched.extend(ctx.disclosure.matched)
    entry = call_fields(ctx, policy, outcome.decision, matched)  # a fresh dict: completed in place, not copied
    entry["time"] = outcome.timestamp
    entry["approval_id"] = outcome.approval_id
    entry["matched_by_error"] = list(dict.fromkeys(m.rule_id for m in matched if m.by_error is not None))
    entry["disclosure"] = ctx.disclosure_note
    entry["response_digest"] = response_digest
    entry["status"] = outcome.status.value
    entry["error_code"] = outcome.error_code.value if outcome.error_code else None
    entry["latency_us"] = latency_us
    return entry


class RecordDecision:
    """Commit the decision record of a call that will reach its backend, before `Forward` runs.

    A refused call (blocked, dry run) is skipped: it reaches no backend and `Record` writes its one
    record. If the append fails, `ctx.decision_committed` stays false and `Forward` refuses to send:
    the call fails closed with `internal_error`.
    """

    name = "record_decision"

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        assert ctx.decision is not None
        if ctx.decision.blocks or ctx.call.dry_run:
            return
        try:
            ctx.decision_record = await self.ledger.append(decision_entry(ctx, policy))
        except Exception as exc:
            log.error("ledger.decision_append_failed", request_id=ctx.call.request_id, error=str(exc))
            return
        ctx.decision_committed = True


class Record:
    name = "record"

    def __init__(
        self, ledger: Ledger, history: HistoryStore, idempotency: IdempotencyStore, clock: Callable[[], float]
    ) -> None:
        self.ledger = ledger
        self.history = history
        self.idempotency = idempotency
        self.clock = clock

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        call = ctx.call
        assert ctx.render is not None
        if ctx.remember_key is not None:
            try:
                await self.idempotency.put(
                    ctx.remember_key,
                    {"argument_digest": ctx.argument_digest, "result": ctx.result, "disclosure": ctx.disclosure_note},
                )
            except StoreUnavailable as exc:  # the backend already answered: return it, say it is not replayable
                log.error("idempotency.store_failed", request_id=call.request_id, error=str(exc))
                ctx.warnings.append("this answer could not be stored for replay: a retry would run the call again")
        outcome = outcome_of(ctx)
        body = ctx.render(outcome)
        ctx.response_digest = safe_digest(strip_receipt(body))  # the form verifiers digest
        ctx.latency_us = int((self.clock() - ctx.clock) * 1_000_000)
        entry = ledger_entry(ctx, policy, outcome, response_digest=ctx.response_digest, latency_us=ctx.latency_us)
        if ctx.decision_committed:
            link = ctx.decision_record
            entry.update(kind=KIND_OUTCOME, decision_seq=getattr(link, "seq", None), decision_hash=getattr(link, "hash", None))
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
        history_down = ctx.decision is not None and ctx.decision.stage == HISTORY  # already waited on it once
        try:
            if not history_down:
                await self.history.record(
                    session_id=history_session(call, ctx.principal.id) if ctx.principal else call.session_id,
                    principal=ctx.principal.id if ctx.principal else "",
                    tool=call.tool,
                    decision=entry["decision"],
                    denied=outcome.decision.blocks,
                    now=ctx.clock,
                    time=outcome.timestamp,
                    detail=history_detail(ctx, ran=ctx.decision_committed),
                )
        except StoreUnavailable as exc:  # the ledger has the call; only the rules' recent history misses it
            log.error("history.store_failed", request_id=call.request_id, error=str(exc))
        ctx.outcome, ctx.body, ctx.entry = outcome, body, entry
