"""Run a call through the rules without a backend: `dharma test` cases and `dharma eval --explain`.

The same functions the pipeline uses (sanitize, classify, evaluate_rules, combine,
evaluate_disclosure) decide here, so a passing test means the gateway decides the same way.
A case that names a principal of the test's `policy` is decided by the whole pipeline's deciding
stages instead (`gateway.policy.whole`): tier gate, sensitivity and purpose, escalation, rate
limits, rules and approval. No I/O beyond reading the test files.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

from gateway.policy import cel
from gateway.core.call import Decision, Disclosure, Finding, Mode, Principal, Sensitivity, ToolCall, ToolInfo
from gateway.core.errors import ErrorCode, PolicyErrors, PolicyProblem
from gateway.policy.compile import CompiledPolicy, CompiledPrincipal, compile_documents, load_policy, named_rule_documents
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
    variables_for,
)
from gateway.policy.load import LoadedDocument, expand_paths, read_documents
from gateway.policy.cel.helpers import duration_seconds, path_normalize
from gateway.policy.models import CaseCall, CaseSessionCall, RuleCase, RuleTest
from gateway.policy.whole import Decider, decide_call, outcome_status
from gateway.stages.classify import classify_call, merge_classes
from gateway.stages.sanitizer.instructions import scan_definition, scan_result
from gateway.stages.sanitizer.shell import bash_arguments, shell_for
from gateway.stages.sanitizer.urls import urls_for
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
    rules_decision: Decision | None = None  # the rules' verdict when another stage decided (whole-pipeline cases)
    whole: bool = False

    @property
    def matched_rules(self) -> set[str]:
        """The call- and response-phase rules that matched, whichever stage had the last word."""
        rules = self.rules_decision.rule_ids if self.rules_decision is not None else self.decision.rule_ids
        return set(rules) | {m.rule_id for m in (self.disclosure.matched if self.disclosure else ())}


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
    arguments = bash_arguments(call.tool, policy.call_references(call.tool), call.args, arguments)
    classes, class_paths = classify_call(call.tool, call.annotations, arguments)
    shell = shell_for(call.tool, arguments, policy.call_references(call.tool))
    if shell is not None:
        merge_classes(classes, class_paths, shell.classes, shell.class_paths)
    urls = urls_for(call.tool, arguments, policy.call_references(call.tool))
    egress = call.egress.model_dump(include={"allow", "deny"}) if call.egress is not None else policy.egress_for(principal.tier)
    base: dict[str, Any] = dict(
        call=tool_call, principal=principal, tool=tool, annotations=annotations, arguments=arguments,
        disclosure_mode=mode, findings=findings, session=session, karma=karma, now=now,
        classes=classes, class_paths=class_paths, shell=shell.as_cel() if shell is not None else None,
        urls=urls.as_cel() if urls is not None else None, egress=egress,
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
    shown = variables
    if response is not None:
        found = detect_secrets(response) + scan_result(response)
        shown = response_variables(variables, response, False, found)  # what the disclosure rules saw, for --explain
        verdict = evaluate_disclosure(policy, call.tool, cel.make_activation(shown, policy.engine), trace)
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


def policy_principal(policy: CompiledPolicy, principal_id: str) -> Principal | None:
    """The principal `principal_id` of the policy, as authentication would resolve it."""
    found = next((p for p in policy.principals if p.id == principal_id), None)
    return None if found is None else Principal(found.id, found.tier, found.roles, dict(found.claims))


async def evaluate_whole(
    policy: CompiledPolicy, call: CaseCall, principal: Principal | None, response: Any = None, *, now: datetime = FIXED_NOW
) -> CaseResult:
    """Decide one call with the whole pipeline's deciding stages, after `call.prior_calls` identical ones."""
    tool = ToolInfo(name=call.tool, backend=call.backend, annotations=call.annotations, changed=call.tool_changed)
    tool_call = ToolCall(
        tool=call.tool, arguments=call.args, request_id="test", purpose=call.purpose,
        disclosure_mode=call.disclosure_mode, depth=call.depth, session_id="test-session",
    )
    session = session_history(call.session, now)
    karma = {"calls": len(session), "denials": sum(1 for c in session if c["decision"] == "deny")}
    decider = Decider()
    at = now.timestamp()
    for _ in range(call.prior_calls):
        await decide_call(decider, policy, tool_call, principal, tool, at=at, session=session, karma=karma)
    decided = await decide_call(decider, policy, tool_call, principal, tool, at=at, session=session, karma=karma)
    ctx = decided.ctx
    verdict = None
    variables: dict[str, Any] = {}
    if ctx.principal is not None and not decided.decision.blocks:
        variables = variables_for(ctx)
        if response is not None:
            found = detect_secrets(response) + scan_result(response)
            activation = cel.make_activation(response_variables(variables, response, False, found), policy.engine)
            verdict = evaluate_disclosure(policy, call.tool, activation)
    return CaseResult(
        decided.decision, ctx.sensitivity, tuple(ctx.findings), (), verdict,
        variables=variables, rules_decision=ctx.rules_decision, whole=True,
    )


