"""Fill a fresh ledger through `SqliteLedger.append` with many concurrent appenders.

Entries have the shape Gateway._record_and_sign writes (same keys, realistic values); the
principal cycles over `PRINCIPALS` names and `time` advances evenly from `START` so a time
window selects a predictable slice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from audit.sqlite import SqliteLedger

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


async def fill(
    path: Path,
    total: int,
    *,
    callers: int = 256,
    synchronous: str = "NORMAL",
    batch_max: int = 256,
    stop_if: Callable[[int, float], bool] | None = None,
) -> tuple[int, float]:
    """Append `total` entries (fewer if `stop_if(done, elapsed)` says so); return (count, seconds)."""
    ledger = await SqliteLedger.open(path, synchronous=synchronous, batch_max=batch_max)  # type: ignore[arg-type]
    done = 0
    stop = False
    t0 = time.perf_counter()

    async def worker(w: int) -> None:
        nonlocal done, stop
        for i in range(w, total, callers):
            if stop:
                return
            await ledger.append(entry(i, total))
            done += 1
            if stop_if is not None and done % 10_000 == 0 and stop_if(done, time.perf_counter() - t0):
                stop = True

    try:
        await asyncio.gather(*(worker(w) for w in range(callers)))
    finally:
        await ledger.aclose()
    return done, time.perf_counter() - t0
