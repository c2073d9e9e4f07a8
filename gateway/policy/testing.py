"""Run a call through the rules without a backend: `dharma test` cases and `dharma eval --explain`.

The same functions the pipeline uses (sanitize, classify, evaluate_rules, combine,
evaluate_disclosure) decide here, so a passing test means the gateway decides the same way.
No I/O beyond reading the test files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.policy import cel
from gateway.core.call import Decision, Disclosure, Finding, Mode, Principal, Sensitivity, ToolCall, ToolInfo
from gateway.core.errors import ErrorCode, PolicyErrors, PolicyProblem
from gateway.policy.compile import CompiledPolicy, compile_documents, load_rule_documents
from gateway.policy.evaluate import (
    DisclosureVerdict,
    RuleTrace,
    call_variables,
    classify,
    combine,
    evaluate_disclosure,
    evaluate_rules,
    evaluate_visibility,
    response_variables,
)
from gateway.policy.load import LoadedDocument, expand_paths, read_documents
from gateway.policy.cel.helpers import duration_seconds, path_normalize
from gateway.policy.models import CaseCall, CaseSessionCall, RuleTest
from gateway.stages.classify import classify_call, merge_classes
from gateway.stages.sanitizer.instructions import scan_definition, scan_result
from gateway.stages.sanitizer.shell import shell_for
from gateway.stages.sanitizer.walk import SanitizeError, SanitizerLimits, detect_secrets, sanitize

FIXED_NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class CaseResult:
    decision: Decision
    sensitivity: Sensitivity
    findings: tuple[Finding, ...]
    trace: tuple[RuleTrace, ...]
    disclosure: DisclosureVerdict | None
    error: str | None = None
    variables: dict[str, Any] = field(default_factory=dict)
    hidden: bool = False


def evaluate_case(
    policy: CompiledPolicy, call: CaseCall, response: Any = None, *, now: datetime = FIXED_NOW
) -> CaseResult:
    """Decide one call as the rules stage would, with a full trace of every candidate rule."""
    try:
        cleaned = sanitize(call.args, SanitizerLimits())
        arguments, findings = cleaned.arguments, cleaned.findings
    except SanitizeError as exc:
        return CaseResult(Decision.block(ErrorCode.INVALID_PARAMS, exc.message, None, stage="sanitizer"), Sensitivity.STANDARD, (), (), None, exc.message)
    principal = Principal(
        id=str(call.principal.get("id", "tester")),
        tier=call.principal.get("tier"),
        roles=tuple(call.principal.get("roles", ())),
        claims=dict(call.principal.get("claims", {})),
    )
    definition = {**call.tool_definition, "name": call.tool} if call.tool_definition is not None else None
    tool = ToolInfo(name=call.tool, backend=call.backend, annotations=call.annotations, changed=call.tool_changed,
                    findings=scan_definition(definition, call.other_tools) if definition is not None else (),
                    accepted=call.tool_accepted, digest="test")
    tool_call = ToolCall(
        tool=call.tool,
        arguments=call.args,
        request_id="test",
        purpose=call.purpose,
        disclosure_mode=call.disclosure_mode,
        depth=call.depth,
        session_id="test-session",
    )
    annotations = policy.annotations_for(call.tool, call.annotations)
    mode = policy.normalise_disclosure_mode(call.disclosure_mode)
    session = session_history(call.session, now)
    karma = {"calls": len(session), "denials": sum(1 for c in session if c["decision"] == "deny")}
    classes, class_paths = classify_call(call.tool, call.annotations, arguments)
    shell = shell_for(call.tool, arguments, policy.call_references(call.tool))
    if shell is not None:
        merge_classes(classes, class_paths, shell.classes, shell.class_paths)
    base: dict[str, Any] = dict(
        call=tool_call, principal=principal, tool=tool, annotations=annotations, arguments=arguments,
        disclosure_mode=mode, findings=findings, session=session, karma=karma, now=now,
        classes=classes, class_paths=class_paths, shell=shell.as_cel() if shell is not None else None,
    )
    probe = cel.make_activation(call_variables(sensitivity=Sensitivity.STANDARD, **base), policy.engine)
    sensitivity, _ = classify(policy, call.tool, probe)
    variables = call_variables(sensitivity=sensitivity, **base)
    activation = cel.make_activation(variables, policy.engine)
    trace: list[RuleTrace] = []
    hiding = [m for m in evaluate_visibility(policy, call.tool, activation, trace) if m.mode is Mode.ENFORCE]
    if hiding:
        decision = Decision.block(ErrorCode.TOOL_NOT_FOUND, f"Unknown tool: {call.tool}", None, stage="tool_visibility",
                                  matched=tuple(hiding))
        return CaseResult(decision, sensitivity, tuple(findings), tuple(trace), None, variables=variables, hidden=True)
    decision = combine(evaluate_rules(policy, call.tool, activation, trace), policy)
    verdict = None
    if response is not None:
        found = detect_secrets(response) + scan_result(response)
        verdict = evaluate_disclosure(
            policy, call.tool, cel.make_activation(response_variables(variables, response, False, found), policy.engine), trace
        )
    shown = {**variables, "response": {"result": response}} if response is not None else variables
    return CaseResult(decision, sensitivity, tuple(findings), tuple(trace), verdict, variables=shown)


def session_history(calls: list[CaseSessionCall], now: datetime) -> list[dict[str, Any]]:
    """A case's `session` as the history store would hold it (gateway.stages.classify.history_detail)."""
    out = []
    for c in calls:
        ago = duration_seconds(c.ago) if isinstance(c.ago, str) else float(c.ago)
        paths = c.paths if isinstance(c.paths, dict) else {cls: list(c.paths) for cls in c.classes}
        at = now - timedelta(seconds=ago)
        out.append({
            "tool": c.tool, "decision": c.decision, "time": at.isoformat().replace("+00:00", "Z"),
            "at": at.timestamp(), "ran": c.ran, "classes": sorted(set(c.classes) | set(paths)),
            "paths": {cls: [path_normalize(p) if "://" not in p else p for p in ps] for cls, ps in paths.items()},
            "findings": list(c.findings),
        })  # fmt: skip
    return out