_PATH = re.compile(r"\b(?:args_shell|args_urls|egress|args|principal|tool|request|session|response|findings|call)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


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
    suite: str = ""  # the RuleTest's metadata name
    seconds: float = 0.0
    whole: bool = False  # decided by the whole pipeline (the case named a principal)


@dataclass(slots=True)
class RuleTestReport:
    cases: list[CaseOutcome] = field(default_factory=list)
    rules: dict[str, str] = field(default_factory=dict)  # rule id -> file:line
    exercised: set[str] = field(default_factory=set)
    tiers: dict[str, str] = field(default_factory=dict)  # tier name -> the profile file defining it
    tiers_exercised: set[str] = field(default_factory=set)

    @property
    def failed(self) -> list[CaseOutcome]:
        return [c for c in self.cases if not c.passed]

    @property
    def unexercised(self) -> list[str]:
        return sorted(r for r in self.rules if r not in self.exercised)

    @property
    def unexercised_tiers(self) -> list[str]:
        return sorted(t for t in self.tiers if t not in self.tiers_exercised)

    @property
    def coverage(self) -> float:
        """Percent of the rules and tiers under test that some case exercised (100 when there are none).

        A rule is exercised when it matched in some case; a tier when some whole-pipeline case
        was made by a principal of that tier.
        """
        total = len(self.rules) + len(self.tiers)
        if not total:
            return 100.0
        covered = total - len(self.unexercised) - len(self.unexercised_tiers)
        return 100.0 * covered / total


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
    matched = result.matched_rules
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
    status = outcome_status(d)
    if expect.status is not None and status is not expect.status:
        failures.append(f"status: expected {expect.status.value}, got {status.value}")
    code = d.code if d.blocks else None
    if expect.error_code is not None and code is not expect.error_code:
        failures.append(f"error_code: expected {expect.error_code.value}, got {code.value if code else None}")
    if expect.message is not None and expect.message not in d.message:
        failures.append(f"message: expected it to contain {expect.message!r}, got {d.message!r}")
    return failures


def run_tests(paths: list[Path], *, engine: str | None = None) -> RuleTestReport:
    """Run every RuleTest found under `paths`. Raises PolicyErrors if any file under test does not load."""
    return anyio.run(_run_tests, paths, engine)


async def _run_tests(paths: list[Path], engine: str | None) -> RuleTestReport:
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
    suites: list[tuple[LoadedDocument, CompiledPolicy]] = []
    for doc in test_docs:
        try:
            suites.append((doc, policy_under_test(doc, engine)))
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    if problems:
        raise PolicyErrors(problems)
    for doc, policy in suites:
        assert isinstance(doc.model, RuleTest)
        for rule in policy.all_rules():
            report.rules.setdefault(rule.id, f"{rule.file}:{rule.line}")
        for tier in policy.tiers:
            report.tiers.setdefault(tier, policy.files[0])
        for i, case in enumerate(doc.model.cases):
            where = f"{doc.path}:{doc.line_of(('cases', i))}"
            started = time.perf_counter()
            result, failures = await run_case(policy, case, has_profile=doc.model.policy is not None)
            if result is not None:
                report.exercised.update(result.matched_rules)
                if result.whole and isinstance(case.call.principal, str):
                    principal = policy_principal(policy, case.call.principal)
                    report.tiers_exercised.add(principal.tier or "" if principal else "")
            report.cases.append(CaseOutcome(
                where, case.name, not failures, failures, suite=doc.model.metadata.name,
                seconds=time.perf_counter() - started, whole=isinstance(case.call.principal, str),
            ))
    return report


def policy_under_test(doc: LoadedDocument, engine: str | None) -> CompiledPolicy:
    """The test's `policy` profile with its `rules` added, or its `rules` alone; PolicyErrors name the test's lines."""
    model = doc.model
    assert isinstance(model, RuleTest)
    rule_docs = named_rule_documents(doc, "rules", model.rules)
    if model.policy is None:
        return compile_documents(rule_docs, engine=engine)
    target = (Path(doc.path).parent / model.policy).resolve()
    if not target.is_file():
        raise PolicyErrors([PolicyProblem(doc.path, doc.line_of(("policy",)), "", f"policy not found: {model.policy}")])
    policy = load_policy(target, engine=engine, extra_docs=rule_docs)
    return with_test_principals(policy, doc)


def with_test_principals(policy: CompiledPolicy, doc: LoadedDocument) -> CompiledPolicy:
    """`policy` with the RuleTest's own `principals` added (no credentials: they are only named by cases)."""
    model = doc.model
    assert isinstance(model, RuleTest)
    problems: list[PolicyProblem] = []
    known = {p.id for p in policy.principals}
    added: list[CompiledPrincipal] = []
    for i, spec in enumerate(model.principals):
        line = doc.line_of(("principals", i))
        if spec.tier not in policy.tiers:
            problems.append(PolicyProblem(doc.path, line, "", f"principal {spec.id!r} has unknown tier {spec.tier!r} "
                                          f"(the profile's tiers: {', '.join(policy.tiers)})"))
        if spec.id in known:
            problems.append(PolicyProblem(doc.path, line, "", f"principal {spec.id!r} is already in the profile"))
        known.add(spec.id)
        added.append(CompiledPrincipal(spec.id, spec.tier, tuple(spec.roles), dict(spec.claims), (), None))
    if problems:
        raise PolicyErrors(problems)
    return dataclasses.replace(policy, principals=(*policy.principals, *added)) if added else policy


async def run_case(policy: CompiledPolicy, case: RuleCase, *, has_profile: bool) -> tuple[CaseResult | None, list[str]]:
    """Decide one case (by the rules alone, or by the whole pipeline when it names a principal) and check it."""
    if isinstance(case.call.principal, str):
        if not has_profile:
            return None, [f"the case names principal {case.call.principal!r}: the RuleTest needs a `policy:` profile to find it in"]
        principal = policy_principal(policy, case.call.principal)
        if principal is None:
            known = ", ".join(p.id for p in policy.principals) or "none"
            return None, [f"principal {case.call.principal!r} is not in the profile (its principals: {known})"]
        result = await evaluate_whole(policy, case.call, principal, case.response)
    else:
        result = evaluate_case(policy, case.call, case.response)
    return result, check_case(result, case.expect)
