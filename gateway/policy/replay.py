"""Replay recorded calls under a candidate policy, and summarise shadow (audit-mode) rules' verdicts.

`dharma replay` re-decides each recorded `tools/call` from its ledger record (the sanitized
arguments with secrets redacted, the principal, tool, purpose, session and time) with the whole
pipeline's deciding stages (`gateway.policy.whole`): nothing is forwarded, nothing is written to
the ledger and no shared store is touched. How the parts that depend on other calls are treated:

* rate limits are simulated: a fresh in-memory limiter sees the replayed calls in record order
  at their recorded times (from full buckets at the first one);
* the session history and karma that sequence rules read are rebuilt from the replay's own
  decisions (calls before `--since` are not seen);
* approvals: a call the candidate would hold is "would-hold"; a recorded approval outcome
  (required, denied, timed out) counts as held before;
* tool annotations come from the pinned definitions when given, else none.

The report counts what would change, per rule and per principal, with example record numbers.
A record whose redacted fields a deciding rule reads is flagged: the secret it held is gone, so
that rule's outcome in replay may differ from what the real value would give.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.core.call import Principal, ToolCall, ToolInfo
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.policy.whole import Decider, decide_call, verdict_of
from gateway.stores.memory import SessionHistory

VERDICTS = ("deny", "hold", "allow")
EXAMPLES = 5
"""Example record numbers kept per (key, change)."""
TREATMENT = {
    "rate_limits": "simulated: a fresh in-memory limiter sees the replayed calls in record order at their recorded times",
    "session_history": "rebuilt from this replay's own decisions (calls before --since are not seen)",
    "approvals": "a call the candidate would hold is would-hold; a recorded approval outcome counts as held before",
    "arguments": "as recorded: sanitized, secrets redacted (flagged where a deciding rule reads a redacted field)",
}
HELD_CODES = frozenset({ErrorCode.APPROVAL_REQUIRED.value, ErrorCode.APPROVAL_DENIED.value, ErrorCode.APPROVAL_TIMEOUT.value})


def recorded_verdict(record: Mapping[str, Any]) -> str:
    """`deny`, `hold` or `allow`: what the recorded call's caller got from the policy."""
    if record.get("status") == "pending_approval" or record.get("error_code") in HELD_CODES:
        return "hold"
    if record.get("status") == "blocked":
        return "deny"
    return "allow"


def change_name(verdict: str) -> str:
    return f"would-{verdict}"


@dataclass(slots=True)
class Tally:
    """How many calls changed one way for one key (rule or principal), with a few examples."""

    count: int = 0
    examples: list[int] = field(default_factory=list)
    redacted: list[int] = field(default_factory=list)  # examples whose deciding rule reads a redacted field

    def add(self, seq: int, redacted: bool) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(seq)
        if redacted and len(self.redacted) < EXAMPLES:
            self.redacted.append(seq)


