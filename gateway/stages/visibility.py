"""Tool visibility: which tools exist for a principal.

The same compiled policy decides what `tools/list` shows and what `tools/call` admits
(invariant 3): a tool no tier of the principal grants, or one a visibility rule hides
(`effect: hide`, e.g. a definition carrying instructions to the model), answers exactly like an
unknown tool. No grant → no tools (fail closed).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import structlog

from gateway.core.call import BlockClass, CallContext, Decision, Mode, Principal, RuleMatch, ToolInfo
from gateway.core.errors import ErrorCode
from gateway.policy import cel
from gateway.policy.compile import CompiledPolicy
from gateway.policy.evaluate import classify, evaluate_visibility, principal_variable, tool_variable

log = structlog.get_logger()


def unknown_tool(name: str) -> str:
    return f"Unknown tool: {name}"


def unserved(name: str) -> Decision:
    """The decision about a tool the gateway's catalog has but the endpoint does not serve to this
    caller (a named group's outside): the one `ToolVisibility` gives an unknown tool."""
    return Decision.block(ErrorCode.TOOL_NOT_FOUND, unknown_tool(name), BlockClass.SAFETY_TIER_GATE, stage=ToolVisibility.name)


def is_granted(policy: CompiledPolicy, principal: Principal, tool: str, annotations: dict[str, Any]) -> bool:
    tier = policy.tiers.get(principal.tier or "")
    if tier is None:
        return False
    return any(g.admits(annotations) for g in policy.grants_for(tier, tool))


def hidden_by(policy: CompiledPolicy, principal: Principal, tool: ToolInfo, annotations: dict[str, Any],
              now: datetime | None = None) -> tuple[RuleMatch, ...]:
    """The visibility rules that hide `tool` from `principal` (enforced ones; audit and warn mode
    only log "would hide"). Memoised per policy and definition, so a call pays a dict lookup."""
    rules = policy.visibility_rules_for(tool.name)
    if not rules:
        return ()
    refs = policy.visibility_references(tool.name)
    key: tuple[Any, ...] | None = None
    if "now" not in refs and tool.digest and not ("principal" in refs and principal.claims):
        who = (principal.id, principal.tier, principal.roles) if "principal" in refs else None
        key = (tool.name, tool.backend, tool.digest, tool.changed, tool.accepted, tool.findings, who)

    def decide() -> tuple[RuleMatch, ...]:
        level, _ = classify(policy, tool.name, None)
        variables = {"principal": principal_variable(principal, {}), "tool": tool_variable(tool, annotations, level),
                     "now": now or datetime.now(UTC)}
        matches = evaluate_visibility(policy, tool.name, cel.make_activation({k: variables[k] for k in refs}, policy.engine))
        for m in matches:
            if m.mode is not Mode.ENFORCE:
                log.warning("tool.would_hide", tool=tool.name, backend=tool.backend, rule=m.rule_id, mode=m.mode.value)
        return tuple(m for m in matches if m.mode is Mode.ENFORCE)

    return decide() if key is None else policy.memoised("hidden", key, decide)  # type: ignore[no-any-return]


def is_visible(policy: CompiledPolicy, principal: Principal, tool: ToolInfo) -> bool:
    """A tier grants `tool` and no visibility rule hides it: what `tools/list` shows and `tools/call` admits."""
    annotations = policy.annotations_for(tool.name, tool.annotations)
    return is_granted(policy, principal, tool.name, annotations) and not hidden_by(policy, principal, tool, annotations)


def visible_tools(policy: CompiledPolicy, principal: Principal, tools: list[ToolInfo]) -> list[ToolInfo]:
    """The tools `tools/list` shows this principal: exactly those `tools/call` would admit."""
    return [t for t in tools if is_visible(policy, principal, t)]


class ToolVisibility:
    """Unknown and hidden tools get the same answer. Runs before the sanitizer so that a schema
    error cannot reveal that a hidden tool exists."""

    name = "tool_visibility"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        assert ctx.principal is not None
        hidden: tuple[RuleMatch, ...] = ()
        if ctx.tool is not None:
            ctx.annotations = policy.annotations_for(ctx.tool.name, ctx.tool.annotations)
            if is_granted(policy, ctx.principal, ctx.tool.name, ctx.annotations):
                hidden = hidden_by(policy, ctx.principal, ctx.tool, ctx.annotations, ctx.now)
                if not hidden:
                    return None
        return Decision.block(
            ErrorCode.TOOL_NOT_FOUND, unknown_tool(ctx.call.tool), BlockClass.SAFETY_TIER_GATE, stage=self.name,
            matched=hidden,
        )
