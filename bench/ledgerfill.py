"""The entries the ledger benchmarks record (`ledger_append` appends them, `bench.ledgerbulk` bulk-loads them).

Entries have the shape Gateway._record_and_sign writes (same keys, realistic values); the
principal cycles over `PRINCIPALS` names and `time` advances evenly from `START` so a time
window selects a predictable slice.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

PRINCIPALS = 100
START = datetime(2025, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=30)
TOOLS = ("read_file", "write_file", "run_command", "search_docs", "http_get", "execute_sql", "send_email", "git_push")
DECISIONS = ("allow", "allow", "allow", "allow", "allow", "allow", "deny", "warn", "require_approval", "allow")


def entry(i: int, total: int) -> dict[str, Any]:
    at = START + SPAN * (i / max(1, total))
    decision = DECISIONS[i % len(DECISIONS)]
    tool = TOOLS[i % len(TOOLS)]
    return {
        "time": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "request_id": f"req_{i:016x}",
        "principal": f"user-{i % PRINCIPALS:03d}",
        "tier": "operator",
        "backend": "bench",
        "tool": tool,
        "method": "tools/call",
        "session_id": f"sess-{i // 50:07d}",
        "args_digest": f"sha256:{i:064x}",
        "args": {"path": f"src/module_{i % 997}/file_{i % 31}.py"},
        "findings": [],
        "decision": decision,
        "enforced": True,
        "matched_rules": [] if decision == "allow" else ["fs-no-traversal"],
        "block_class": "safety_content" if decision == "deny" else None,
        "stage": "dharma_rules" if decision != "allow" else None,
        "sensitivity": "STANDARD",
        "purpose": None,
        "disclosure": None,
        "policy_version": "sha256:" + "ab" * 16,
        "approval_id": None,
        "idempotency_key": None,
        "response_digest": f"sha256:{(i * 7919) % (1 << 64):064x}",
        "status": "blocked" if decision in ("deny", "require_approval") else "ok",
        "error_code": "policy_blocked" if decision == "deny" else None,
        "latency_us": 420,
        "tool_digest": "sha256:" + "cd" * 32,
        "dry_run": False,
    }

