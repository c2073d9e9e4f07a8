"""Tier gate: who is calling, which tools exist for them, and how sensitive this call is.

The same compiled policy decides what `tools/list` shows and what `tools/call` admits
(invariant 3): a tool no tier of the principal grants answers exactly like an unknown tool.
No grant → no tools (fail closed). SENSITIVE and RESTRICTED calls need a `purpose`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from gateway.core.call import BlockClass, CallContext, Credentials, Decision, Principal, Sensitivity, ToolInfo, VerifiedJwt
from gateway.core.errors import ErrorCode
from gateway.policy.compile import ESCALATION_VARIABLES, CompiledPolicy
from gateway.policy.evaluate import call_variables, classify
from gateway.policy import cel


def authenticate(policy: CompiledPolicy, credentials: Credentials) -> Principal | None:
    """Resolve the caller: an API key (compared by SHA-256 digest, constant time), a verified
    JWT (see `principal_for_jwt`) or the local user."""
    if credentials.jwt is not None:
        return principal_for_jwt(policy, credentials.jwt)
    if credentials.api_key:
        presented = hashlib.sha256(credentials.api_key.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for p in policy.principals:
            for stored in p.key_digests:
                if hmac.compare_digest(presented, stored) and found is None:
                    found = Principal(p.id, p.tier, p.roles, p.claims)
        return found
    if credentials.local_user is not None:
        for p in policy.principals:
            if p.local_user in (credentials.local_user, "*"):
                return Principal(p.id, p.tier, p.roles, p.claims)
    return None


def principal_for_jwt(policy: CompiledPolicy, token: VerifiedJwt) -> Principal | None:
    """A policy principal whose id is the token's subject, else the tier the token names.

    The token's claims are visible to rules as `principal.claims`; a principal's own `claims`
    in the policy win over the token's (the policy is the administrator's word). A token
    naming no known principal and no known tier resolves to nobody (fail closed).
    """
    for p in policy.principals:
        if p.id == token.subject:
            return Principal(p.id, p.tier, p.roles, {**token.claims, **p.claims})
    if token.tier is not None and token.tier in policy.tiers:
        return Principal(token.subject, token.tier, (), dict(token.claims))
    return None


def unknown_tool(name: str) -> str:
    return f"Unknown tool: {name}"


def is_granted(policy: CompiledPolicy, principal: Principal, tool: str, annotations: dict[str, Any]) -> bool:
    tier = policy.tiers.get(principal.tier or "")
    if tier is None:
        return False
    return any(g.grants(tool, annotations) for g in tier.grants)


def visible_tools(policy: CompiledPolicy, principal: Principal, tools: list[ToolInfo]) -> list[ToolInfo]:
    """The tools `tools/list` shows this principal: exactly those `tools/call` would admit."""
    return [t for t in tools if is_granted(policy, principal, t.name, policy.annotations_for(t.name, t.annotations))]


class Authenticate:
    """Refuse callers the gateway could not resolve to a principal (see `authenticate`)."""

    name = "authenticate"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        if ctx.principal is None:
            return Decision.block(
                ErrorCode.UNAUTHENTICATED,
                "no valid credentials: present an API key the gateway knows",
                BlockClass.SAFETY_TIER_GATE,
                stage=self.name,
            )
        return None


class ToolVisibility:
    """Unknown and hidden tools get the same answer. Runs before the sanitizer so that a schema
    error cannot reveal that a hidden tool exists."""

    name = "tool_visibility"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        assert ctx.principal is not None
        if ctx.tool is not None:
            ctx.annotations = policy.annotations_for(ctx.tool.name, ctx.tool.annotations)
            if is_granted(policy, ctx.principal, ctx.tool.name, ctx.annotations):
                return None
        return Decision.block(
            ErrorCode.TOOL_NOT_FOUND, unknown_tool(ctx.call.tool), BlockClass.SAFETY_TIER_GATE, stage=self.name
        )


class TierGate:
    """Sensitivity (with argument-conditional escalation), the tier's ceiling, and `purpose`."""

    name = "tier_gate"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        assert ctx.principal is not None and ctx.tool is not None
        ctx.disclosure_mode = policy.normalise_disclosure_mode(ctx.call.disclosure_mode)
        probe = None
        if any(c.escalate for c in policy.sensitivity_for(ctx.tool.name)):
            variables = call_variables(
                call=ctx.call,
                principal=ctx.principal,
                tool=ctx.tool,
                annotations=ctx.annotations,
                sensitivity=Sensitivity.STANDARD,
                arguments=ctx.arguments,
                disclosure_mode=ctx.disclosure_mode,
                findings=(),
                session=[],
                karma={},
                now=ctx.now,
            )
            probe = cel.make_activation({k: variables[k] for k in ESCALATION_VARIABLES}, policy.engine)
        level, reasons = classify(policy, ctx.tool.name, probe)
        ctx.sensitivity = level
        tier = policy.tiers.get(ctx.principal.tier or "")
        why = f" ({'; '.join(reasons)})" if reasons else ""
        if tier is not None and level.rank > tier.max_sensitivity.rank:
            return Decision.block(
                ErrorCode.FORBIDDEN,
                f"{ctx.tool.name} is {level.value}{why}; tier {tier.name} may use at most {tier.max_sensitivity.value}",
                BlockClass.SAFETY_TIER_GATE,
                stage=self.name,
            )
        if level is not Sensitivity.STANDARD and not (ctx.call.purpose or "").strip():
            return Decision.block(
                ErrorCode.PURPOSE_REQUIRED,
                f"{ctx.tool.name} is {level.value}{why}: say why you need it in `purpose` and call again",
                BlockClass.SAFETY_TIER_GATE,
                stage=self.name,
            )
        return None
