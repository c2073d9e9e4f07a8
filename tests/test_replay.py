"""`dharma replay` and `dharma audit shadow` over a real SQLite ledger of calls the gateway recorded.

The calls go through a real Gateway (real policy files, real ledger, real keys); the commands run
as the `dharma` CLI in a subprocess and their JSON and text reports are checked against the
records' own sequence numbers.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from audit.query import call_rows, query_records
from audit.sqlite import SqliteLedgerReader
from audit.verify import verify_ledger
from tests.helpers import Recorder, open_gateway, text_result, write_policy
from tests.test_cli import dharma

TIERS = """\
tiers:
  - name: reader
    grants:
      - tools: ["read_*", "search"]
  - name: writer
    inherits: reader
    grants:
      - tools: ["write_*"]
"""

V1 = {
    "call.yaml": """\
        apiVersion: dharma/v1
        kind: RuleSet
        metadata: {name: call}
        rules:
          - id: no-traversal
            tools: ["read_*", "write_*"]
            when: 'has(args.path) && args.path.contains("..")'
            effect: deny
          - id: audit-big-reads
            tools: ["read_*"]
            when: 'has(args.path) && args.path.endsWith(".big")'
            effect: deny
            mode: audit
        """,
}

CANDIDATE_RULES = """\
apiVersion: dharma/v1
kind: RuleSet
metadata: {name: candidate}
rules:
  - id: deny-big-reads
    tools: ["read_*"]
    when: 'has(args.path) && args.path.endsWith(".big")'
    effect: deny
  - id: confirm-important-writes
    tools: ["write_*"]
    when: 'has(args.path) && args.path.startsWith("important/")'
    effect: require_approval
  - id: no-tokens-in-content
    tools: ["write_*"]
    when: 'has(args.content) && args.content.contains("ghp_")'
    effect: deny
"""

CANDIDATE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: candidate}
principals:
  - {id: alice, tier: reader}
  - {id: bob, tier: writer}
tiers:
  - name: reader
    grants:
      - tools: ["read_*", "search"]
  - name: writer
    inherits: reader
    grants:
      - tools: ["write_*"]
rate_limits:
  - {id: one-search, key: [principal], tools: ["search"], rate: 1, per_seconds: 3600, burst: 1}
rule_sets: [candidate-rules.yaml]
"""

TOKEN = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"


@pytest.fixture
async def recorded(tmp_path: Path) -> dict[str, int]:
    """A ledger of eight calls under V1; returns each call's record number (its outcome row's seq) by label."""
    recorder = Recorder()
    backend = recorder.backend({
        "read_file": lambda path: text_result(f"contents of {path}"),
        "write_file": lambda path, content="": text_result(f"wrote {path}"),
        "search": lambda query: text_result(f"results for {query}"),
    })
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, TIERS, V1), [backend])
    calls = [
        ("plain-read", "read_file", {"path": "a.txt"}, "alice-key"),
        ("big-read", "read_file", {"path": "x.big"}, "alice-key"),
        ("important-write", "write_file", {"path": "important/plan.md", "content": "v2"}, "bob-key"),
        ("token-write", "write_file", {"path": "notes.md", "content": f"token {TOKEN}"}, "bob-key"),
        ("traversal", "read_file", {"path": "../etc/passwd"}, "alice-key"),
        ("search-1", "search", {"query": "q1"}, "alice-key"),
        ("search-2", "search", {"query": "q2"}, "alice-key"),
        ("hidden-write", "write_file", {"path": "a.txt"}, "alice-key"),
    ]
    try:
        for label, tool, arguments, key in calls:
            await gateway.call(tool, arguments, api_key=key, request_id=f"req-{label}")
    finally:
        await gateway.aclose()
    (tmp_path / "candidate.yaml").write_text(CANDIDATE)
    (tmp_path / "candidate-rules.yaml").write_text(CANDIDATE_RULES)
    with SqliteLedgerReader(tmp_path / "ledger.db") as reader:
        assert verify_ledger(reader).ok
        rows = list(call_rows(reader, query_records(reader), show="calls"))
    return {row["request_id"].removeprefix("req-"): row["seq"] for row in rows if row.get("request_id")}


def replay_json(tmp_path: Path, *extra: str) -> dict:
    run = dharma("replay", "--policy", tmp_path / "candidate.yaml", "--ledger", tmp_path / "ledger.db",
                 "--format", "json", *extra, state_root=tmp_path / "state")
    assert run.rc == 0, run.err
    return json.loads(run.out)


