"""`dharma check|test|eval|schema`: the policy author's commands.

Lint, unit-test, dry-run and describe policy and rule files. A bare `dharma check` or `dharma
test` works on the current directory (see `default_paths`), never on the files shipped with the
package, so a CI step that runs it in a repository checks that repository's files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gateway.cli.common import (
    COMMANDS, EXIT_FAILED, EXIT_OK, UsageError, add_command, json_arg, json_object_arg, out, pinned_definitions,
    settings_of,
)

ENGINES = ("cel-python", "common-expression-language")
CONFIG_NAMES = frozenset({"dharma.yaml", "dharma.yml"})
FALLBACK = (
    "else the *.yaml and *.yml files in the current directory (not dharma.yaml, the configuration); with none "
    "of those it is a usage error (exit 2). Never the files shipped with the package."
)


def default_paths(subdirs: tuple[str, ...], command: str) -> list[Path]:
    """The paths a bare `dharma check` / `dharma test` works on, from the current directory."""
    found = [Path(d) for d in subdirs if Path(d).is_dir()]
    if not found:
        found = sorted(
            Path(p.name) for p in Path.cwd().iterdir() if p.suffix in (".yaml", ".yml") and p.is_file() and p.name not in CONFIG_NAMES
        )
    if not found:
        where = " or ".join(f"./{d}/" for d in subdirs)
        raise UsageError(f"nothing to {command} in {Path.cwd()}: no {where} and no *.yaml files; name the files or directories to {command}")
    return found


def cmd_check(args: argparse.Namespace) -> int:
    from gateway.core.errors import PolicyErrors
    from gateway.policy.compile import compile_documents, load_policy, load_rule_documents
    from gateway.policy.load import expand_paths, read_documents
    from gateway.policy.models import Policy

    paths = [Path(p) for p in args.paths] or default_paths(("policies", "rules"), "check")
    problems: list[Any] = []
    warnings: list[Any] = []
    files = expand_paths(paths)
    if not files:
        raise UsageError("no policy files found in " + ", ".join(map(str, paths)))
    rule_files: list[Path] = []
    compiled: list[Any] = []
    profiles: list[Any] = []
    for file in files:
        try:
            docs = read_documents(file)
        except PolicyErrors as exc:
            problems.extend(exc.problems)
            continue
        if any(isinstance(d.model, Policy) for d in docs):
            try:
                profiles.append(load_policy(file, engine=args.engine))
                compiled.append(profiles[-1])
            except PolicyErrors as exc:
                problems.extend(exc.problems)
        else:
            rule_files.append(file)
    if rule_files:
        try:
            compiled.append(compile_documents(load_rule_documents(rule_files), engine=args.engine))
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    known = known_tools(args)
    for policy in compiled:
        # A profile that loads may still hold errors `dharma check` fails on (principals shadowed for a local user).
        problems.extend(w for w in policy.warnings if w.severity == "error")
        warnings.extend(w for w in policy.warnings if w.severity != "error")
        if known:
            warnings.extend(unmatched_globs(policy, known, "--tools " + args.tools if args.tools else "the pins"))
    for item in sorted(set(problems)):
        out(str(item))
    for item in sorted(set(warnings)):
        out(str(item))
    if args.explain_principals:
        print_principals(profiles)
    out(f"{len(files)} file(s) checked: {len(set(problems))} error(s), {len(set(warnings))} warning(s)")
    return EXIT_FAILED if problems else EXIT_OK


def print_principals(profiles: list[Any]) -> None:
    """`--explain-principals`: each profile's principals in resolution order (never a secret)."""
    from gateway.policy.principals import explain_principals

    for policy in profiles:
        out(f"principals of profile {policy.name!r} ({policy.files[0]}), in resolution order (the first match wins; "
            "a JWT resolves by its subject = the principal id):")
        for line in explain_principals(policy.principals) or ["  (none: no caller resolves, every call is unauthenticated)"]:
            out(line)


