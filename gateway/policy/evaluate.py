"""Evaluate compiled rules against one call: pure functions, no I/O.

The activation (the variables CEL sees) is built once per call and shared by every rule.
Error semantics (design invariant 2): a CEL error in a deny, require_approval or redact rule
counts as a match; an error in an allow or warn rule does not; a non-boolean result is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from gateway.policy import cel
from gateway.policy.cel import path_normalize
from gateway.core.call import (
    BlockClass,
    CallContext,
    Decision,
    Disclosure,
    Effect,
    Finding,
    Mode,
    Principal,
    RuleMatch,
    Sensitivity,
    ToolCall,
    ToolInfo,
)
from gateway.core.errors import ErrorCode
from gateway.policy.compile import (
    CALL_VARIABLES,
    RESTRICTIVE,
    CompiledDisclosureRule,
    CompiledPolicy,
    CompiledRule,
)

MAX_MESSAGE = 1024
DISCLOSURE_RANK = {Disclosure.PERMIT: 0, Disclosure.REDACT: 1, Disclosure.WITHHOLD: 2}


def call_variables(
    *,
    call: ToolCall,
    principal: Principal,
    tool: ToolInfo,
    annotations: dict[str, Any],
    sensitivity: Sensitivity,
    arguments: dict[str, Any],
    disclosure_mode: str,
    findings: list[Finding] | tuple[Finding, ...],
    session: list[dict[str, Any]],
    karma: dict[str, int],
    now: datetime,
    classes: set[str] | frozenset[str] = frozenset(),
    class_paths: dict[str, list[str]] | None = None,
    shell: dict[str, Any] | None = None,
    urls: list[dict[str, Any]] | None = None,
    egress: dict[str, list[str]] | None = None,
    names: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The call-phase variables, as plain JSON-like values (only those in `names`, if given).

    `call` is what this call does (its classes and, for each, the paths it touches: every class
    has a key); `session.now` is this call's time in epoch seconds, which the session helpers
    measure `within` from (gateway.policy.cel.helpers); `shell` is the shell analysis's
    `as_cel()`, for `args_shell` (an empty map when the call had none); `urls` the URL analysis's, for
    `args_urls` (an empty list); `egress` the caller's egress lists. A rule set reads a few of
    them: building only those is most of what building them costs.
    """
    want = CALL_VARIABLES if names is None else names
    out: dict[str, Any] = {}
    if "principal" in want:
        out["principal"] = principal_variable(principal, karma)
    if "tool" in want:
        out["tool"] = tool_variable(tool, annotations, sensitivity)
    if "args" in want:
        out["args"] = arguments
    if "args_shell" in want:
        out["args_shell"] = shell if shell is not None else {}
    if "args_urls" in want:
        out["args_urls"] = urls if urls is not None else []
    if "egress" in want:
        out["egress"] = egress if egress is not None else {"allow": [], "deny": []}
    if "request" in want:
        out["request"] = {
            "purpose": call.purpose,
            "disclosure_mode": disclosure_mode,
            "depth": call.depth,
            "request_id": call.request_id,
            "method": call.method,
            "protocol_version": call.protocol_version,
        }
    if "session" in want:
        out["session"] = {
            "id": call.session_id or "",
            "calls": session,
            "tools": [entry["tool"] for entry in session],
            "now": now.timestamp(),
        }
    if "call" in want:
        out["call"] = call_classes(classes, class_paths or {})
    if "findings" in want:
        out["findings"] = [f.as_cel() for f in findings]
    if "now" in want:
        out["now"] = now
    return out


def principal_variable(principal: Principal, karma: dict[str, int]) -> dict[str, Any]:
    """`principal` as rules see it."""
    return {"id": principal.id, "tier": principal.tier or "", "roles": list(principal.roles), "claims": principal.claims,
            "karma": karma}


def tool_variable(tool: ToolInfo, annotations: dict[str, Any], sensitivity: Sensitivity) -> dict[str, Any]:
    """`tool` as rules see it: `findings` are the definition scan's, `accepted` an operator's override."""
    return {
        "name": tool.name,
        "backend": tool.backend,
        "annotations": annotations,
        "digest": tool.digest,
        "changed": tool.changed,
        "sensitivity": sensitivity.value,
        "findings": [f.as_cel() for f in tool.findings],
        "accepted": tool.accepted,
    }


def call_classes(classes: set[str] | frozenset[str], class_paths: dict[str, list[str]]) -> dict[str, Any]:
    """`call`: the sorted classes, and for each the normalised paths it touches (possibly none)."""
    ordered = sorted(classes)
    return {"classes": ordered, "paths": {c: [path_normalize(p) if "://" not in p else p for p in class_paths.get(c, ())]
                                          for c in ordered}}


