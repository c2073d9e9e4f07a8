"""The entries the ledger benchmarks record (`ledger_append` appends them, `bench.ledgerbulk` bulk-loads them).

Entries have the shape Gateway._record_and_sign writes (same keys, realistic values); the
principal cycles over `PRINCIPALS` names and `time` advances evenly from `START` so a time
window selects a predictable slice.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from audit.canon import canonical_bytes
from audit.records import encode_entry, index_fields, rule_ids

PRINCIPALS = 100
START = datetime(2025, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=30)
TOOLS = ("read_file", "write_file", "run_command", "search_docs", "http_get", "execute_sql", "send_email", "git_push")
DECISIONS = ("allow", "allow", "allow", "allow", "allow", "allow", "deny", "warn", "require_approval", "allow")
POLICY_VERSION = "sha256:" + "ab" * 16
RULE = "fs-no-traversal"


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
        "matched_rules": [] if decision == "allow" else [RULE],
        "block_class": "safety_content" if decision == "deny" else None,
        "stage": "dharma_rules" if decision != "allow" else None,
        "sensitivity": "STANDARD",
        "purpose": None,
        "disclosure": None,
        "policy_version": POLICY_VERSION,
        "approval_id": None,
        "idempotency_key": None,
        "response_digest": f"sha256:{(i * 7919) % (1 << 64):064x}",
        "status": "blocked" if decision in ("deny", "require_approval") else "ok",
        "error_code": "policy_blocked" if decision == "deny" else None,
        "latency_us": 420,
        "tool_digest": "sha256:" + "cd" * 32,
        "dry_run": False,
    }



_SLOTS = ("time", "request_id", "principal", "tool", "session_id", "args_digest", "path", "decision",
          "matched_rules", "block_class", "stage", "response_digest", "status", "error_code")


def _template() -> bytes:
    """The canonical bytes of `entry` with a %s slot for each value that varies (JSON text goes in)."""
    marked: dict[str, Any] = entry(0, 1) | {slot: f"@@{slot}@@" for slot in _SLOTS if slot != "path"}
    marked["args"] = {"path": "@@path@@"}
    text = canonical_bytes(marked).replace(b"%", b"%%")
    for slot in _SLOTS:
        text = text.replace(b'"@@%s@@"' % slot.encode(), b"%s")
    order = sorted(_SLOTS, key=lambda slot: canonical_bytes(marked).index(b"@@%s@@" % slot.encode()))
    if tuple(order) != _ORDER:
        raise RuntimeError(f"bench.ledgerfill: the entry's keys sort as {order}, not as encoded_entry fills them")
    return text


def _by_decision(decision: str) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes]:
    """JSON text of the decision-dependent values, in template order (see `entry`)."""
    e = entry(DECISIONS.index(decision), 10**9)
    return tuple(canonical_bytes(e[slot]) for slot in ("block_class", "decision", "error_code", "matched_rules",
                                                       "stage", "status"))  # type: ignore[return-value]


# The slots in the order they appear in the canonical (key-sorted) bytes.
_ORDER = ("path", "args_digest", "block_class", "decision", "error_code", "matched_rules", "principal",
                   "request_id", "response_digest", "session_id", "stage", "status", "time", "tool")
_TEMPLATE = _template()
_DECIDED = {d: _by_decision(d) for d in set(DECISIONS)}


def encoded_entry(i: int, total: int) -> tuple[bytes, tuple[str | None, ...], tuple[str, ...]]:
    """What `encode_entry(entry(i, total))`, `index_fields` and `rule_ids` give for entry i, from a
    template (about 10x faster than building and canonicalising the dict; `check_encoding` compares).

    Returns (canonical entry bytes, the `IndexFields` values in order, rule ids)."""
    at = _time(i, total)
    decision = DECISIONS[i % len(DECISIONS)]
    block_class, decision_json, error_code, rules, stage, status = _DECIDED[decision]
    request_id = "req_%016x" % i
    principal = "user-%03d" % (i % PRINCIPALS)
    tool = TOOLS[i % len(TOOLS)]
    body = _TEMPLATE % (
        b'"src/module_%d/file_%d.py"' % (i % 997, i % 31), b'"sha256:%064x"' % i, block_class, decision_json,
        error_code, rules, b'"%s"' % principal.encode(), b'"%s"' % request_id.encode(),
        b'"sha256:%064x"' % ((i * 7919) % (1 << 64)), b'"sess-%07d"' % (i // 50), stage, status, b'"%s"' % at.encode(),
        b'"%s"' % tool.encode(),
    )
    status_text = "blocked" if decision in ("deny", "require_approval") else "ok"
    fields = (at, principal, tool, decision, status_text, request_id, POLICY_VERSION)
    return body, fields, (RULE,) if decision != "allow" else ()


_SPAN_US = SPAN // timedelta(microseconds=1)
_DAY_US = 86_400_000_000


def _time(i: int, total: int) -> str:
    """`entry`'s time, with integer arithmetic: timedelta * float rounds half to even to a microsecond."""
    a, b = (i / max(1, total)).as_integer_ratio()
    q, r = divmod(_SPAN_US * a, b)
    if 2 * r > b or (2 * r == b and q & 1):
        q += 1
    day, us = divmod(q, _DAY_US)
    seconds, us = divmod(us, 1_000_000)
    minutes, seconds = divmod(seconds, 60)
    return "%sT%02d:%02d:%02d.%06dZ" % (_date(day), minutes // 60, minutes % 60, seconds, us)


@functools.cache
def _date(day: int) -> str:
    return (START + timedelta(days=day)).strftime("%Y-%m-%d")


def check_encoding(total: int, sample: range | list[int]) -> None:
    """Raise AssertionError unless `encoded_entry` gives exactly the real encoder's bytes, columns and rules."""
    for i in sample:
        e = entry(i, total)
        body, fields, rules = encoded_entry(i, total)
        assert body == encode_entry(e, ledger="bulk load"), f"entry {i}: template bytes differ from encode_entry"
        assert fields == dataclasses.astuple(index_fields(e)), f"entry {i}: columns differ from index_fields"
        assert rules == rule_ids(e), f"entry {i}: rules differ from rule_ids"