_PATH = re.compile(r"\b(?:args_shell|args|principal|tool|request|session|response|findings|call)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def deciding_values(source: str, variables: dict[str, Any]) -> dict[str, Any]:
    """The values of the variable paths an expression reads (`args.path` → '../x'), for explanations.

    A path that does not exist is shown as `<missing>`: that is what makes an unguarded rule error.
    """
    values: dict[str, Any] = {}
    paths = []
    for match in _PATH.finditer(source):
        path = match.group(0)
        if source[match.end():].lstrip().startswith("("):
            path = path.rsplit(".", 1)[0]  # a method call: show its receiver
        paths.append(path)
    for path in dict.fromkeys(paths):
        node: Any = variables
        for part in path.split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                node = "<missing>"
                break
        values[path] = node
    return values


@dataclass(slots=True)
class CaseOutcome:
    file: str
    name: str
    passed: bool
    failures: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RuleTestReport:
    cases: list[CaseOutcome] = field(default_factory=list)
    rules: dict[str, str] = field(default_factory=dict)  # rule id -> file:line
    exercised: set[str] = field(default_factory=set)

    @property
    def failed(self) -> list[CaseOutcome]:
        return [c for c in self.cases if not c.passed]

    @property
    def unexercised(self) -> list[str]:
        return sorted(r for r in self.rules if r not in self.exercised)


def check_case(result: CaseResult, expect: Any) -> list[str]:
    """Compare a result with a case's expectations; return what differs."""
    failures: list[str] = []
    d = result.decision
    if result.error:
        failures.append(f"the call itself is invalid: {result.error}")
        return failures
    if expect.decision is not None and d.effect is not expect.decision:
        failures.append(f"decision: expected {expect.decision.value}, got {d.effect.value}")
    if expect.enforced is not None and d.enforced is not expect.enforced:
        failures.append(f"enforced: expected {expect.enforced}, got {d.enforced}")
    matched = set(d.rule_ids) | {m.rule_id for m in (result.disclosure.matched if result.disclosure else ())}
    if expect.rules is not None and matched != set(expect.rules):
        failures.append(f"rules: expected {sorted(expect.rules)}, got {sorted(matched)}")
    if expect.block_class is not None and d.block_class is not expect.block_class:
        got = d.block_class.value if d.block_class else None
        failures.append(f"block_class: expected {expect.block_class.value}, got {got}")
    if expect.disclosure is not None:
        got_disclosure = result.disclosure.verdict if result.disclosure else Disclosure.PERMIT
        if got_disclosure is not expect.disclosure:
            failures.append(f"disclosure: expected {expect.disclosure.value}, got {got_disclosure.value}")
    if expect.hidden is not None and result.hidden is not expect.hidden:
        failures.append(f"hidden: expected {expect.hidden}, got {result.hidden}")
    if expect.tool_findings is not None:
        got = sorted({f["kind"] for f in result.variables.get("tool", {}).get("findings", [])})
        if got != sorted(set(expect.tool_findings)):
            failures.append(f"tool findings: expected {sorted(set(expect.tool_findings))}, got {got}")
    if expect.findings is not None:
        kinds = sorted({f.kind for f in result.findings})
        if kinds != sorted(set(expect.findings)):
            failures.append(f"findings: expected {sorted(set(expect.findings))}, got {kinds}")
    return failures


def run_tests(paths: list[Path], *, engine: str | None = None) -> RuleTestReport:
    """Run every RuleTest found under `paths`. Raises PolicyErrors if any file under test does not load."""
    report = RuleTestReport()
    test_docs: list[LoadedDocument] = []
    problems: list[PolicyProblem] = []
    for file in expand_paths(paths):
        try:
            test_docs.extend(d for d in read_documents(file) if isinstance(d.model, RuleTest))
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyErrors(problems)
    for doc in test_docs:
        assert isinstance(doc.model, RuleTest)
        base = Path(doc.path).parent
        policy = compile_documents(load_rule_documents([base / r for r in doc.model.rules]), engine=engine)
        for rule in policy.all_rules():
            report.rules.setdefault(rule.id, f"{rule.file}:{rule.line}")
        for i, case in enumerate(doc.model.cases):
            result = evaluate_case(policy, case.call, case.response)
            report.exercised.update(result.decision.rule_ids)
            if result.disclosure:
                report.exercised.update(m.rule_id for m in result.disclosure.matched)
            failures = check_case(result, case.expect)
            where = f"{doc.path}:{doc.line_of(('cases', i))}"
            report.cases.append(CaseOutcome(where, case.name, not failures, failures))
    return report