#: The fields of the `response` variable, in the order its map holds them.
RESPONSE_FIELDS: Final = ("result", "text", "is_error", "findings")


def response_variables(
    base: dict[str, Any],
    result: Any,
    is_error: bool,
    findings: tuple[Finding, ...],
    fields: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Add `response` to the call-phase variables for disclosure rules.

    With `fields` (a subset of `RESPONSE_FIELDS`: what the rules select by name, see
    `cel.fields_read`), only those are built: a rule that reads no `response.result` nor
    `response.text` does not pay for copying the whole answer into the activation.
    """
    if fields is None or "result" in fields:
        response: dict[str, Any] = {"result": result}
    else:
        response = {}
    if fields is None or "text" in fields:
        response["text"] = response_text(result)
    if fields is None or "is_error" in fields:
        response["is_error"] = is_error
    if fields is None or "findings" in fields:
        response["findings"] = [f.as_cel() for f in findings]
    return {**base, "response": response}


def response_text(result: Any) -> str:
    """All text in a result: MCP `content[].text` items and the strings of `structuredContent` that
    no text item already holds (the SDK mirrors a plain answer in both: scanning it twice cost ~20 µs
    a call), or the JSON strings of a plain result."""
    parts: list[str] = []
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        for item in result["content"]:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                parts.append(item["text"])
        if "structuredContent" in result:
            structured: list[str] = []
            _strings(result["structuredContent"], structured)
            seen = set(parts)
            parts.extend(text for text in structured if text not in seen)
    else:
        _strings(result, parts)
    return "\n".join(parts)


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list):
        for item in value:
            _strings(item, out)


@dataclass(frozen=True, slots=True)
class RuleTrace:
    """How one candidate rule fared, for `dharma eval --explain` and the test runner."""

    rule_id: str
    effect: str
    mode: str
    value: Any
    error: str | None
    matched: bool


def _condition(expr: cel.Expression | None, activation: cel.Activation) -> tuple[Any, str | None]:
    if expr is None:
        return True, None
    try:
        value = expr.evaluate(activation)
    except cel.CelError as exc:
        return None, exc.message
    if not isinstance(value, bool):
        return value, f"condition returned {type(value).__name__}, not bool"
    return value, None


def _message(rule: CompiledRule, activation: cel.Activation) -> str:
    if rule.message_expr is not None:
        try:
            value = rule.message_expr.evaluate(activation)
            if isinstance(value, str) and value:
                return value[:MAX_MESSAGE]
        except cel.CelError:
            pass
    return rule.message or f"blocked by rule {rule.id}"


def _empty(path: tuple[str, ...], activation: cel.Activation) -> bool:
    """Whether the variable at `path` (a rule's `empty_guard`) is an empty list in `activation`.

    Anything else (absent, not a list, not empty) is False: the rule is then evaluated as usual.
    """
    value: Any = activation.plain
    for name in path:
        if type(value) is not dict or name not in value:
            return False
        value = value[name]
    return type(value) is list and not value


def evaluate_rules(
    policy: CompiledPolicy,
    tool: str,
    activation: cel.Activation,
    trace: list[RuleTrace] | None = None,
    arguments: dict[str, Any] | None = None,
    classes: set[str] | frozenset[str] | None = None,
) -> list[RuleMatch]:
    """Run the rules that can apply to `tool`; return those that matched (errors included per effect).

    With `arguments`, a rule guarded as `has(args.x) && …` is skipped when `x` is absent (its
    condition is false then; see compile.leading_guard); with `classes`, one guarded as
    `"X" in call.classes && …` is skipped when the call has no class X (compile.class_guard).
    """
    matches: list[RuleMatch] = []
    for rule in policy.rules_for(tool):
        if (arguments is not None and rule.guard is not None and rule.guard not in arguments) or (
            classes is not None and rule.class_guard is not None and rule.class_guard not in classes
        ) or (rule.empty_guard is not None and _empty(rule.empty_guard, activation)):
            if trace is not None:
                trace.append(RuleTrace(rule.id, rule.effect.value, rule.mode.value, False, None, False))
            continue
        value, error = _condition(rule.when, activation)
        matched = value is True and error is None
        if error is not None and rule.effect in RESTRICTIVE:
            matched = True
        if trace is not None:
            trace.append(RuleTrace(rule.id, rule.effect.value, rule.mode.value, value, error, matched))
        if matched:
            if error:
                message = failed_condition_message(rule.id, error, rule.when.source if rule.when else "")
            else:
                message = _message(rule, activation)
            matches.append(RuleMatch(rule.id, rule.effect, rule.mode, message, error))
    return matches


_MISSING = re.compile(r"(?:KeyError: |no such member in mapping: |no such key; ?)'?([^'\s]+)'?")


def condition_failure(error: str, source: str) -> str:
    """Why a condition could not be evaluated, in the policy's words: `missing field args.path`
    for a field the call lacks (whatever the engine called it), else the engine's message."""
    found = _MISSING.search(error)
    if found is None:
        return error
    key = found.group(1)
    paths = re.findall(r"\b(?:args|principal|tool|request|session|findings)(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\s*[\"'][^\"']*[\"']\s*\])+", source)
    for path in paths:
        parts = re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*[\"']([^\"']*)[\"']\s*\]", path[path.index("."):] if "." in path else path)
        names = [a or b for a, b in parts]
        if key in names:
            root = path.split(".", 1)[0].split("[", 1)[0]
            return "missing field " + ".".join([root, *names[: names.index(key) + 1]])
    return f"missing field {key}"


def failed_condition_message(rule_id: str, error: str, source: str) -> str:
    """What the caller is told when a restrictive rule matched because its condition failed (fail closed)."""
    return f"rule {rule_id} could not evaluate its condition ({condition_failure(error, source)}); refused to be safe"


def combine(matches: list[RuleMatch], policy: CompiledPolicy) -> Decision:
    """Deny overrides: deny > require_approval > redact > warn > allow.

    The decision's effect is the strongest effect of any matched rule, whatever its mode; it
    is enforced only when an enforce-mode rule carries that effect. Audit- and warn-mode matches
    thus record "would deny" and let the call through.
    """
    if not matches:
        return Decision(effect=Effect.ALLOW, stage="dharma_rules")
    strongest = max(m.effect.rank for m in matches)
    enforced_rank = max((m.effect.rank for m in matches if m.mode is Mode.ENFORCE), default=-1)
    effect = next(m.effect for m in matches if m.effect.rank == strongest)
    enforced = enforced_rank == strongest
    deciding = [m for m in matches if m.effect.rank == strongest and (m.mode is Mode.ENFORCE or not enforced)]
    warnings = tuple(
        m.message for m in matches if m.effect is Effect.WARN or (m.mode is Mode.WARN and m.effect is not Effect.ALLOW)
    )
    code = None
    block_class = None
    if effect is Effect.DENY:
        code = ErrorCode.POLICY_BLOCKED
        rule = policy.rule(deciding[0].rule_id)
        block_class = getattr(rule, "block_class", None) or BlockClass.SAFETY_CONTENT
    elif effect is Effect.REQUIRE_APPROVAL:
        code = ErrorCode.APPROVAL_REQUIRED
        block_class = BlockClass.APPROVAL
    return Decision(
        effect=effect,
        enforced=enforced,
        code=code,
        message="; ".join(dict.fromkeys(m.message for m in deciding)),
        block_class=block_class,
        matched=tuple(matches),
        warnings=warnings,
        stage="dharma_rules",
    )


def evaluate_visibility(
    policy: CompiledPolicy, tool: str, activation: cel.Activation, trace: list[RuleTrace] | None = None
) -> list[RuleMatch]:
    """The `effect: hide` rules for `tool` that hold; one whose condition errors holds (fail closed)."""
    matches: list[RuleMatch] = []
    for rule in policy.visibility_rules_for(tool):
        value, error = _condition(rule.when, activation)
        matched = (value is True and error is None) or error is not None
        if trace is not None:
            trace.append(RuleTrace(rule.id, rule.effect.value, rule.mode.value, value, error, matched))
        if matched:
            message = rule.message or f"hidden by rule {rule.id}"
            if error is None and rule.message_expr is not None:
                message = _message(rule, activation)
            matches.append(RuleMatch(rule.id, rule.effect, rule.mode, message, error))
    return matches


@dataclass(frozen=True, slots=True)
class DisclosureVerdict:
    verdict: Disclosure
    enforced: bool
    matched: tuple[RuleMatch, ...]
    redact: tuple[str, ...]
    redact_secrets: bool
    no_information_response: Any


#: What `evaluate_disclosure` answers when no rule matched (most answers): PERMIT, enforced.
_NOTHING_MATCHED: Final = DisclosureVerdict(
    verdict=Disclosure.PERMIT, enforced=True, matched=(), redact=(), redact_secrets=False, no_information_response=None
)


def evaluate_disclosure(
    policy: CompiledPolicy, tool: str, activation: cel.Activation, trace: list[RuleTrace] | None = None
) -> DisclosureVerdict:
    """WITHHOLD > REDACT > PERMIT. An erroring condition counts as a match unless the verdict is PERMIT.

    A rule of the form `response.findings.exists(…) && …` is not evaluated while that list is
    empty: its condition is false then (compile.empty_guard)."""
    matched: list[tuple[CompiledDisclosureRule, RuleMatch]] = []
    for rule in policy.disclosure_rules_for(tool):
        if rule.empty_guard is not None and _empty(rule.empty_guard, activation):
            value, error = False, None
        else:
            value, error = _condition(rule.when, activation)
        hit = (value is True and error is None) or (error is not None and rule.verdict is not Disclosure.PERMIT)
        if trace is not None:
            trace.append(RuleTrace(rule.id, rule.verdict.value, rule.mode.value, value, error, hit))
        if hit:
            effect = Effect.DENY if rule.verdict is Disclosure.WITHHOLD else (
                Effect.REDACT if rule.verdict is Disclosure.REDACT else Effect.ALLOW
            )
            matched.append((rule, RuleMatch(rule.id, effect, rule.mode, rule.verdict.value, error)))
    if not matched:
        return _NOTHING_MATCHED
    enforced_rules = [r for r, _ in matched if r.mode is Mode.ENFORCE]
    verdict = max((r.verdict for r, _ in matched), key=DISCLOSURE_RANK.__getitem__, default=Disclosure.PERMIT)
    enforced_verdict = max(
        (r.verdict for r in enforced_rules), key=DISCLOSURE_RANK.__getitem__, default=Disclosure.PERMIT
    )
    redact = tuple(p for r in enforced_rules if r.verdict is Disclosure.REDACT for p in r.redact)
    secrets = any(r.redact_secrets for r in enforced_rules if r.verdict is Disclosure.REDACT)
    nir = next((r.no_information_response for r in enforced_rules if r.verdict is Disclosure.WITHHOLD), None)
    return DisclosureVerdict(
        verdict=enforced_verdict if enforced_verdict is verdict else verdict,
        enforced=enforced_verdict is verdict,
        matched=tuple(m for _, m in matched),
        redact=redact,
        redact_secrets=secrets,
        no_information_response=nir,
    )


def classify(
    policy: CompiledPolicy, tool: str, activation: cel.Activation | None
) -> tuple[Sensitivity, list[str]]:
    """Sensitivity of a call: the tool's class, raised by any escalation whose condition holds.

    An escalation whose condition errors escalates (fail closed).
    """
    level = Sensitivity.STANDARD
    reasons: list[str] = []
    for cls in policy.sensitivity_for(tool):
        if cls.level.rank > level.rank:
            level = cls.level
        if activation is None:
            continue
        for esc in cls.escalate:
            value, error = _condition(esc.when, activation)
            if (value is True or error is not None) and esc.to.rank > level.rank:
                level = esc.to
                reasons.append(esc.message or f"escalated to {esc.to.value}")
    return level, reasons


def variables_for(ctx: CallContext, names: frozenset[str] | None = None) -> dict[str, Any]:
    """The call's variables as plain values (cheap: no engine conversion), each built once.

    With `names`, only those are built now (the others when first asked for); returns all
    built so far.
    """
    built = ctx.variables
    want = CALL_VARIABLES if names is None else names
    if built is None or not want <= built.keys():
        assert ctx.principal is not None and ctx.tool is not None
        missing = want if built is None else want - built.keys()
        added = call_variables(
            call=ctx.call,
            principal=ctx.principal,
            tool=ctx.tool,
            annotations=ctx.annotations,
            sensitivity=ctx.sensitivity,
            arguments=ctx.arguments,
            disclosure_mode=ctx.disclosure_mode,
            findings=ctx.findings,
            session=ctx.session,
            karma=ctx.karma,
            now=ctx.now,
            classes=ctx.classes,
            class_paths=ctx.class_paths,
            shell=ctx.shell.as_cel() if ctx.shell is not None and "args_shell" in missing else None,
            urls=ctx.urls.as_cel() if ctx.urls is not None else None,
            egress=ctx.egress,
            names=missing,
        )
        if built is None:
            ctx.variables = built = added
        else:
            built.update(added)
    return built


def activation_for(ctx: CallContext, policy: CompiledPolicy) -> cel.Activation:
    """The call's CEL activation, built once and shared by every call-phase rule.

    Only the variables this tool's rules read are converted for the engine: converting the
    session history for rules that never look at it was most of a decision's cost. The plain
    variables the disclosure rules will read are built now too, so that they see the call as
    the call-phase rules saw it (the rules may redact `ctx.arguments` afterwards).
    """
    if ctx.activation is None:
        assert ctx.tool is not None
        tool, classes = ctx.tool.name, frozenset(ctx.classes)

        def build() -> tuple[frozenset[str], frozenset[str]]:
            names = policy.call_references(tool, classes)
            return names, names | (policy.disclosure_references(tool) - {"response"})

        names, built = policy.memoised("activation-names", (tool, classes), build)
        variables = variables_for(ctx, built)
        ctx.activation = cel.make_activation({k: variables[k] for k in names}, policy.engine)
    return ctx.activation  # type: ignore[no-any-return]
