"""The policy author's loop: whole-policy tests (`dharma test` with a profile, principals, rate
limits, coverage, JUnit and JSON), `dharma eval`'s pipeline headline, the author lints of `dharma
check`, and what a rule that matched by error tells the caller, the log and the ledger."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from xml.etree import ElementTree


from tests.helpers import Recorder, all_logs, open_gateway, text_result, write_policy
from tests.test_cli import dharma

PROFILE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: shop}
principals:
  - {id: ops, tier: operator}
tiers:
  - name: reader
    max_sensitivity: SENSITIVE
    grants: [{tools: ["read_*", "search"]}]
  - name: operator
    inherits: reader
    grants: [{tools: ["git_*", "pay_*"]}]
  - name: unused
    grants: [{tools: ["nothing"]}]
sensitivity:
  - {tools: ["pay_*"], level: SENSITIVE}
rate_limits:
  - {id: two-searches, key: [principal], tools: ["search"], rate: 1, per_seconds: 60, burst: 2}
rule_sets: [rules.yaml]
"""

RULES = """\
apiVersion: dharma/v1
kind: RuleSet
metadata: {name: shop-rules}
rules:
  - id: no-force-push
    tools: ["git_push"]
    when: 'has(args.force) && args.force == true'
    effect: deny
    message: force pushes are not allowed
  - id: confirm-payments
    tools: ["pay_*"]
    when: 'has(args.amount) && args.amount > 100'
    effect: require_approval
    message: payments above 100 need a human
  - id: never-fires
    tools: ["read_*"]
    when: 'has(args.path) && args.path == "/never"'
    effect: deny
"""

TEST = """\
apiVersion: dharma/v1
kind: RuleTest
metadata: {name: shop-whole}
policy: profile.yaml
principals:
  - {id: rita, tier: reader}
cases:
  - name: a reader cannot push
    call: {tool: git_push, principal: rita}
    expect: {status: blocked, error_code: tool_not_found, message: "Unknown tool"}
  - name: the operator may push
    call: {tool: git_push, principal: ops, args: {branch: main}}
    expect: {status: ok, decision: allow}
  - name: but not force-push
    call: {tool: git_push, principal: ops, args: {force: true}}
    expect: {status: blocked, error_code: policy_blocked, rules: [no-force-push], message: force pushes}
  - name: a payment needs a purpose
    call: {tool: pay_invoice, principal: ops, args: {amount: 5}}
    expect: {error_code: purpose_required}
  - name: a large payment is held for a human
    call: {tool: pay_invoice, principal: ops, args: {amount: 500}, purpose: invoice 7}
    expect: {status: pending_approval, error_code: approval_required, rules: [confirm-payments]}
  - name: the third search in a burst is rate limited
    call: {tool: search, principal: rita, args: {q: x}, prior_calls: 2}
    expect: {status: blocked, error_code: rate_limited}
"""


def suite(tmp_path: Path, test: str = TEST) -> Path:
    (tmp_path / "profile.yaml").write_text(PROFILE)
    (tmp_path / "rules.yaml").write_text(RULES)
    path = tmp_path / "shop_test.yaml"
    path.write_text(test)
    return path


def test_whole_policy_cases_are_decided_by_the_pipeline(tmp_path):
    run = dharma("test", suite(tmp_path), "-v", state_root=tmp_path / "state")
    assert run.rc == 0, run.out
    assert run.out.count("PASS") == 6
    # tiers: reader and operator were used by a case, `unused` was not; never-fires never matched
    assert "not exercised: tier unused" in run.out and "not exercised: never-fires" in run.out
    assert "2/3 rules exercised, 2/3 tiers; coverage 66.7%" in run.out


def test_a_wrong_expectation_fails_with_what_differs(tmp_path):
    wrong = TEST.replace("expect: {status: blocked, error_code: tool_not_found, message: \"Unknown tool\"}",
                         "expect: {status: ok, message: pushed}")
    run = dharma("test", suite(tmp_path, wrong), state_root=tmp_path / "state")
    assert run.rc == 1
    assert "FAIL" in run.out and "status: expected ok, got blocked" in run.out
    assert "message: expected it to contain 'pushed', got 'Unknown tool: git_push'" in run.out