@dataclass(slots=True)
class ChangeReport:
    """What would change (replay) or what shadow rules would have done (audit shadow)."""

    considered: int = 0
    changed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    by_rule: dict[str, dict[str, Tally]] = field(default_factory=dict)
    by_principal: dict[str, dict[str, Tally]] = field(default_factory=dict)
    flagged: list[dict[str, Any]] = field(default_factory=list)  # records whose redacted fields a deciding rule reads
    treatment: dict[str, str] = field(default_factory=dict)

    def add(self, seq: int, change: str, principal: str, rules: Iterable[str], redacted: bool) -> None:
        self.changed += 1
        for rule in dict.fromkeys(rules):
            self.by_rule.setdefault(rule, {}).setdefault(change, Tally()).add(seq, redacted)
        self.by_principal.setdefault(principal, {}).setdefault(change, Tally()).add(seq, redacted)

    def flag(self, seq: int, fields: list[str]) -> None:
        """Record `seq`: a rule that decides it reads these fields, which the ledger holds redacted."""
        self.flagged.append({"seq": seq, "fields": fields})

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def as_json(self) -> dict[str, Any]:
        def table(rows: dict[str, dict[str, Tally]]) -> dict[str, Any]:
            return {
                key: {change: {"count": t.count, "examples": t.examples, "redacted_examples": t.redacted}
                      for change, t in sorted(changes.items())}
                for key, changes in sorted(rows.items())
            }

        return {
            "considered": self.considered,
            "changed": self.changed,
            "skipped": dict(sorted(self.skipped.items())),
            "by_rule": table(self.by_rule),
            "by_principal": table(self.by_principal),
            "redacted_reads": self.flagged,
            "treatment": self.treatment,
        }

    def lines(self, title: str) -> list[str]:
        """The text report."""
        out = [f"{title}: {self.considered} call(s) considered, {self.changed} would change"]
        for why, n in sorted(self.skipped.items()):
            out.append(f"  skipped {n}: {why}")
        for heading, rows in (("per rule", self.by_rule), ("per principal", self.by_principal)):
            if not rows:
                continue
            out.append(f"{heading}:")
            for key, changes in sorted(rows.items()):
                parts = []
                for change, t in sorted(changes.items()):
                    flag = f"; {len(t.redacted)} read redacted fields" if t.redacted else ""
                    parts.append(f"{change} {t.count} (e.g. #{', #'.join(map(str, t.examples))}{flag})")
                out.append(f"  {key}: " + "; ".join(parts))
        if self.flagged:
            out.append(f"{len(self.flagged)} call(s) have redacted fields a rule for their tool reads (the real value "
                       "may decide otherwise):")
        for item in self.flagged[:EXAMPLES]:
            out.append(f"  #{item['seq']}: {', '.join(item['fields'])}")
        for what, how in self.treatment.items():
            out.append(f"{what.replace('_', ' ')}: {how}")
        return out


_READ = re.compile(r"\bargs((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\s*(?:\"[^\"]*\"|'[^']*')\s*\])+)")


def args_paths_read(source: str) -> list[str]:
    """The `args` paths an expression reads, as `a.b` (`args["a"].b` included)."""
    paths = []
    for match in _READ.finditer(source):
        parts = re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*[\"']([^\"']*)[\"']\s*\]", match.group(1))
        if source[match.end():].lstrip().startswith("("):
            parts = parts[:-1]  # a method call: its receiver is what is read
        if parts:
            paths.append(".".join(a or b for a, b in parts))
    return list(dict.fromkeys(paths))


def redacted_paths(record: Mapping[str, Any]) -> list[str]:
    """The argument paths the ledger stores redacted (from the record's `kind@$.path` findings)."""
    found = []
    for item in record.get("findings") or ():
        if isinstance(item, str) and "@$." in item:
            found.append(item.split("@$.", 1)[1])
    return found


def redacted_reads(policy: CompiledPolicy, rule_ids: Iterable[str], redacted: list[str]) -> list[str]:
    """`args.x` fields both redacted in the record and read by one of `rule_ids`' conditions."""
    if not redacted:
        return []
    hits = []
    for rule_id in rule_ids:
        rule = policy.rule(rule_id)
        source = rule.when.source if rule is not None and rule.when is not None else ""
        for read in args_paths_read(source):
            for path in redacted:
                if path == read or path.startswith(read + ".") or read.startswith(path + "."):
                    hits.append(f"args.{read} ({rule_id})")
    return list(dict.fromkeys(hits))


def record_time(record: Mapping[str, Any]) -> float | None:
    text = record.get("time")
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text).timestamp()
    except ValueError:
        return None


def principal_of(policy: CompiledPolicy, record: Mapping[str, Any]) -> Principal | None:
    """The recorded caller under the candidate policy: its principal of that id, else (a JWT
    caller) the recorded tier if the candidate has it, else nobody (unauthenticated)."""
    pid = record.get("principal")
    if not isinstance(pid, str):
        return None
    found = next((p for p in policy.principals if p.id == pid), None)
    if found is not None:
        return Principal(found.id, found.tier, found.roles, dict(found.claims))
    tier = record.get("tier")
    return Principal(pid, tier) if isinstance(tier, str) and tier in policy.tiers else None


