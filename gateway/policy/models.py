"""Pydantic models of the policy files (`apiVersion: dharma/v1`): Policy, RuleSet, DisclosureRuleSet, RuleTest.

These validate the YAML as written; `compile.py` turns them into the immutable CompiledPolicy
the pipeline runs. Unknown keys are errors everywhere (`extra="forbid"`). No I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from gateway.core.call import BlockClass, Disclosure, Effect, Mode, Sensitivity, Status
from gateway.core.errors import ErrorCode

API_VERSION = "dharma/v1"
RULE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metadata(Strict):
    name: str
    description: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class Document(Strict):
    apiVersion: Literal["dharma/v1"]
    kind: str
    metadata: Metadata


# ---- rules ---------------------------------------------------------------------------


class Rule(Strict):
    """A dharma rule (call phase)."""

    id: str
    description: str = ""
    owner: str = ""
    tools: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    when: str | None = None
    effect: Effect
    message: str = ""
    message_expr: str | None = None
    mode: Mode = Mode.ENFORCE
    block_class: BlockClass | None = None
    redact: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not RULE_ID.match(value):
            raise ValueError("rule id must be lower-case letters, digits, '.', '_' or '-' (at most 128)")
        return value


class RuleSet(Document):
    kind: Literal["RuleSet"]
    rules: list[Rule] = Field(default_factory=list)


class DisclosureRule(Strict):
    """A disclosure rule (response phase): PERMIT / REDACT / WITHHOLD per receiver, topic and context."""

    id: str
    description: str = ""
    owner: str = ""
    tools: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    topic: str = ""
    when: str | None = None
    verdict: Disclosure
    redact: list[str] = Field(default_factory=list)
    redact_secrets: bool = False
    message: str = ""
    mode: Mode = Mode.ENFORCE
    tags: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        return Rule._id_shape(value)

    @model_validator(mode="after")
    def _redact_needs_target(self) -> DisclosureRule:
        if self.verdict is Disclosure.REDACT and not (self.redact or self.redact_secrets):
            raise ValueError("a REDACT rule needs `redact` paths or `redact_secrets: true`")
        return self


class DisclosureRuleSet(Document):
    kind: Literal["DisclosureRuleSet"]
    no_information_response: Any = Field(
        default_factory=lambda: {"content": [{"type": "text", "text": "No matching records found."}]}
    )
    rules: list[DisclosureRule] = Field(default_factory=list)


# ---- policy profile ------------------------------------------------------------------


def _no_nul(value: Any) -> Any:
    """A file path (or a list of them) with no NUL character: no file system can name such a file."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and "\x00" in item:
            raise ValueError("a file path may not hold a NUL character")
    return value



class PrincipalSpec(Strict):
    """A principal and how it authenticates. API keys are stored only as SHA-256 digests."""

    id: str
    tier: str
    roles: list[str] = Field(default_factory=list)
    api_key_sha256: Annotated[
        list[str],
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    ] = Field(default_factory=list)
    local_user: str | None = None
    claims: dict[str, Any] = Field(default_factory=dict)

    @field_validator("api_key_sha256", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, value: list[str]) -> list[str]:
        for item in value:
            if not re.fullmatch(r"[0-9a-f]{64}", item):
                raise ValueError("api_key_sha256 must be 64 lower-case hex digits (sha256 of the key)")
        return value


class Grant(Strict):
    """Tools a tier grants: name globs and/or annotation values that must all match."""

    tools: list[str] = Field(default_factory=list)
    annotations: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _not_empty(self) -> Grant:
        if not self.tools and not self.annotations:
            raise ValueError("a grant needs `tools` globs, `annotations`, or both")
        return self


class Tier(Strict):
    name: str
    inherits: str | None = None
    grants: list[Grant] = Field(default_factory=list)
    max_sensitivity: Sensitivity = Sensitivity.RESTRICTED


class Escalation(Strict):
    when: str
    to: Sensitivity
    message: str = ""


class SensitivityClass(Strict):
    tools: list[str] = Field(min_length=1)
    level: Sensitivity
    escalate: list[Escalation] = Field(default_factory=list)


