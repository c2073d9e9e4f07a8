"""Dharma rules stage: evaluate the call-phase rules that can apply to this tool and combine them."""

from __future__ import annotations

import structlog

from gateway.core.call import CallContext, Decision, Effect
from gateway.policy.compile import CompiledPolicy
from gateway.policy.evaluate import activation_for, combine, evaluate_rules
from gateway.stages.sanitizer.walk import redact_paths, split_joined_path

log = structlog.get_logger()


class DharmaRules:
    name = "dharma_rules"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None:
        assert ctx.tool is not None
        if not policy.rules_for(ctx.tool.name):
            return None
        matches = evaluate_rules(policy, ctx.tool.name, activation_for(ctx, policy), arguments=ctx.arguments,
                                 classes=ctx.classes)
        for match in matches:
            if match.by_error is not None:  # fail closed, and say so: an operator should guard the condition
                log.warning("rule.matched_by_error", rule=match.rule_id, tool=ctx.tool.name, mode=match.mode.value,
                            request_id=ctx.call.request_id, error=match.by_error)
        decision = combine(matches, policy)
        ctx.rules_decision = decision
        ctx.warnings.extend(decision.warnings)
        if decision.blocks and decision.effect is Effect.DENY:
            return decision
        if decision.enforced and decision.effect is Effect.REDACT:
            ctx.arguments = redact_paths(ctx.arguments, redaction_targets(ctx, policy, decision))
        return None


def redaction_targets(ctx: CallContext, policy: CompiledPolicy, decision: Decision) -> list[str]:
    """Argument paths the enforced redact rules name; a rule naming none redacts every finding."""
    paths: list[str] = []
    for match in decision.matched:
        rule = policy.rule(match.rule_id)
        if match.effect is Effect.REDACT and match.mode.value == "enforce" and rule is not None:
            paths.extend(rule.redact or [p for f in ctx.findings for p in split_joined_path(f.path)])
    return list(dict.fromkeys(paths))