async def replay(
    policy: CompiledPolicy,
    records: Iterable[Mapping[str, Any]],
    definitions: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
) -> ChangeReport:
    """Re-decide `records` (ledger call rows, oldest first) under `policy`; see the module doc.

    `definitions` maps (backend, tool) to a pinned tool definition (its annotations are used).
    """
    report = ChangeReport(treatment=dict(TREATMENT))
    decider = Decider()
    history = SessionHistory()
    pins = definitions or {}
    for record in records:
        if record.get("kind") not in (None, "decision", "outcome"):
            continue  # approval events, reloads: not calls
        seq = int(record.get("seq") or 0)
        at = record_time(record)
        tool_name = record.get("tool")
        if record.get("method", "tools/call") != "tools/call" or not isinstance(tool_name, str) or at is None:
            report.skip("not a governed tools/call record")
            continue
        if record.get("dry_run"):
            report.skip("dry runs")
            continue
        report.considered += 1
        principal = principal_of(policy, record)
        backend = record.get("backend") if isinstance(record.get("backend"), str) else "default"
        definition = pins.get((backend, tool_name), {})
        unknown = record.get("error_code") == ErrorCode.TOOL_NOT_FOUND.value and not definition and record.get("backend") is None
        annotations = definition.get("annotations") if isinstance(definition.get("annotations"), dict) else {}
        tool = None if unknown else ToolInfo(name=tool_name, backend=backend, annotations=dict(annotations))
        call = ToolCall(
            tool=tool_name, arguments=record.get("args") or {}, request_id=str(record.get("request_id") or f"replay-{seq}"),
            purpose=record.get("purpose"), session_id=record.get("session_id"),
        )
        session, karma = ([], {}) if principal is None else await history.read(call.session_id, principal.id, at)
        decided = await decide_call(decider, policy, call, principal, tool, at=at, session=session, karma=karma)
        if principal is not None:
            await history.record(session_id=call.session_id, principal=principal.id, tool=tool_name,
                                 decision=decided.decision.effect.value, denied=decided.decision.blocks, now=at,
                                 time=str(record.get("time")))
        now_rules = [m.rule_id for m in (decided.rules_decision.matched if decided.rules_decision else ())]
        was_rules = [r for r in record.get("matched_rules") or () if isinstance(r, str)]
        candidates = [r.id for r in policy.rules_for(tool_name)]
        reads = redacted_reads(policy, [*candidates, *was_rules], redacted_paths(record))
        if reads:
            report.flag(seq, reads)
        before, after = recorded_verdict(record), verdict_of(decided.decision)
        if before == after:
            continue
        if after == "allow":
            deciding = was_rules or [f"(stage {record.get('stage') or 'unknown'})"]
        elif decided.decision.stage in ("dharma_rules", "approval") and now_rules:
            deciding = now_rules
        else:
            deciding = [f"(stage {decided.decision.stage or 'unknown'})"]
        report.add(seq, change_name(after), str(record.get("principal")), deciding, bool(reads))
    return report


def shadow_report(records: Iterable[Mapping[str, Any]], shadow_rules: set[str] | None = None) -> ChangeReport:
    """What shadow (audit- or warn-mode) rules would have done to live traffic: the recorded
    decisions that were not enforced (`enforced: false`), per rule and per principal.

    `shadow_rules`, when known (the current policy's non-enforcing rules), narrows each record's
    matched rules to those; else every matched rule of the record is named.
    """
    report = ChangeReport(treatment={"source": "recorded decisions with enforced=false (would-deny / would-hold)"})
    for record in records:
        if record.get("kind") not in (None, "outcome", "decision"):
            continue
        report.considered += 1
        if record.get("enforced") is not False or record.get("decision") not in ("deny", "require_approval"):
            continue
        change = "would-deny" if record["decision"] == "deny" else "would-hold"
        rules = [r for r in record.get("matched_rules") or () if isinstance(r, str)]
        if shadow_rules is not None:
            rules = [r for r in rules if r in shadow_rules] or rules
        report.add(int(record.get("seq") or 0), change, str(record.get("principal")), rules, False)
    return report