class RateLimit(Strict):
    """A GCRA limit: `rate` calls per `per_seconds`, bursts up to `burst`, keyed by the named fields."""

    id: str
    key: list[Literal["principal", "tool", "tier", "backend"]] = Field(min_length=1)
    tools: list[str] = Field(default_factory=lambda: ["*"])
    rate: float = Field(gt=0)
    per_seconds: float = Field(default=1.0, gt=0)
    burst: int = Field(default=1, ge=1)
    store_down: Literal["deny", "allow"] | None = Field(
        default=None,
        description="when the shared limit store (Redis) cannot be reached: deny the call (fail closed) or "
        "let it through unlimited (fail open); unset: the profile's rate_limit_store_down",
    )


class SanitizerSettings(Strict):
    max_bytes: int = Field(default=1_048_576, gt=0)
    max_depth: int = Field(default=32, gt=0)
    max_string: int = Field(default=262_144, gt=0)
    max_items: int = Field(default=10_000, gt=0)


class BreakerSettings(Strict):
    failure_threshold: int = Field(default=5, ge=1)
    reset_seconds: float = Field(default=30.0, gt=0)


class ApprovalSettings(Strict):
    hold_seconds: float = Field(default=0.0, ge=0)
    expires_seconds: float = Field(default=900.0, gt=0)
    allow_self_approval: bool = Field(
        default=False, description="may a principal approve a call it made itself (over HTTP, the CLI or the Python API)"
    )
    allow_elicitation: bool | list[str] = Field(
        default=False,
        description=(
            "may the caller release its own held call by answering the gateway's MCP elicitation: false (an approver "
            "or admin decides, on /ui, the CLI or the HTTP API), true (every tier) or a list of tiers (the caller's "
            "own tier must be listed). The MCP client may be the agent itself, and an agent can answer forms"
        ),
    )


class EgressList(Strict):
    """Destinations by domain suffix, address or CIDR block, each with an optional port (see
    `gateway.policy.cel.helpers.egress_pattern`): `allow` are the operator's own services (past the
    internal-destination rules; in `strict`, the only destinations that are not held), `deny` are
    never reached."""

    allow: list[str] = Field(default_factory=list, description="example.com, *.example.com, 10.0.0.0/8, localhost:8080 ...")
    deny: list[str] = Field(default_factory=list)

    @field_validator("allow", "deny")
    @classmethod
    def _entries(cls, value: list[str]) -> list[str]:
        from gateway.policy.cel.helpers import egress_pattern

        for entry in value:
            egress_pattern(entry)
        return value


class EgressSettings(EgressList):
    """A profile's `egress:` section: lists for every tier, and per tier (a tier also gets the lists
    of the tiers it inherits). Rules read the caller's lists as `egress.allow` and `egress.deny`."""

    tiers: dict[str, EgressList] = Field(default_factory=dict)


class Policy(Document):
    """A profile: who may call what, how sensitive it is, limits, and which rule sets apply."""

    kind: Literal["Policy"]
    extends: str | None = Field(
        default=None,
        description="a profile (path relative to this file) this one builds on: what this one writes overrides or adds "
        "to it by the merge rules of docs/policy.md, \"Composing profiles\"",
    )
    principals: list[PrincipalSpec] = Field(default_factory=list)
    principals_remove: list[str] = Field(
        default_factory=list, description="ids of inherited principals this profile does not have; each must be inherited")
    tiers: list[Tier] = Field(default_factory=list)
    sensitivity: list[SensitivityClass] = Field(default_factory=list)
    tool_annotations: dict[str, dict[str, Any]] = Field(default_factory=dict)
    rate_limits: list[RateLimit] = Field(default_factory=list)
    tool_costs: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, description="glob -> cost of one call (default 1)")
    rate_limit_store_down: Literal["deny", "allow"] = Field(
        default="deny", description="every limit's default when the limit store cannot be reached (a limit's `store_down` overrides it)"
    )
    sanitizer: SanitizerSettings = SanitizerSettings()
    circuit_breaker: BreakerSettings = BreakerSettings()
    approval: ApprovalSettings = ApprovalSettings()
    backend_timeout_seconds: float = Field(default=30.0, gt=0)
    disclosure_modes: list[str] = Field(
        default_factory=lambda: ["direct", "summary", "none"],
        min_length=1,
        description="known disclosure modes, least restrictive first; unknown ones count as the last",
    )
    egress: EgressSettings = Field(
        default_factory=EgressSettings,
        description="where calls may go (docs/detection.md, Egress); a profile that `extends` another adds its lists to the base's",
    )
    rule_sets: list[str] = Field(default_factory=list, description="rule files (relative to this file), after the inherited ones")
    rule_sets_remove: list[str] = Field(
        default_factory=list,
        description="inherited rule files (relative to this file) this profile does not use; each must be inherited",
    )

    @field_validator("extends", "rule_sets", "rule_sets_remove")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        return _no_nul(value)


