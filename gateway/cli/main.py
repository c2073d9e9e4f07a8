"""`dharma`: the operator's, policy author's and auditor's command line.

Thin: parse arguments, call library functions, print. Exit codes (contract): 0 success, 1 a
check failed (lint error, failing test, tampered ledger, invalid receipt), 2 usage or
configuration error. Never a traceback for bad input. The auditor's commands (`audit`,
`approvals`, `keys`, `receipt`) are in `gateway.cli.audit`; `stdio` and `tools` in `gateway.mcp`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from gateway.config import PACKAGE_ROOT, Settings, load_settings
from audit.errors import LedgerError
from gateway.core.errors import ConfigError, GatewayError, PolicyErrors

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "state_root", None):
        overrides["state_root"] = str(args.state_root)
    if getattr(args, "policy", None):
        overrides["policy"] = str(Path(args.policy).resolve())
    if getattr(args, "ledger", None):
        overrides["ledger"] = {"path": str(Path(args.ledger).resolve())}
    return load_settings(getattr(args, "config", None), os.environ, overrides)


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{what}: cannot read {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} (column {exc.colno})") from None


def _json_object_arg(text: str | None, what: str) -> dict[str, Any]:
    value = _json_arg(text, what)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{what} must be a JSON object like '{{\"path\": \"a.txt\"}}', not {type(value).__name__}")
    return value
def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


# ---- policy author ------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from gateway.policy.compile import compile_documents, load_policy, load_rule_documents
    from gateway.policy.load import expand_paths, read_documents
    from gateway.policy.models import Policy

    paths = [Path(p) for p in args.paths] or [PACKAGE_ROOT / "policies", PACKAGE_ROOT / "rules"]
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
        _out(str(item))
    for item in sorted(set(warnings)):
        _out(str(item))
    _out(f"{len(files)} file(s) checked: {len(set(problems))} error(s), {len(set(warnings))} warning(s)")
    return EXIT_FAILED if problems else EXIT_OK


def cmd_test(args: argparse.Namespace) -> int:
    from gateway.policy.testing import run_tests

    paths = [Path(p) for p in args.paths] or [PACKAGE_ROOT / "rules"]
    try:
        report = run_tests(paths, engine=args.engine)
    except PolicyErrors as exc:
        for item in exc.problems:
            _out(str(item))
        return EXIT_FAILED
    if not report.cases:
        _out("no RuleTest cases found")
        return EXIT_FAILED
    for case in report.cases:
        if not case.passed or args.verbose:
            _out(f"{'PASS' if case.passed else 'FAIL'} {case.file} {case.name}")
            for failure in case.failures:
                _out(f"     {failure}")
    passed = len(report.cases) - len(report.failed)
    for rule_id in report.unexercised:
        _out(f"not exercised: {rule_id} ({report.rules[rule_id]})")
    _out(f"{passed} passed, {len(report.failed)} failed; {len(report.rules) - len(report.unexercised)}/{len(report.rules)} rules exercised")
    if report.failed or (args.require_coverage and report.unexercised):
        return EXIT_FAILED
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    from gateway.policy.compile import load_policy
    from gateway.policy.models import CaseCall
    from gateway.policy.testing import deciding_values, evaluate_case
    from gateway.stages.tier_gate import is_granted
    from gateway.core.call import Principal

    policy_path = Path(args.policy) if args.policy else _settings(args).policy
    policy = load_policy(policy_path, engine=args.engine)
    principal: dict[str, Any] = {"id": "eval", "tier": None, "roles": []}
    if args.principal:
        found = next((p for p in policy.principals if p.id == args.principal), None)
        if found is None:
            raise UsageError(f"principal {args.principal!r} is not in {policy_path}")
        principal = {"id": found.id, "tier": found.tier, "roles": list(found.roles), "claims": found.claims}
    call = CaseCall(
        tool=args.tool,
        args=_json_object_arg(args.args, "--args"),
        principal=principal,
        annotations=_json_object_arg(args.annotations, "--annotations"),
        purpose=args.purpose,
        disclosure_mode=args.disclosure_mode,
        depth=args.depth,
    )
    result = evaluate_case(policy, call, _json_arg(args.response, "--response"))
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
        _out(json.dumps(report, indent=2, default=str))
        return EXIT_OK
    _out(f"decision: {report['decision']}{'' if d.enforced else ' (not enforced: audit/warn mode)'}")
    if granted is not None:
        _out(f"granted to {principal['id']} (tier {principal['tier']}): {'yes' if granted else 'no — the tool is hidden from them'}")
    _out(f"sensitivity: {report['sensitivity']}")
    if report["findings"]:
        _out("findings: " + ", ".join(f"{f['kind']} at {f['path']}" for f in report["findings"]))
    if d.message:
        _out(f"message: {d.message}")
    if report["block_class"]:
        _out(f"block_class: {report['block_class']}  error_code: {report['error_code']}")
    if report["disclosure"]:
        _out(f"disclosure: {report['disclosure']}")
    if args.explain:
        rules = {r.id: r for r in policy.all_rules()}
        _out(f"rules considered for {call.tool}: {len(result.trace)} of {len(rules)}")
        for t in result.trace:
            rule = rules[t.rule_id]
            why = f"error: {t.error} → counts as {'a match' if t.matched else 'no match'}" if t.error else f"condition = {json.dumps(t.value, default=str)}"
            _out(f"  {'MATCH' if t.matched else '     '} {t.rule_id} [{t.effect}, {t.mode}] {rule.file}:{rule.line}")
            _out(f"         when: {rule.when.source if rule.when else '(always)'}")
            for path, value in deciding_values(rule.when.source if rule.when else "", result.variables).items():
                _out(f"         {path} = {json.dumps(value, default=str)}")
            _out(f"         {why}")
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
    _out(json.dumps(schema, indent=2, sort_keys=True))
    return EXIT_OK


# ---- serve --------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.logging import configure_logging
    from gateway.runtime import open_gateway, require_policy, serve_announced
    from gateway.transports.http_api.app import build_app

    settings = _settings(args)
    require_policy(settings)
    configure_logging(settings.log_level)
    host = args.host or settings.server.host
    port = args.port if args.port is not None else settings.server.port

    async def main() -> None:
        gateway = await open_gateway(settings)

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            try:
                yield
            finally:
                # Runs in uvicorn's shutdown, before it re-raises a captured SIGTERM (which would
                # otherwise kill the process before the ledger writer and backends are closed).
                await gateway.aclose()

        app = build_app(gateway, max_body_bytes=settings.server.max_body_bytes, lifespan=lifespan)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        try:
            await serve_announced(server, gateway)
        except SystemExit:  # uvicorn exits 1 when it cannot listen; that is a configuration error
            raise ConfigError(f"cannot serve on {host}:{port} (the address is in use or not available)") from None
        finally:
            await gateway.aclose()

    asyncio.run(main())
    return EXIT_OK


# ---- parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dharma", description="Dharma Gateway: governed tool calls.")
    parser.add_argument("--config", type=Path, help="dharma.yaml (default: $DHARMA_CONFIG)")
    parser.add_argument("--state-root", help="runtime state directory (default: $DHARMA_STATE_ROOT or ~/.dharma)")
    sub = parser.add_subparsers(dest="command", required=True)

    def engine_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--engine", choices=["cel-python", "common-expression-language"], help="CEL engine (default: fastest installed)")

    p = sub.add_parser("serve", help="serve the HTTP front (tool API, approvals, JWKS)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--policy", help="policy profile to load")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("check", help="validate policy and rule files")
    p.add_argument("paths", nargs="*")
    engine_opt(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("test", help="run RuleTest cases and report rules no case exercised")
    p.add_argument("paths", nargs="*")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--require-coverage", action="store_true", help="fail when a rule is not exercised")
    engine_opt(p)
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("eval", help="dry-run one call against a policy and explain the decision")
    p.add_argument("--policy")
    p.add_argument("--tool", required=True)
    p.add_argument("--args", help="arguments as JSON (or @file)")
    p.add_argument("--principal", help="principal id from the policy")
    p.add_argument("--annotations", help="tool annotations as JSON")
    p.add_argument("--purpose")
    p.add_argument("--disclosure-mode")
    p.add_argument("--depth")
    p.add_argument("--response", help="a backend response (JSON or @file) to run the disclosure rules on")
    p.add_argument("--explain", action="store_true", help="show every rule considered and the values that decided it")
    p.add_argument("--json", action="store_true")
    engine_opt(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("schema", help="print the JSON Schema of the policy files")
    p.add_argument("--kind")
    p.set_defaults(func=cmd_schema)

    from gateway.cli import audit as cli_audit  # `dharma audit|approvals|keys` and `dharma receipt`

    cli_audit.add_parsers(sub)

    from gateway.mcp import register_cli  # `dharma stdio` and `dharma tools pins|accept`

    register_cli(sub, _settings)
    cli_audit.add_receipt_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and EXIT_USAGE
    from gateway.logging import configure_logging

    configure_logging("warning")  # on stderr: stdout carries the command's output (JSON, JWKS, ...)
    try:
        return int(args.func(args))
    except PolicyErrors as exc:
        for item in exc.problems:
            sys.stderr.write(f"{item}\n")
        return EXIT_USAGE
    except (ConfigError, UsageError) as exc:
        sys.stderr.write(f"dharma: {exc}\n")
        return EXIT_USAGE
    except GatewayError as exc:
        sys.stderr.write(f"dharma: {exc}\n")
        return EXIT_USAGE
    except LedgerError as exc:  # a ledger that cannot be opened or read as one
        sys.stderr.write(f"dharma: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
