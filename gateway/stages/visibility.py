"""Tool visibility: which tools exist for a principal.

The same compiled policy decides what `tools/list` shows and what `tools/call` admits
(invariant 3): a tool no tier of the principal grants answers exactly like an unknown tool.
No grant → no tools (fail closed).
"""

from __future__ import annotations

from typing import Any

from gateway.core.call import BlockClass, CallContext, Decision, Principal, ToolInfo
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy


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
