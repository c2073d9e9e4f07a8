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
    COMMANDS, EXIT_FAILED, EXIT_OK, UsageError, add_command, json_arg, json_object_arg, out, settings_of,
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
    for file in files:
        try:
            docs = read_documents(file)
        except PolicyErrors as exc:
            problems.extend(exc.problems)
            continue
        if any(isinstance(d.model, Policy) for d in docs):
            try:
                compiled = load_policy(file, engine=args.engine)
                warnings.extend(compiled.warnings)
            except PolicyErrors as exc:
                problems.extend(exc.problems)
        else:
            rule_files.append(file)
    if rule_files:
        try:
            warnings.extend(compile_documents(load_rule_documents(rule_files), engine=args.engine).warnings)
        except PolicyErrors as exc:
            problems.extend(exc.problems)
    for item in sorted(set(problems)):
        out(str(item))
    for item in sorted(set(warnings)):
        out(str(item))
    out(f"{len(files)} file(s) checked: {len(set(problems))} error(s), {len(set(warnings))} warning(s)")
    return EXIT_FAILED if problems else EXIT_OK


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
    for case in report.cases:
        if not case.passed or args.verbose:
            out(f"{'PASS' if case.passed else 'FAIL'} {case.file} {case.name}")
            for failure in case.failures:
                out(f"     {failure}")
    passed = len(report.cases) - len(report.failed)
    for rule_id in report.unexercised:
        out(f"not exercised: {rule_id} ({report.rules[rule_id]})")
    out(f"{passed} passed, {len(report.failed)} failed; {len(report.rules) - len(report.unexercised)}/{len(report.rules)} rules exercised")
    if report.failed or (args.require_coverage and report.unexercised):
        return EXIT_FAILED
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    from gateway.policy.compile import load_policy
    from gateway.policy.models import CaseCall
    from gateway.policy.testing import deciding_values, evaluate_case
    from gateway.stages.tier_gate import is_granted
    from gateway.core.call import Principal

    policy_path = Path(args.policy) if args.policy else settings_of(args).policy
    policy = load_policy(policy_path, engine=args.engine)
    principal: dict[str, Any] = {"id": "eval", "tier": None, "roles": []}
    if args.principal:
        found = next((p for p in policy.principals if p.id == args.principal), None)
        if found is None:
            raise UsageError(f"principal {args.principal!r} is not in {policy_path}")
        principal = {"id": found.id, "tier": found.tier, "roles": list(found.roles), "claims": found.claims}
    call = CaseCall(
        tool=args.tool,
        args=json_object_arg(args.args, "--args"),
        principal=principal,
        annotations=json_object_arg(args.annotations, "--annotations"),
        purpose=args.purpose,
        disclosure_mode=args.disclosure_mode,
        depth=args.depth,
    )
    result = evaluate_case(policy, call, json_arg(args.response, "--response"))
    annotations = policy.annotations_for(call.tool, call.annotations)
    granted = is_granted(policy, Principal(principal["id"], principal["tier"]), call.tool, annotations) if args.principal else None
    d = result.decision
    report: dict[str, Any] = {
        "policy": policy.name,
        "policy_version": policy.version,
        "engine": policy.engine,
        "tool": call.tool,
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
    }
    if args.explain:
        sources = {r.id: (r.when.source if r.when else "") for r in policy.all_rules()}
        report["considered"] = [
            {"rule": t.rule_id, "effect": t.effect, "mode": t.mode, "value": t.value, "error": t.error, "matched": t.matched,
             "inputs": deciding_values(sources[t.rule_id], result.variables)}
            for t in result.trace
        ]
    if args.json:
        out(json.dumps(report, indent=2, default=str))
        return EXIT_OK
    out(f"decision: {report['decision']}{'' if d.enforced else ' (not enforced: audit/warn mode)'}")
    if granted is not None:
        out(f"granted to {principal['id']} (tier {principal['tier']}): {'yes' if granted else 'no — the tool is hidden from them'}")
    out(f"sensitivity: {report['sensitivity']}")
    if report["findings"]:
        out("findings: " + ", ".join(f"{f['kind']} at {f['path']}" for f in report["findings"]))
    if d.message:
        out(f"message: {d.message}")
    if report["block_class"]:
        out(f"block_class: {report['block_class']}  error_code: {report['error_code']}")
    if report["disclosure"]:
        out(f"disclosure: {report['disclosure']}")
    if args.explain:
        rules = {r.id: r for r in policy.all_rules()}
        out(f"rules considered for {call.tool}: {len(result.trace)} of {len(rules)}")
        for t in result.trace:
            rule = rules[t.rule_id]
            why = f"error: {t.error} → counts as {'a match' if t.matched else 'no match'}" if t.error else f"condition = {json.dumps(t.value, default=str)}"
            out(f"  {'MATCH' if t.matched else '     '} {t.rule_id} [{t.effect}, {t.mode}] {rule.file}:{rule.line}")
            out(f"         when: {rule.when.source if rule.when else '(always)'}")
            for path, value in deciding_values(rule.when.source if rule.when else "", result.variables).items():
                out(f"         {path} = {json.dumps(value, default=str)}")
            out(f"         {why}")
    return EXIT_OK


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
    engine_opt(p)
    p.set_defaults(func=cmd_check)

    p = add_command(sub, "test", COMMANDS["test"],
                    epilog="Without PATHS: ./rules when it exists, " + FALLBACK)
    p.add_argument("paths", nargs="*", metavar="PATHS", help="RuleTest files or directories holding them")
    p.add_argument("-v", "--verbose", action="store_true", help="list passing cases too")
    p.add_argument("--require-coverage", action="store_true", help="fail when a rule is not exercised by any case")
    engine_opt(p)
    p.set_defaults(func=cmd_test)

    p = add_command(sub, "eval", COMMANDS["eval"])
    p.add_argument("--policy", help="policy profile file (default: the one dharma.yaml names)")
    p.add_argument("--tool", required=True, help="tool name of the call")
    p.add_argument("--args", help="arguments as a JSON object (or @file)")
    p.add_argument("--principal", help="principal id from the policy (default: an anonymous one, and no grant check)")
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