def known_tools(args: argparse.Namespace) -> set[str]:
    """The tool names to check rule globs against: a `--tools` inventory (a tools/list answer as JSON),
    else every tool the gateway has pinned under the state root; empty when neither has any."""
    if args.tools:
        found = json_arg("@" + args.tools, "--tools")
        if isinstance(found, dict):
            found = (found.get("result") or found).get("tools") if isinstance(found.get("result") or found, dict) else None
        if not isinstance(found, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in found):
            raise UsageError(f"--tools {args.tools}: expected a tools/list answer ({{\"tools\": [{{\"name\": ...}}]}})")
        return {t["name"] for t in found}
    from gateway.core.errors import ConfigError

    try:
        return {tool for _, tool in pinned_definitions(args)}
    except ConfigError:
        return set()


def unmatched_globs(policy: Any, known: set[str], source: str) -> list[Any]:
    """A warning for each rule tool glob that matches none of `known`: a typo, or a rule for a tool nobody serves."""
    from gateway.core.errors import PolicyProblem
    from gateway.policy.compile import glob_match

    found = []
    for rule in policy.all_rules():
        unmatched = [p for p in rule.tools if not any(glob_match(name, p) for name in known)]
        if unmatched:
            whole = " (the rule applies to none of them)" if len(unmatched) == len(rule.tools) else ""
            found.append(PolicyProblem(rule.file, rule.line, rule.id,
                                       f"tool glob(s) {', '.join(map(repr, unmatched))} match no tool in {source} "
                                       f"({len(known)} known){whole}", severity="warning"))
    return found


def cmd_test(args: argparse.Namespace) -> int:
    from gateway.core.errors import PolicyErrors
    from gateway.policy.testing import run_tests

    paths = [Path(p) for p in args.paths] or default_paths(("rules",), "test")
    try:
        report = run_tests(paths, engine=args.engine)
    except PolicyErrors as exc:
        for item in exc.problems:
            out(str(item))
        return EXIT_FAILED
    if not report.cases:
        out("no RuleTest cases found")
        return EXIT_FAILED
    below = args.min_coverage is not None and report.coverage < args.min_coverage
    if args.format == "junit":
        out(junit_xml(report))
    elif args.format == "json":
        out(json.dumps(report_json(report, args.min_coverage), indent=2))
    else:
        print_test_report(report, verbose=args.verbose)
        if below:
            out(f"coverage {report.coverage:.1f}% is below --min-coverage {args.min_coverage:g}%")
    if report.failed or below or (args.require_coverage and report.unexercised):
        return EXIT_FAILED
    return EXIT_OK


def print_test_report(report: Any, *, verbose: bool) -> None:
    """The text form: failures (every case with -v), what no case exercised, the summary line."""
    for case in report.cases:
        if not case.passed or verbose:
            out(f"{'PASS' if case.passed else 'FAIL'} {case.file} {case.name}")
            for failure in case.failures:
                out(f"     {failure}")
    passed = len(report.cases) - len(report.failed)
    for rule_id in report.unexercised:
        out(f"not exercised: {rule_id} ({report.rules[rule_id]})")
    for tier in report.unexercised_tiers:
        out(f"not exercised: tier {tier} ({report.tiers[tier]}): no case names a principal of it")
    tiers = f", {len(report.tiers) - len(report.unexercised_tiers)}/{len(report.tiers)} tiers" if report.tiers else ""
    out(f"{passed} passed, {len(report.failed)} failed; {len(report.rules) - len(report.unexercised)}/{len(report.rules)} "
        f"rules exercised{tiers}; coverage {report.coverage:.1f}%")


