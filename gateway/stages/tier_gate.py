"""Tier gate: how sensitive this call is (with argument-conditional escalation), the tier's
ceiling, and `purpose` (SENSITIVE and RESTRICTED calls need one).

Who is calling is `authenticate`, which tools exist for them is `visibility`; their public
functions stay importable from here for the transports and the CLI.
"""

from __future__ import annotations

from gateway.core.call import BlockClass, CallContext, Decision, Sensitivity
from gateway.core.errors import ErrorCode
from gateway.policy import cel
from gateway.policy.compile import ESCALATION_VARIABLES, CompiledPolicy
from gateway.policy.evaluate import call_variables, classify
from gateway.stages.authenticate import authenticate, principal_for_jwt
from gateway.stages.visibility import is_granted, is_visible, unknown_tool, unserved, visible_tools

__all__ = ["TierGate", "authenticate", "is_granted", "is_visible", "principal_for_jwt", "unknown_tool", "unserved", "visible_tools"]


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
                names=ESCALATION_VARIABLES,
            )
            probe = cel.make_activation(variables, policy.engine)
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
