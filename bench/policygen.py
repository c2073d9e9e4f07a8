"""Generated, realistic policies for the benchmarks: ~50 tool names, rules spread over them.

Rules use the shapes real rule sets use (tool globs: exact names, prefix/suffix globs and a few
`*`; conditions over args, findings, principal and session, always guarded with has()). The
same seed gives the same files, so runs are comparable.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import yaml

from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

OPERATOR_KEY = "bench-operator-key"
STANDARD = Path(__file__).resolve().parent.parent / "policies" / "standard.yaml"

TOOLS: tuple[str, ...] = (
    "read_file", "read_multiple_files", "write_file", "edit_file", "create_directory", "list_directory",
    "directory_tree", "move_file", "search_files", "get_file_info", "delete_file", "run_command",
    "run_script", "execute_sql", "exec_python", "shell", "bash", "http_get", "http_post", "fetch_url",
    "send_email", "send_slack_message", "create_issue", "update_issue", "close_issue", "list_issues",
    "get_issue", "search_docs", "search_web", "query_db", "db_insert", "db_update", "db_delete", "kv_get",
    "kv_put", "s3_get_object", "s3_put_object", "s3_delete_object", "k8s_apply", "k8s_delete",
    "k8s_get_pods", "git_commit", "git_push", "git_diff", "git_log", "calendar_create_event",
    "calendar_list_events", "payment_refund", "payment_charge", "health_record_read", "patient_lookup",
)  # fmt: skip

SUFFIX_GLOBS = ("*_file", "*_files", "*_issue", "*_object", "*_event", "*_command")


def _globs(rng: random.Random) -> list[str]:
    roll = rng.random()
    if roll < 0.02:
        return ["*"]
    out: list[str] = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.random()
        tool = rng.choice(TOOLS)
        if kind < 0.55:
            out.append(tool)
        elif kind < 0.9:
            out.append(tool.split("_", 1)[0] + "_*")
        else:
            out.append(rng.choice(SUFFIX_GLOBS))
    return list(dict.fromkeys(out))


def _condition(rng: random.Random, i: int) -> str:
    shape = rng.randrange(12)
    if shape == 0:
        tok = rng.choice(("..", "/etc/", ".ssh/", f"secret{i}", "~/.aws", f"/proc/{i}"))
        return f'has(args.path) && args.path.contains("{tok}")'
    if shape == 1:
        return f'has(args.path) && args.path.startsWith("/var/lib/app{i}/")'
    if shape == 2:
        verb = rng.choice(("rm", "dd", "mkfs", "shutdown", "curl", "chmod"))
        return f'has(args.command) && args.command.matches("(^|[;&| ]){verb}{i % 10}?\\\\s+-[a-z]*f")'
    if shape == 3:
        kind = rng.choice(("api_key", "private_key", "payment_card"))
        return f'findings.exists(f, f.kind == "{kind}" && f.path.startsWith("$.field{i}"))'
    if shape == 4:
        return f'principal.tier == "contractor{i}"'
    if shape == 5:
        return f'has(args.url) && args.url.startsWith("http://10.{i % 256}.")'
    if shape == 6:
        return f"has(args.query) && size(args.query) > {2000 + i}"
    if shape == 7:
        return f'"{rng.choice(TOOLS)}" in session.tools && principal.tier == "guest{i}"'
    if shape == 8:
        return f"has(args.amount) && type(args.amount) == int && args.amount > {100000 + i}"
    if shape == 9:
        return f'has(args.to) && args.to.endsWith("@competitor{i}.example")'
    if shape == 10:
        return f'principal.roles.exists(r, r == "intern{i}") && tool.name.startsWith("delete")'
    return f'has(args.branch) && args.branch == "release-{i}" && !("approver" in principal.roles)'


def rules_document(count: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed * 1_000_003 + count)
    rules = []
    for i in range(count):
        roll = rng.random()
        rule: dict[str, Any] = {"id": f"gen-{i:04d}", "tools": _globs(rng), "when": _condition(rng, i)}
        if roll < 0.80:
            rule.update(effect="deny", message=f"generated rule {i} denies this call")
        elif roll < 0.88:
            rule.update(effect="require_approval", message=f"generated rule {i} needs a human")
        elif roll < 0.94:
            rule.update(effect="warn", message=f"generated rule {i} warns")
        else:
            rule.update(effect="deny", mode="audit", message=f"generated rule {i} would deny")
        rules.append(rule)
    return {"apiVersion": "dharma/v1", "kind": "RuleSet", "metadata": {"name": f"generated-{count}"}, "rules": rules}


def profile_document(rule_files: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "dharma/v1",
        "kind": "Policy",
        "metadata": {"name": "bench"},
        "principals": [
            {"id": "bench-operator", "tier": "operator", "roles": ["engineer"],
             "api_key_sha256": hashlib.sha256(OPERATOR_KEY.encode()).hexdigest()},
            {"id": "bench-reader", "tier": "reader",
             "api_key_sha256": hashlib.sha256(b"bench-reader-key").hexdigest()},
        ],
        "tiers": [
            {"name": "reader", "max_sensitivity": "SENSITIVE",
             "grants": [{"tools": ["read_*", "list_*", "get_*", "search*"]}]},
            {"name": "operator", "inherits": "reader", "max_sensitivity": "RESTRICTED", "grants": [{"tools": ["*"]}]},
        ],
        "sensitivity": [
            {"tools": ["health_*", "patient_*", "payment_*"], "level": "RESTRICTED"},
            {"tools": ["search*"], "level": "STANDARD",
             "escalate": [{"when": '(has(args.depth) && args.depth == "deep") || request.depth == "deep"',
                           "to": "SENSITIVE", "message": "deep search reads whole documents"}]},
        ],
        "rule_sets": rule_files,
    }


def write_generated_policy(directory: Path, count: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rules.yaml").write_text(yaml.safe_dump(rules_document(count), sort_keys=False), encoding="utf-8")
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(profile_document(["rules.yaml"]), sort_keys=False), encoding="utf-8")
    return path


# ---- the calls and the backend ------------------------------------------------------

_STR = {"type": "string"}

#: (tool, arguments, purpose): a mix of ordinary calls, one traversal and one leaked secret.
CALL_MIX: tuple[tuple[str, dict[str, Any], str | None], ...] = (
    ("read_file", {"path": "src/app/main.py"}, None),
    ("write_file", {"path": "notes/todo.md", "content": "- ship the bench\n- write the docs\n"}, None),
    ("list_directory", {"path": "src"}, None),
    ("run_command", {"command": "ls -la build && make test"}, None),
    ("execute_sql", {"query": "SELECT id, name FROM users WHERE id = 42"}, None),
    ("http_get", {"url": "https://api.example.com/v1/items?page=2"}, None),
    ("send_email", {"to": "alice@example.com", "subject": "Weekly report", "body": "Numbers attached."}, None),
    ("search_docs", {"query": "rate limiter burst", "depth": "shallow"}, None),
    ("s3_put_object", {"bucket": "reports", "key": "2024/q3.csv", "body": "a,b\n1,2\n"}, None),
    ("git_push", {"remote": "origin", "branch": "main"}, None),
    ("payment_refund", {"order_id": "ord_123", "amount": 1999}, "customer asked for a refund"),
    ("k8s_apply", {"manifest": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"}, None),
    ("create_issue", {"title": "Bench regression", "body": "p99 went up", "labels": ["perf", "bench"]}, None),
    ("read_file", {"path": "../../etc/passwd"}, None),
    ("write_file", {"path": "cfg.env", "content": "AWS_ACCESS_KEY_ID=AKIAZ3MSJV4W7QYHRT5N\n"}, None),
    ("kv_get", {"key": "feature-flags"}, None),
)

TOOL_PROPERTIES: dict[str, dict[str, Any]] = {
    "amount": {"type": "integer"},
    "labels": {"type": "array", "items": _STR},
}


def input_schema(tool: str) -> dict[str, Any]:
    """A plain object schema over the properties the call mix sends to `tool`."""
    props: dict[str, Any] = {}
    for name, args, _ in CALL_MIX:
        if name == tool:
            for key in args:
                props[key] = TOOL_PROPERTIES.get(key, _STR)
    return {"type": "object", "properties": props}


def small_result(**_: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "ok: 3 items"}], "structuredContent": {"items": 3}}


def backend(tools: tuple[str, ...] = TOOLS) -> CallableBackend:
    """An in-process backend serving every tool with a small fixed result."""
    return CallableBackend(
        "bench", {t: (small_result, ToolSpec(t, f"{t} (bench)", input_schema(t))) for t in tools}
    )


def standard_document(principal: dict[str, Any], profile: Path = STANDARD) -> tuple[dict[str, Any], list[str]]:
    """A shipped profile (the standard one unless given) as a document for a benchmark: `principal`
    listed first (it wins over the profile's `local_user: "*"`), rate limits raised so the limiter's
    cost is measured without throttling, rule sets resolved to absolute paths; returns it and the
    rule sets missing."""
    doc = yaml.safe_load(profile.read_text(encoding="utf-8"))
    for limit in doc.get("rate_limits", []):
        limit.update(rate=1_000_000_000, burst=1_000_000_000, per_seconds=1)
    refs = list(doc.get("rule_sets", []))
    present = [r for r in refs if (profile.parent / r).resolve().exists()]
    doc["rule_sets"] = [str((profile.parent / r).resolve()) for r in present]
    doc["principals"] = [principal, *doc.get("principals", [])]
    return doc, [r for r in refs if r not in present]
