"""Shared fixtures for the karma ledger tests: entries, ledgers on real SQLite files."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.sqlite import SqliteLedger

PRINCIPALS = ("alice", "bob", "carol")
TOOLS = ("fs.read", "fs.write", "http.get", "shell.exec")
DECISIONS = ("allow", "deny", "require_approval")


def make_entry(i: int) -> dict[str, Any]:
    """A realistic entry; fields cycle so every filter has several matches."""
    return {
        "time": f"2026-11-22T01:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000000:06d}Z",
        "request_id": f"req-{i}",
        "principal": PRINCIPALS[i % 3],
        "backend": "demo",
        "tool": TOOLS[i % 4],
        "args_digest": f"{i:064x}",
        "args": {"path": f"/tmp/file-{i}", "note": "héllo ✓"},
        "decision": DECISIONS[i % 3],
        "enforced": i % 5 != 0,
        "matched_rules": [f"rule-{i % 2}", "rule-all"] if i % 2 else [],
        "block_class": None,
        "policy_version": f"pv-{i // 50}",
        "approval_id": f"apr-{i % 3}" if i % 11 == 5 else None,
        "response_digest": None,
        "status": "ok" if i % 7 else "error",
        "error_code": None if i % 7 else "backend_error",
        "latency_ms": i % 13 + 0.5,
        "tool_digest": "ab" * 32,
    }


@pytest.fixture
def entry() -> Callable[[int], dict[str, Any]]:
    return make_entry


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "karma.db"


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
async def ledger(ledger_path: Path) -> AsyncIterator[SqliteLedger]:
    opened = await SqliteLedger.open(ledger_path)
    yield opened
    await opened.aclose()


async def fill(ledger: SqliteLedger, count: int, start: int = 0) -> None:
    """Append `count` generated entries, concurrently."""
    import asyncio

    await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(start, start + count)))


def attacker(path: Path) -> sqlite3.Connection:
    """A raw connection by someone with file access who drops the append-only triggers."""
    conn = sqlite3.connect(path, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    return conn