def report_json(report: Any, min_coverage: float | None) -> dict[str, Any]:
    """The `--format json` document: every case, what no case exercised, the coverage."""
    return {
        "passed": len(report.cases) - len(report.failed),
        "failed": len(report.failed),
        "coverage": round(report.coverage, 2),
        "min_coverage": min_coverage,
        "rules": {"total": len(report.rules), "unexercised": [{"id": r, "at": report.rules[r]} for r in report.unexercised]},
        "tiers": {"total": len(report.tiers), "unexercised": [{"name": t, "at": report.tiers[t]} for t in report.unexercised_tiers]},
        "cases": [
            {"suite": c.suite, "name": c.name, "at": c.file, "passed": c.passed, "failures": c.failures,
             "whole_pipeline": c.whole, "seconds": round(c.seconds, 6)}
            for c in report.cases
        ],
    }


def junit_xml(report: Any) -> str:
    """The report as JUnit XML: one <testsuite> per RuleTest, one <testcase> per case, a <failure> per failing case."""
    from xml.etree import ElementTree as ET

    root = ET.Element("testsuites", name="dharma test", tests=str(len(report.cases)), failures=str(len(report.failed)))
    suites: dict[str, ET.Element] = {}
    for case in report.cases:
        suite = suites.get(case.suite)
        if suite is None:
            suite = suites[case.suite] = ET.SubElement(root, "testsuite", name=case.suite, tests="0", failures="0")
        suite.set("tests", str(int(suite.get("tests", "0")) + 1))
        path, _, line = case.file.rpartition(":")
        item = ET.SubElement(suite, "testcase", name=case.name, classname=case.suite, file=path, line=line,
                             time=f"{case.seconds:.6f}")
        if not case.passed:
            suite.set("failures", str(int(suite.get("failures", "0")) + 1))
            failure = ET.SubElement(item, "failure", message=case.failures[0] if case.failures else "failed")
            failure.text = "\n".join(case.failures)
    props = ET.SubElement(root, "properties")
    ET.SubElement(props, "property", name="coverage", value=f"{report.coverage:.2f}")
    for rule_id in report.unexercised:
        ET.SubElement(props, "property", name="unexercised_rule", value=f"{rule_id} ({report.rules[rule_id]})")
    for tier in report.unexercised_tiers:
        ET.SubElement(props, "property", name="unexercised_tier", value=f"{tier} ({report.tiers[tier]})")
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def _percent(text: str) -> float:
    """A --min-coverage: a percentage 0..100."""
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, not {text!r}")
    return value


def cmd_eval(args: argparse.Namespace) -> int:
    from gateway.policy.compile import load_policy
    from gateway.policy.models import CaseCall
    from gateway.policy.testing import evaluate_case

    policy_path = Path(args.policy) if args.policy else settings_of(args).policy
    policy = load_policy(policy_path, engine=args.engine)
    principal: dict[str, Any] = {"id": "eval", "tier": None, "roles": []}
    found = eval_principal(args, policy, policy_path)
    if found is not None:
        args.principal = found.id
        principal = {"id": found.id, "tier": found.tier, "roles": list(found.roles), "claims": found.claims}
    if args.tool is None:
        if found is None:
            raise UsageError("name the call's --tool (or, to see whom a credential resolves to, --principal, --api-key or --local-user)")
        described = principal_json(found)
        out(json.dumps({"policy": policy.name, "principal": described}, indent=2) if args.json else resolved_text(args, described))
        return EXIT_OK
    call = CaseCall(
        tool=args.tool,
        args=json_object_arg(args.args, "--args"),
        principal=principal,
        annotations=json_object_arg(args.annotations, "--annotations"),
        purpose=args.purpose,
        disclosure_mode=args.disclosure_mode,
        depth=args.depth,
    )
    response = json_arg(args.response, "--response")
    result = evaluate_case(policy, call, response)
    report = _eval_report(args, policy, call, principal, response, result, found)
    if args.json:
        out(json.dumps(report, indent=2, default=str))
        return EXIT_OK
    if found is not None and (args.api_key or args.local_user):
        out(resolved_text(args, report["principal"]))
    _print_eval(report, principal, enforced=result.decision.enforced)
    if args.explain:
        print_considered(policy, call.tool, result)
    return EXIT_OK