def test_min_coverage_gates_the_exit_code(tmp_path):
    path = suite(tmp_path)
    below = dharma("test", path, "--min-coverage", "80", state_root=tmp_path / "state")
    assert below.rc == 1 and "coverage 66.7% is below --min-coverage 80%" in below.out
    assert "not exercised: never-fires" in below.out and "not exercised: tier unused" in below.out
    above = dharma("test", path, "--min-coverage", "60", state_root=tmp_path / "state")
    assert above.rc == 0
    bad = dharma("test", path, "--min-coverage", "150", state_root=tmp_path / "state")
    assert bad.rc == 2 and "percentage from 0 to 100" in bad.err


def test_junit_and_json_reports(tmp_path):
    wrong = TEST.replace("expect: {status: ok, decision: allow}", "expect: {status: blocked}")
    path = suite(tmp_path, wrong)
    junit = dharma("test", path, "--format", "junit", state_root=tmp_path / "state")
    assert junit.rc == 1
    root = ElementTree.fromstring(junit.out.encode())
    assert root.tag == "testsuites" and root.get("tests") == "6" and root.get("failures") == "1"
    [testsuite] = root.findall("testsuite")
    assert testsuite.get("name") == "shop-whole" and len(testsuite.findall("testcase")) == 6
    failed = [c for c in testsuite.findall("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["the operator may push"]
    assert "status: expected blocked, got ok" in failed[0].find("failure").get("message")
    assert failed[0].get("file", "").endswith("shop_test.yaml") and failed[0].get("line") == "11"
    report = json.loads(dharma("test", path, "--format", "json", state_root=tmp_path / "state").out)
    assert report["passed"] == 5 and report["failed"] == 1 and report["coverage"] == 66.67
    assert [r["id"] for r in report["rules"]["unexercised"]] == ["never-fires"]
    assert [t["name"] for t in report["tiers"]["unexercised"]] == ["unused"]
    assert all(c["whole_pipeline"] for c in report["cases"])


def test_rules_naming_a_profile_is_an_error_at_its_line(tmp_path):
    suite(tmp_path)
    (tmp_path / "bad_test.yaml").write_text(textwrap.dedent("""\
        apiVersion: dharma/v1
        kind: RuleTest
        metadata: {name: bad}
        rules:
          - profile.yaml
        cases:
          - name: anything
            call: {tool: read_file}
            expect: {decision: allow}
        """))
    run = dharma("test", tmp_path / "bad_test.yaml", state_root=tmp_path / "state")
    assert run.rc == 1
    assert f"{tmp_path / 'bad_test.yaml'}:5: error: rules: profile.yaml holds a `kind: Policy` document" in run.out
    assert "name it in `policy:`" in run.out


def test_a_case_naming_a_principal_needs_a_profile_that_has_it(tmp_path):
    unknown = TEST.replace("principal: rita}\n    expect: {status: blocked, error_code: tool_not_found",
                           "principal: nobody}\n    expect: {status: blocked, error_code: tool_not_found")
    run = dharma("test", suite(tmp_path, unknown), state_root=tmp_path / "state")
    assert run.rc == 1 and "principal 'nobody' is not in the profile (its principals: ops, rita)" in run.out


def test_eval_shows_the_pipeline_decision_first(tmp_path):
    suite(tmp_path)
    run = dharma("eval", "--policy", tmp_path / "profile.yaml", "--tool", "git_push", "--principal", "ops",
                 "--args", '{"force": true}', state_root=tmp_path / "state")
    assert run.rc == 0
    assert run.out.splitlines()[0] == "pipeline: blocked policy_blocked at dharma_rules: force pushes are not allowed"
    tmp_profile = PROFILE.replace("  - {id: ops, tier: operator}", "  - {id: ops, tier: operator}\n  - {id: rita, tier: reader}")
    (tmp_path / "profile.yaml").write_text(tmp_profile)
    hidden = dharma("eval", "--policy", tmp_path / "profile.yaml", "--tool", "git_push", "--principal", "rita",
                    "--args", '{"force": true}', "--json", state_root=tmp_path / "state")
    report = json.loads(hidden.out)
    assert report["pipeline"]["error_code"] == "tool_not_found" and report["pipeline"]["stage"] == "tool_visibility"
    assert report["decision"] == "deny"  # the rules alone would deny; the live gateway says tool_not_found


LINTED = """\
apiVersion: dharma/v1
kind: RuleSet
metadata: {name: linted}
rules:
  - id: nested
    tools: ["deploy"]
    when: 'args.target.env == "prod"'
    effect: deny
  - id: nested-guarded
    tools: ["deploy"]
    when: 'has(args.target.env) && args.target.env == "prod"'
    effect: deny
  - id: claims
    tools: ["deploy"]
    when: 'principal.claims.team != "sre"'
    effect: deny
  - id: annotations
    tools: ["deploy"]
    when: 'tool.annotations.destructiveHint == true'
    effect: require_approval
  - id: brackets
    tools: ["deploy"]
    when: 'args["region"] == "eu"'
    effect: deny
  - id: bare-field
    tools: ["deploy"]
    when: 'args.force'
    effect: deny
  - id: typo-glob
    tools: ["deplyo", "deploy"]
    when: 'has(args.x) && args.x == 1'
    effect: deny
"""


def test_check_lints_what_bites(tmp_path):
    (tmp_path / "linted.yaml").write_text(LINTED)
    (tmp_path / "tools.json").write_text(json.dumps({"tools": [{"name": "deploy"}, {"name": "status"}]}))
    run = dharma("check", tmp_path / "linted.yaml", "--tools", tmp_path / "tools.json", state_root=tmp_path / "state")
    out = run.out
    assert run.rc == 0, out  # warnings only
    assert "[nested] warning: `args.target` is read without `has(args.target)`" in out
    assert "[nested-guarded]" not in out
    assert "[claims] warning: `principal.claims.team` is read without" in out
    assert "[annotations] warning: `tool.annotations.destructiveHint` is read without" in out
    assert "[brackets] warning: `args.region` is read without" in out
    assert "[bare-field] warning: `when` is a bare field (args.force)" in out
    assert "[typo-glob] warning: tool glob(s) 'deplyo' match no tool in --tools" in out
    (tmp_path / "literal.yaml").write_text(LINTED.replace("when: 'args.force'", "when: '\"yes\"'"))
    literal = dharma("check", tmp_path / "literal.yaml", state_root=tmp_path / "state")
    assert literal.rc == 1 and "[bare-field] error: `when` is a literal" in literal.out


def test_check_reads_the_pins_for_tool_globs(tmp_path):
    (tmp_path / "linted.yaml").write_text(LINTED)
    state = tmp_path / "state"
    state.mkdir()
    (state / "mcp-pins.json").write_text(json.dumps({"version": 1, "backends": {"fs": {
        "deploy": {"digest": "d", "definition": {"name": "deploy"}, "pinned_at": "2026-01-01T00:00:00Z"}}}}))
    run = dharma("check", tmp_path / "linted.yaml", state_root=state)
    assert "[typo-glob] warning: tool glob(s) 'deplyo' match no tool in the pins (1 known)" in run.out


UNGUARDED = {"call.yaml": """\
    apiVersion: dharma/v1
    kind: RuleSet
    metadata: {name: call}
    rules:
      - id: no-etc
        tools: ["read_file"]
        when: 'args.path.startsWith("/etc")'
        effect: deny
        message: no /etc
    """}


async def test_a_rule_matched_by_error_says_so_everywhere_without_leaking_the_engine_error(tmp_path, monkeypatch):
    from gateway.stages import dharma_rules
    from tests.test_replay import TIERS
    from audit.query import query_records
    from audit.sqlite import SqliteLedgerReader

    recorder = Recorder()
    backend = recorder.backend({"read_file": lambda file=None: text_result("x")})
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, TIERS, UNGUARDED), [backend])
    try:
        with all_logs(monkeypatch, dharma_rules) as logs:
            outcome = await gateway.call("read_file", {"file": "a.txt"}, api_key="alice-key")
    finally:
        await gateway.aclose()
    assert recorder.calls == []
    assert outcome.message == "rule no-etc could not evaluate its condition (missing field args.path); refused to be safe"
    assert "KeyError" not in outcome.message and "no such member" not in outcome.message
    warned = [e for e in logs if e["event"] == "rule.matched_by_error"]
    assert warned and warned[0]["rule"] == "no-etc" and warned[0]["log_level"] == "warning"
    with SqliteLedgerReader(tmp_path / "ledger.db") as reader:
        [record] = [r for r in query_records(reader) if r.get("tool") == "read_file"]
    assert record["matched_by_error"] == ["no-etc"] and record["decision"] == "deny"