# ---- rule tests ----------------------------------------------------------------------


class CaseSessionCall(Strict):
    """An earlier call of the session a rule test case runs in (for sequence rules).

    `paths` maps a class to the paths/URLs it touched, or is one list for every class named;
    `ago` is how long before the case's call it ran (a duration such as "5m", or seconds);
    `ran: false` is a call that was refused (the session helpers skip it).
    """

    tool: str
    classes: list[str] = Field(default_factory=list)
    paths: dict[str, list[str]] | list[str] = Field(default_factory=dict)
    ago: str | float = 0
    decision: str = "allow"
    ran: bool = True
    findings: list[str] = Field(default_factory=list)

    @field_validator("ago")
    @classmethod
    def _ago(cls, value: str | float) -> str | float:
        if isinstance(value, str):
            from gateway.policy.cel.helpers import duration_seconds

            duration_seconds(value)
        elif value < 0:
            raise ValueError("ago must not be negative")
        return value


class CaseCall(Strict):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    principal: str | dict[str, Any] = Field(
        default_factory=lambda: {"id": "tester", "tier": "test", "roles": []},
        description="bare facts (id, tier, roles, claims) for the rules alone, or the id of a principal of the "
        "test's `policy`: the case is then decided by the whole pipeline (tier gate, sensitivity and purpose, "
        "escalation, rate limits, rules, approval)",
    )
    annotations: dict[str, Any] = Field(default_factory=dict)
    backend: str = "default"
    purpose: str | None = None
    disclosure_mode: str | None = None
    depth: str | None = None
    session: list[CaseSessionCall] = Field(default_factory=list)
    tool_changed: bool = False
    tool_definition: dict[str, Any] | None = Field(
        default=None, description="the MCP tool definition (description, inputSchema, ...) scanned into tool.findings")
    other_tools: list[str] = Field(default_factory=list, description="the other tools the same server lists")
    tool_accepted: bool = False
    egress: EgressList | None = Field(
        default=None, description="the caller's egress lists for a case without a `policy` (with one: the profile's)")
    prior_calls: int = Field(
        default=0, ge=0, le=10_000,
        description="whole-pipeline cases: this many identical calls went through just before (rate limits)",
    )


class CaseExpect(Strict):
    decision: Effect | None = None
    enforced: bool | None = None
    rules: list[str] | None = None
    block_class: BlockClass | None = None
    disclosure: Disclosure | None = None
    findings: list[str] | None = None
    hidden: bool | None = Field(default=None, description="a visibility rule (effect: hide) hides the tool")
    tool_findings: list[str] | None = Field(default=None, description="the kinds in tool.findings")
    error_code: ErrorCode | None = Field(default=None, description="the error code the caller would get (status ok means none)")
    status: Status | None = Field(default=None, description="the envelope status: ok (it would be forwarded), blocked, pending_approval")
    message: str | None = Field(default=None, description="a substring of the message the caller would get")


class RuleCase(Strict):
    name: str
    call: CaseCall
    response: Any = None
    expect: CaseExpect


class RuleTest(Document):
    kind: Literal["RuleTest"]
    rules: list[str] = Field(default_factory=list, description="rule files under test (RuleSet or DisclosureRuleSet), relative to this file")
    policy: str | None = Field(
        default=None,
        description="a profile (kind: Policy, relative to this file) to test whole: its tiers, limits and rule sets; "
        "cases may then name its principals",
    )
    principals: list[PrincipalSpec] = Field(
        default_factory=list,
        description="callers added to the `policy` for this test only (a shipped profile declares none), "
        "e.g. {id: a-reader, tier: reader}; they need no credentials",
    )
    cases: list[RuleCase] = Field(min_length=1)

    @field_validator("rules", "policy")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        return _no_nul(value)

    @model_validator(mode="after")
    def _something_under_test(self) -> RuleTest:
        if not self.rules and self.policy is None:
            raise ValueError("a RuleTest names the rule files under test (`rules:`), a profile (`policy:`), or both")
        if self.principals and self.policy is None:
            raise ValueError("`principals:` are added to the test's `policy:` profile, and there is none")
        return self


KINDS: dict[str, type[Document]] = {
    "Policy": Policy,
    "RuleSet": RuleSet,
    "DisclosureRuleSet": DisclosureRuleSet,
    "RuleTest": RuleTest,
}