def _eval_pipeline(policy: Any, call: Any, principal_id: str, response: Any) -> dict[str, Any]:
    """The whole pipeline's verdict on `call` for a named principal (tier gate, sensitivity, rate limits, rules)."""
    import anyio

    from gateway.policy.testing import evaluate_whole, policy_principal
    from gateway.policy.whole import outcome_status

    whole = anyio.run(evaluate_whole, policy, call.model_copy(update={"principal": principal_id}),
                      policy_principal(policy, principal_id), response)
    w = whole.decision
    return {
        "status": outcome_status(w).value,
        "decision": w.effect.value,
        "enforced": w.enforced,
        "error_code": w.code.value if w.blocks and w.code else None,
        "stage": w.stage or None,
        "message": w.message,
        "sensitivity": whole.sensitivity.value,
    }


def _eval_report(args: argparse.Namespace, policy: Any, call: Any, principal: dict[str, Any], response: Any, result: Any,
                 found: Any) -> dict[str, Any]:
    """What `dharma eval` reports of one call: the rules' decision, and the pipeline's for a named principal."""
    from gateway.core.call import Principal
    from gateway.policy.testing import deciding_values
    from gateway.stages.tier_gate import is_granted

    granted = None
    if args.principal:
        annotations = policy.annotations_for(call.tool, call.annotations)
        granted = is_granted(policy, Principal(principal["id"], principal["tier"]), call.tool, annotations)
    d = result.decision
    report: dict[str, Any] = {
        "policy": policy.name,
        "principal": principal_json(found) if found is not None else None,
        "policy_version": policy.version,
        "engine": policy.engine,
        "tool": call.tool,
        "pipeline": _eval_pipeline(policy, call, args.principal, response) if args.principal else None,
        "granted": granted,
        "sensitivity": result.sensitivity.value,
        "findings": [f.as_cel() for f in result.findings],
        "decision": d.effect.value,
        "enforced": d.enforced,
        "error_code": d.code.value if d.code else None,
        "block_class": d.block_class.value if d.block_class else None,
        "message": d.message,
        "matched": [m.rule_id for m in d.matched],
        "disclosure": result.disclosure.verdict.value if result.disclosure else None,
        "response_findings": result.variables.get("response", {}).get("findings"),
    }
    if args.explain:
        sources = {r.id: (r.when.source if r.when else "") for r in policy.all_rules()}
        report["considered"] = [
            {"rule": t.rule_id, "effect": t.effect, "mode": t.mode, "value": t.value, "error": t.error, "matched": t.matched,
             "inputs": deciding_values(sources[t.rule_id], result.variables)}
            for t in result.trace
        ]
    return report


def _print_eval(report: dict[str, Any], principal: dict[str, Any], *, enforced: bool) -> None:
    """`dharma eval`'s text form of `report`."""
    pipeline = report["pipeline"]
    if pipeline is None:
        out("pipeline: not judged (name a --principal: the tier gate, sensitivity and rate limits decide per principal)")
    else:
        code = f" {pipeline['error_code']}" if pipeline["error_code"] else ""
        at = f" at {pipeline['stage']}" if pipeline["error_code"] and pipeline["stage"] else ""
        out(f"pipeline: {pipeline['status']}{code}{at}{': ' + pipeline['message'] if pipeline['message'] else ''}")
        out("the rules alone (as if the tier gate had admitted the call):")
    out(f"decision: {report['decision']}{'' if enforced else ' (not enforced: audit/warn mode)'}")
    if report["granted"] is not None:
        out(f"granted to {principal['id']} (tier {principal['tier']}): {'yes' if report['granted'] else 'no — the tool is hidden from them'}")
    out(f"sensitivity: {report['sensitivity']}")
    if report["findings"]:
        out("findings: " + ", ".join(f"{f['kind']} at {f['path']}" for f in report["findings"]))
    if report["message"]:
        out(f"message: {report['message']}")
    if report["block_class"]:
        out(f"block_class: {report['block_class']}  error_code: {report['error_code']}")
    if report["disclosure"]:
        out(f"disclosure: {report['disclosure']}")
    if report["response_findings"]:
        out("response findings: " + ", ".join(f"{f['kind']} at {f['path']}" for f in report["response_findings"]))


