"""The values that travel through the pipeline: ToolCall in, Decision in the middle, Outcome out.

Everything here is an immutable value except `CallContext`, the one mutable notebook that
stages write their findings on. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gateway.core.errors import ErrorCode

if TYPE_CHECKING:
    from gateway.core.backends import Backend, BackendResult


class Effect(StrEnum):
    """What a rule or stage decides. Ordered by precedence: deny overrides everything.

    `hide` is the effect of a visibility rule (evaluated per tool, at `tools/list` and before a
    call): a hidden tool is neither listed nor callable, and a call to it answers like an unknown tool.
    """

    ALLOW = "allow"
    WARN = "warn"
    REDACT = "redact"
    REQUIRE_APPROVAL = "require_approval"
    DENY = "deny"
    HIDE = "hide"

    @property
    def rank(self) -> int:
        return _EFFECT_RANK[self]


_EFFECT_RANK = {
    Effect.ALLOW: 0,
    Effect.WARN: 1,
    Effect.REDACT: 2,
    Effect.REQUIRE_APPROVAL: 3,
    Effect.DENY: 4,
    Effect.HIDE: 5,
}


class Mode(StrEnum):
    """How a rule's effect is applied: enforced, returned as a warning, or only recorded."""

    ENFORCE = "enforce"
    WARN = "warn"
    AUDIT = "audit"


class BlockClass(StrEnum):
    SAFETY_CONTENT = "safety_content"
    SAFETY_TIER_GATE = "safety_tier_gate"
    DISCLOSURE_POLICY = "disclosure_policy"
    RATE_LIMIT = "rate_limit"
    APPROVAL = "approval"


class Sensitivity(StrEnum):
    STANDARD = "STANDARD"
    SENSITIVE = "SENSITIVE"
    RESTRICTED = "RESTRICTED"

    @property
    def rank(self) -> int:
        return ("STANDARD", "SENSITIVE", "RESTRICTED").index(self.value)


class Disclosure(StrEnum):
    """Response-phase verdicts of disclosure rules, most restrictive last."""

    PERMIT = "PERMIT"
    REDACT = "REDACT"
    WITHHOLD = "WITHHOLD"


class Status(StrEnum):
    """Envelope status. A withheld answer is reported `ok`: it must look like a real one."""

    OK = "ok"
    BLOCKED = "blocked"
    PENDING_APPROVAL = "pending_approval"
    ERROR = "error"
    DRY_RUN = "dry_run"


@dataclass(frozen=True, slots=True)
class VerifiedJwt:
    """A bearer JWT the HTTP front already verified (signature, issuer, audience, expiry).

    Only `gateway.transports.http_auth` makes these. `subject` is the configured principal claim (`sub`
    by default); `tier` is what the configured tier claim names, after the settings' mapping.
    """

    subject: str
    claims: dict[str, Any] = field(default_factory=dict)
    tier: str | None = None

    def __repr__(self) -> str:
        return f"VerifiedJwt(subject={self.subject!r}, tier={self.tier!r})"


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the caller presented; the tier gate turns it into a Principal."""

    api_key: str | None = None
    bearer: str | None = None
    local_user: str | None = None
    jwt: VerifiedJwt | None = None
    api_key_sha256: bytes | None = None
    """The SHA-256 of an API key the gateway already checked (a /ui session keeps only this); never from the wire."""

    def __repr__(self) -> str:  # never print secrets
        return (
            f"Credentials(api_key={'***' if self.api_key or self.api_key_sha256 else None}, "
            f"local_user={self.local_user!r}, jwt={self.jwt!r})"
        )


@dataclass(frozen=True, slots=True)
class Principal:
    id: str
    tier: str | None = None
    roles: tuple[str, ...] = ()
    claims: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """A tool as the gateway knows it: from the backend's definition plus the policy's classification."""

    name: str
    backend: str = "default"
    description: str = ""
    annotations: dict[str, Any] = field(default_factory=dict)
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    digest: str = ""
    changed: bool = False
    findings: tuple[Finding, ...] = ()  # what the definition scan found (sanitizer/instructions.py)
    accepted: bool = False  # an operator accepted exactly this definition (`dharma tools accept`)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One request to run a tool, as the transport received it (arguments not yet sanitized)."""

    tool: str
    arguments: Any
    request_id: str
    credentials: Credentials = Credentials()
    purpose: str | None = None
    disclosure_mode: str | None = None
    depth: str | None = None
    method: str = "tools/call"
    protocol_version: str | None = None
    session_id: str | None = None
    idempotency_key: str | None = None
    dry_run: bool = False
    approval_id: str | None = None
    trace_context: Mapping[str, str] | None = None  # W3C traceparent/tracestate the client sent (MCP `_meta`)
    group: str | None = None  # the named tool group it came through (`/mcp/{group}`, `/v1/groups/{group}`)


@dataclass(frozen=True, slots=True)
class Finding:
    """Something the sanitizer detected, and where (a JSON path into the arguments, result or definition).

    `detail` never holds a secret. `excerpt` is a short, secret-free quote of the text that
    triggered the finding (instructions to the model, a URL); `via` names the decodings that
    revealed it (e.g. "base64>url"), empty when the plain text showed it.
    """

    kind: str
    path: str
    detail: str = ""
    excerpt: str = ""
    via: str = ""

    def as_cel(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "detail": self.detail, "excerpt": self.excerpt, "via": self.via}