async def test_replay_reports_what_the_candidate_would_change_per_rule_and_principal(tmp_path, recorded):
    seq = recorded
    report = replay_json(tmp_path)
    assert report["considered"] == 8
    by_rule, by_principal = report["by_rule"], report["by_principal"]
    assert by_rule["deny-big-reads"] == {"would-deny": {"count": 1, "examples": [seq["big-read"]], "redacted_examples": []}}
    assert by_rule["confirm-important-writes"]["would-hold"]["examples"] == [seq["important-write"]]
    assert by_rule["no-traversal"]["would-allow"]["examples"] == [seq["traversal"]]  # the rule the candidate dropped
    # rate limits are simulated at the recorded times: the second search within the hour is refused
    assert by_rule["(stage rate_limiter)"]["would-deny"]["examples"] == [seq["search-2"]]
    assert by_principal["alice"]["would-deny"]["count"] == 2 and by_principal["alice"]["would-allow"]["count"] == 1
    assert by_principal["bob"] == {"would-hold": {"count": 1, "examples": [seq["important-write"]], "redacted_examples": []}}
    assert report["changed"] == 4  # the plain read, the token write, search-1 and the hidden write do not change
    # the token was redacted in the ledger, so the candidate's token rule cannot see it: flagged, not silently allowed
    assert report["redacted_reads"] == [{"seq": seq["token-write"], "fields": ["args.content (no-tokens-in-content)"]}]
    assert "rate_limits" in report["treatment"] and "session_history" in report["treatment"]


async def test_replay_windows_and_text_report(tmp_path, recorded):
    with SqliteLedgerReader(tmp_path / "ledger.db") as reader:
        times = {r["request_id"]: r["time"] for r in call_rows(reader, query_records(reader)) if r.get("request_id")}
    report = replay_json(tmp_path, "--since", times["req-traversal"])
    assert report["considered"] == 4  # traversal, both searches, the hidden write
    assert set(report["by_rule"]) == {"no-traversal", "(stage rate_limiter)"}
    report = replay_json(tmp_path, "--until", times["req-big-read"])
    assert report["considered"] == 1 and report["changed"] == 0
    run = dharma("replay", "--policy", tmp_path / "candidate.yaml", "--ledger", tmp_path / "ledger.db",
                 state_root=tmp_path / "state")
    assert run.rc == 0
    assert "8 call(s) considered, 4 would change" in run.out
    assert f"deny-big-reads: would-deny 1 (e.g. #{recorded['big-read']})" in run.out
    assert "rate limits: simulated" in run.out


async def test_replay_refuses_bad_input_with_a_clear_error(tmp_path, recorded):
    bad = tmp_path / "broken.yaml"
    bad.write_text("apiVersion: dharma/v1\nkind: Policy\nmetadata: {name: b}\nrule_sets: [nowhere.yaml]\n")
    run = dharma("replay", "--policy", bad, "--ledger", tmp_path / "ledger.db", state_root=tmp_path / "state")
    assert run.rc == 2 and "rule set not found: nowhere.yaml" in run.err + run.out
    run = dharma("replay", "--policy", tmp_path / "candidate.yaml", "--ledger", tmp_path / "none.db", state_root=tmp_path / "state")
    assert run.rc == 2 and "no ledger there" in run.err + run.out
    run = dharma("replay", "--policy", tmp_path / "candidate.yaml", "--since", "yesterday", state_root=tmp_path / "state")
    assert run.rc == 2 and "not an RFC 3339 time" in run.err


async def test_audit_shadow_reports_the_audit_mode_rules_would_deny(tmp_path, recorded):
    run = dharma("audit", "shadow", "--ledger", tmp_path / "ledger.db", "--format", "json",
                 "--config", _config(tmp_path), state_root=tmp_path / "state")
    assert run.rc == 0, run.err
    report = json.loads(run.out)
    assert report["by_rule"] == {"audit-big-reads": {"would-deny": {"count": 1, "examples": [recorded["big-read"]], "redacted_examples": []}}}
    assert report["by_principal"]["alice"]["would-deny"]["count"] == 1
    text = dharma("audit", "shadow", "--ledger", tmp_path / "ledger.db", "--since", "2000-01-01T00:00:00Z",
                  "--config", _config(tmp_path), state_root=tmp_path / "state")
    assert text.rc == 0 and f"audit-big-reads: would-deny 1 (e.g. #{recorded['big-read']})" in text.out


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "dharma.yaml"
    config.write_text(textwrap.dedent(f"""\
        policy: {tmp_path / 'policy.yaml'}
        """))
    return config