def print_considered(policy: Any, tool: str, result: Any) -> None:
    """`dharma eval --explain`: every rule considered, its condition and the values that decided it."""
    from gateway.policy.evaluate import condition_failure
    from gateway.policy.testing import deciding_values

    rules = {r.id: r for r in policy.all_rules()}
    out(f"rules considered for {tool}: {len(result.trace)} of {len(rules)}")
    for t in result.trace:
        rule = rules[t.rule_id]
        source = rule.when.source if rule.when else ""
        why = (f"could not evaluate its condition ({condition_failure(t.error, source)}) → "
               f"{'MATCHED BY ERROR (fail closed)' if t.matched else 'no match'}") if t.error else f"condition = {json.dumps(t.value, default=str)}"
        out(f"  {'MATCH' if t.matched else '     '} {t.rule_id} [{t.effect}, {t.mode}] {rule.file}:{rule.line}")
        out(f"         when: {rule.when.source if rule.when else '(always)'}")
        for path, value in deciding_values(rule.when.source if rule.when else "", result.variables).items():
            out(f"         {path} = {json.dumps(value, default=str)}")
        out(f"         {why}")


def eval_principal(args: argparse.Namespace, policy: Any, policy_path: Path) -> Any:
    """The principal `dharma eval` judges as: the one `--principal` names, or the one `--api-key` /
    `--local-user` resolves to exactly as the gateway would (first match); None with none of them."""
    import sys

    from gateway.core.call import Credentials
    from gateway.stages.authenticate import authenticate

    given = [name for name in ("principal", "api_key", "local_user") if getattr(args, name)]
    if len(given) > 1:
        raise UsageError("give one of --principal, --api-key and --local-user")
    if not given:
        return None
    if args.principal:
        wanted = args.principal
        credential = f"principal {wanted!r}"
    else:
        key = sys.stdin.readline().rstrip("\r\n") if args.api_key == "-" else args.api_key
        credentials = Credentials(api_key=key) if args.api_key else Credentials(local_user=args.local_user)
        credential = "the API key" if args.api_key else f"local user {args.local_user!r}"
        resolved = authenticate(policy, credentials)
        if resolved is None:
            raise UsageError(f"{credential} resolves to no principal of {policy_path} (such a call is refused: unauthenticated)")
        wanted = resolved.id
    found = next((p for p in policy.principals if p.id == wanted), None)
    if found is None:
        raise UsageError(f"{credential} is not in {policy_path} (its principals: {', '.join(p.id for p in policy.principals) or 'none'})")
    return found


def principal_json(found: Any) -> dict[str, Any]:
    """A principal as `dharma eval` reports it: no key, only how it authenticates."""
    from gateway.policy.principals import credentials_of

    return {"id": found.id, "tier": found.tier, "roles": list(found.roles), "authenticates_by": credentials_of(found),
            "defined_at": found.source}


def resolved_text(args: argparse.Namespace, described: dict[str, Any]) -> str:
    credential = "the API key" if args.api_key else f"local user {args.local_user!r}" if args.local_user else "principal"
    return (f"{credential} resolves to principal {described['id']!r}: tier {described['tier']}, roles "
            f"{','.join(described['roles']) or '-'}, via {', '.join(described['authenticates_by'])} ({described['defined_at']})")