@dataclass(frozen=True, slots=True)
class RuleMatch:
    """A rule whose condition held (or errored, which counts as holding for restrictive effects)."""

    rule_id: str
    effect: Effect
    mode: Mode
    message: str
    by_error: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The pipeline's verdict on a call.

    `effect` is what the policy decided; `enforced` says whether it is applied. A rule in
    audit mode yields effect=deny, enforced=False: recorded as "would deny", call goes through.
    """

    effect: Effect
    enforced: bool = True
    code: ErrorCode | None = None
    message: str = ""
    block_class: BlockClass | None = None
    matched: tuple[RuleMatch, ...] = ()
    warnings: tuple[str, ...] = ()
    retry_after: float | None = None
    stage: str = ""
    approved_by: str | None = None

    @property
    def blocks(self) -> bool:
        """An enforced deny, or an enforced require_approval no granted approval satisfies."""
        if not self.enforced:
            return False
        return self.effect is Effect.DENY or (self.effect is Effect.REQUIRE_APPROVAL and self.approved_by is None)

    @property
    def rule_ids(self) -> tuple[str, ...]:
        return tuple(m.rule_id for m in self.matched)

    @classmethod
    def block(
        cls,
        code: ErrorCode,
        message: str,
        block_class: BlockClass | None,
        *,
        stage: str,
        retry_after: float | None = None,
        matched: tuple[RuleMatch, ...] = (),
    ) -> Decision:
        return cls(
            effect=Effect.DENY,
            code=code,
            message=message,
            block_class=block_class,
            stage=stage,
            retry_after=retry_after,
            matched=matched,
        )


ALLOW = Decision(effect=Effect.ALLOW)


@dataclass(slots=True)
class CallContext:
    """The mutable notebook one call carries through every step of the pipeline.

    Stages read what earlier stages wrote (principal, tool, findings) and add their own notes.
    The decision stages end with `decision`; the steps from the backend on fill in the status,
    the result, the outcome the ledger recorded and the response as returned.
    """

    call: ToolCall
    now: datetime
    clock: float
    arguments: dict[str, Any] = field(default_factory=dict)
    principal: Principal | None = None
    tool: ToolInfo | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    sensitivity: Sensitivity = Sensitivity.STANDARD
    disclosure_mode: str = ""
    findings: list[Finding] = field(default_factory=list)
    # What the call does, for sequence rules: classes such as "credential_read", "env_read",
    # "network_send", "download", "write", "execute", "recon", and the paths each touches.
    classes: set[str] = field(default_factory=set)
    class_paths: dict[str, list[str]] = field(default_factory=dict)
    shell: Any = None  # the shell analysis of a command bound for a shell-like tool, if any
    urls: Any = None  # the URLs of the arguments (sanitizer/urls.py), when a rule reads `args_urls`
    egress: dict[str, list[str]] | None = None  # the caller's egress lists (the `egress` variable)
    warnings: list[str] = field(default_factory=list)
    session: list[dict[str, Any]] = field(default_factory=list)
    karma: dict[str, int] = field(default_factory=dict)
    variables: dict[str, Any] | None = None
    activation: Any = None
    rules_decision: Decision | None = None
    disclosure: Any = None
    approval_id: str | None = None
    argument_digest: str = ""
    stored_arguments: Any = None  # `arguments` with secrets redacted, as the ledger stores them
    record_part: dict[str, Any] | None = None  # the ledger fields a call's records share (stages.record.call_part)
    # what the transport asked for: where to forward, how to render, what the receipt covers
    backend: Backend | None = None
    render: Callable[[Outcome], dict[str, Any]] | None = None
    receipt_request: Any = None
    # from the decision on
    decision: Decision | None = None
    decision_record: Any = None  # where the decision record landed (the ledger's Appended)
    decision_committed: bool = False  # Forward sends nothing unless this is true
    status: Status = Status.OK
    error_code: ErrorCode | None = None
    message: str = ""
    answer: BackendResult | None = None
    result: Any = None
    disclosure_note: str | None = None
    remember_key: str | None = None
    outcome: Outcome | None = None
    body: dict[str, Any] | None = None
    response_digest: str = ""
    latency_us: int = 0
    appended: Any = None
    entry: dict[str, Any] | None = None
    response: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a governed call returns to its transport, and what the ledger recorded."""

    request_id: str
    tool: str
    status: Status
    decision: Decision
    result: Any = None
    error_code: ErrorCode | None = None
    message: str = ""
    warnings: tuple[str, ...] = ()
    receipt: str | None = None
    ledger_seq: int | None = None
    ledger_hash: str | None = None
    approval_id: str | None = None
    idempotency_key: str | None = None
    timestamp: str = ""
    latency_ms: float = 0.0

    @property
    def retryable(self) -> bool:
        return bool(self.error_code and self.error_code.retryable)

    def signed(self, receipt: str | None, ledger_seq: int, ledger_hash: str, latency_ms: float) -> Outcome:
        """This outcome with its receipt, ledger position and latency: `dataclasses.replace` with
        those four fields, built directly (it runs once a call; `replace` walks every field)."""
        return Outcome(
            self.request_id, self.tool, self.status, self.decision, self.result, self.error_code, self.message,
            self.warnings, receipt, ledger_seq, ledger_hash, self.approval_id, self.idempotency_key, self.timestamp,
            latency_ms,
        )
