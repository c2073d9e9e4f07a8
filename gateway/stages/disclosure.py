"""Disclosure rules step (response phase): PERMIT, REDACT or WITHHOLD what the backend answered.

WITHHOLD returns the rule set's configured no-information response exactly as configured, so a
withheld answer cannot be told apart from a genuine "nothing found". `response.findings` holds
the secrets in the answer and the instruction scan's findings (instructions to the model, URLs,
invisible text: gateway/stages/sanitizer/instructions.py).
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.policy import cel
from gateway.core.call import CallContext, Disclosure
from gateway.policy.compile import CompiledPolicy
from gateway.policy.evaluate import (
    RESPONSE_FIELDS,
    DisclosureVerdict,
    evaluate_disclosure,
    response_variables,
    variables_for,
)
from gateway.stages.sanitizer.walk import detect_secrets, redact_paths, redact_secrets


def reads_instruction_findings(policy: CompiledPolicy, tool: str) -> bool:
    """Whether a disclosure rule for `tool` may read a finding of the instruction scan.

    False only when every rule's condition provably depends on `response.findings` through
    `exists` tests of finding kinds the scan never produces (`cel.kinds_read`): leaving the scan
    out then cannot change any verdict, and it is a third of the step's cost. Worked out once per
    policy and tool.
    """

    def build() -> tuple[bool]:
        from gateway.stages.sanitizer.instructions import KINDS

        for rule in policy.disclosure_rules_for(tool):
            if rule.when is None:
                continue
            kinds = cel.kinds_read(rule.when.source, "response", "findings")
            if kinds is None or not kinds.isdisjoint(KINDS):
                return (True,)
        return (False,)

    return policy.memoised("disclosure-reads-instruction-findings", tool, build)[0]  # type: ignore[no-any-return]


def response_fields(policy: CompiledPolicy, tool: str) -> frozenset[str] | None:
    """The fields of `response` the disclosure rules for `tool` can read, or None for all of them.

    A set only when every rule's condition reads `response` solely through named fields it has
    (`cel.fields_read`): the fields left out cannot change a verdict, and copying the answer
    (`response.result`, `response.text`) into the activation was most of its conversion cost.
    Worked out once per policy and tool.
    """

    def build() -> tuple[frozenset[str] | None]:
        fields: set[str] = set()
        for rule in policy.disclosure_rules_for(tool):
            if rule.when is None or "response" not in rule.when.references:
                continue
            read = cel.fields_read(rule.when.source, "response")
            if read is None or not read <= set(RESPONSE_FIELDS):
                return (None,)
            fields |= read
        return (frozenset(fields),)

    return policy.memoised("disclosure-response-fields", tool, build)[0]  # type: ignore[no-any-return]


def disclose(ctx: CallContext, policy: CompiledPolicy, result: Any, is_error: bool) -> tuple[Any, DisclosureVerdict | None]:
    """Apply the disclosure rules for this tool to `result`; returns what may be returned."""
    assert ctx.tool is not None
    if not policy.disclosure_rules_for(ctx.tool.name):
        return result, None
    findings = detect_secrets(result)
    if reads_instruction_findings(policy, ctx.tool.name):
        from gateway.stages.sanitizer.instructions import scan_result  # its ~100 patterns compile on first use, not at start-up

        findings += scan_result(result)
    references = policy.disclosure_references(ctx.tool.name)
    variables = response_variables(
        variables_for(ctx, references - {"response"}), result, is_error, findings, response_fields(policy, ctx.tool.name)
    )
    needed = {k: variables[k] for k in references}
    if ctx.activation is not None:  # the call phase converted most of them already
        activation = ctx.activation.extend(needed)
    else:
        activation = cel.make_activation(needed, policy.engine)
    verdict = evaluate_disclosure(policy, ctx.tool.name, activation)
    if not verdict.enforced:
        return result, verdict
    if verdict.verdict is Disclosure.WITHHOLD:
        return copy.deepcopy(verdict.no_information_response), verdict
    if verdict.verdict is Disclosure.REDACT:
        if verdict.redact:
            result = redact_paths(result, verdict.redact)
        if verdict.redact_secrets:
            result, _ = redact_secrets(result)
    return result, verdict


class DisclosureRules:
    """Applies `disclose` to a fresh backend answer (a replayed one was disclosed when first stored)."""

    name = "disclosure"

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None:
        if ctx.answer is None:
            return
        ctx.result, verdict = disclose(ctx, policy, ctx.answer.result, ctx.answer.is_error)
        ctx.disclosure_note = verdict.verdict.value if verdict is not None and verdict.enforced else None
        ctx.disclosure = verdict