def cmd_schema(args: argparse.Namespace) -> int:
    from gateway.policy.models import KINDS

    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Dharma Gateway policy file (apiVersion dharma/v1)",
        "oneOf": [],
        "$defs": {},
    }
    for kind, model in KINDS.items():
        if args.kind and kind != args.kind:
            continue
        sub = model.model_json_schema(ref_template="#/$defs/{model}")
        schema["$defs"].update(sub.pop("$defs", {}))
        schema["$defs"][kind] = sub
        schema["oneOf"].append({"$ref": f"#/$defs/{kind}"})
    if args.kind and not schema["oneOf"]:
        raise UsageError(f"unknown kind {args.kind!r}: one of {', '.join(KINDS)}")
    out(json.dumps(schema, indent=2, sort_keys=True))
    return EXIT_OK



def add_parsers(sub: Any) -> None:
    """Add `dharma check`, `test`, `eval` and `schema` to the `dharma` subparsers."""

    def engine_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--engine", choices=ENGINES, help="CEL engine (default: the fastest installed)")

    p = add_command(sub, "check", COMMANDS["check"],
                    epilog="Without PATHS: ./policies and ./rules when either exists, " + FALLBACK)
    p.add_argument("paths", nargs="*", metavar="PATHS", help="policy/rule files or directories (searched for *.yaml, *.yml)")
    p.add_argument("--tools", metavar="FILE",
                   help="a tools/list answer (JSON): warn about rule tool globs that match none of its tools "
                        "(default: the tools pinned under the state root, when there are any)")
    p.add_argument("--explain-principals", action="store_true",
                   help="print each profile's principals in resolution order: id, how it authenticates (API key "
                        "digests shortened, never a key), tier, roles, and the file:line it comes from")
    engine_opt(p)
    p.set_defaults(func=cmd_check)

    p = add_command(sub, "test", COMMANDS["test"],
                    epilog="Without PATHS: ./rules when it exists, " + FALLBACK)
    p.add_argument("paths", nargs="*", metavar="PATHS", help="RuleTest files or directories holding them")
    p.add_argument("-v", "--verbose", action="store_true", help="list passing cases too")
    p.add_argument("--require-coverage", action="store_true", help="fail when a rule is not exercised by any case")
    p.add_argument("--min-coverage", type=_percent, metavar="P",
                   help="fail (exit 1) when fewer than P percent of the rules and tiers under test are exercised by some case")
    p.add_argument("--format", choices=["text", "json", "junit"], default="text",
                   help="text (default), json, or junit (JUnit XML for CI test reports)")
    engine_opt(p)
    p.set_defaults(func=cmd_test)

    p = add_command(sub, "eval", COMMANDS["eval"])
    p.add_argument("--policy", help="policy profile file (default: the one dharma.yaml names)")
    p.add_argument("--tool", help="tool name of the call (without it: only whom --principal, --api-key or --local-user resolves to)")
    p.add_argument("--args", help="arguments as a JSON object (or @file)")
    p.add_argument("--principal", help="principal id from the policy (default: an anonymous one, and no grant check)")
    p.add_argument("--api-key", metavar="KEY",
                   help="judge as the principal this API key resolves to, as the gateway would resolve it "
                        "(`-`: read the key from stdin, keeping it out of the shell history)")
    p.add_argument("--local-user", metavar="USER", help="judge as the principal this local user resolves to (as `dharma stdio` would)")
    p.add_argument("--annotations", help="tool annotations as a JSON object (or @file)")
    p.add_argument("--purpose", help="the call's stated purpose")
    p.add_argument("--disclosure-mode", help="the call's disclosure_mode")
    p.add_argument("--depth", help="the call's depth (e.g. deep), for escalation conditions")
    p.add_argument("--response", help="a backend response (JSON or @file) to run the disclosure rules on")
    p.add_argument("--explain", action="store_true", help="show every rule considered and the values that decided it")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    engine_opt(p)
    p.set_defaults(func=cmd_eval)

    p = add_command(sub, "schema", COMMANDS["schema"])
    p.add_argument("--kind", help="only this kind (Policy, RuleSet, DisclosureRuleSet, RuleTest)")
    p.set_defaults(func=cmd_schema)
