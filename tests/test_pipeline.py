"""The governed call end to end in process: real policy files, real SQLite ledger, real keys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from audit.errors import LedgerError
from audit.query import query_records
from audit.records import Appended
from audit.sqlite import SqliteLedger, SqliteLedgerReader
from audit.verify import verify_ledger
from gateway.core.call import Status
from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway, envelope
from gateway.crypto.receipts import KeyStore, ReceiptInvalid, verify_receipt
from gateway.policy.compile import load_policy
from tests.helpers import Recorder, open_gateway, text_result, write_policy

TIERS = """\
tiers:
  - name: reader
    max_sensitivity: SENSITIVE
    grants:
      - tools: ["read_*", "search"]
      - annotations: {readOnlyHint: true}
  - name: writer
    inherits: reader
    grants:
      - tools: ["write_*", "health_*", "shell"]
sensitivity:
  - tools: ["health_*"]
    level: RESTRICTED
  - tools: ["search"]
    level: STANDARD
    escalate:
      - when: 'has(args.depth) && args.depth == "deep"'
        to: SENSITIVE
"""

RULES = {
    "call.yaml": """\
        apiVersion: dharma/v1
        kind: RuleSet
        metadata: {name: call}
        rules:
          - id: no-traversal
            tools: ["read_*", "write_*"]
            when: 'args.path.contains("..")'
            effect: deny
            message_expr: '"path leaves the sandbox: " + args.path'
          - id: no-secrets
            tools: ["*"]
            when: 'findings.exists(f, f.kind == "api_key" || f.kind == "private_key")'
            effect: deny
            message: arguments carry a secret
          - id: confirm-writes
            tools: ["write_*"]
            when: 'has(args.path) && args.path.startsWith("important/")'
            effect: require_approval
            message: writes to important/ need a human
          - id: audit-big-reads
            tools: ["read_*"]
            when: 'has(args.path) && args.path.endsWith(".big")'
            effect: deny
            mode: audit
          - id: warn-tmp
            tools: ["write_*"]
            when: 'has(args.path) && args.path.startsWith("tmp/")'
            effect: warn
            message: tmp/ is wiped nightly
          - id: redact-card
            tools: ["write_*"]
            when: 'findings.exists(f, f.kind == "payment_card")'
            effect: redact
          - id: no-shell-after-read
            tools: ["shell"]
            when: '"read_secret_file" in session.tools'
            effect: deny
            message: no shell after reading secrets in this session
          - id: karma-brake
            tools: ["shell"]
            when: 'principal.karma.denials >= 3'
            effect: deny
            message: too many denials lately
          - id: allow-errors-do-not-allow
            tools: ["shell"]
            when: 'args.missing == 1'
            effect: allow
        """,
    "disclosure.yaml": """\
        apiVersion: dharma/v1
        kind: DisclosureRuleSet
        metadata: {name: disclosure}
        no_information_response: {"content": [{"type": "text", "text": "No matching records found."}]}
        rules:
          - id: health-withhold
            tools: ["health_*"]
            when: 'request.disclosure_mode != "direct"'
            verdict: WITHHOLD
          - id: secrets-redact
            tools: ["*"]
            when: 'size(response.findings) > 0'
            verdict: REDACT
            redact_secrets: true
        """,
}


def tools(recorder: Recorder):
    return recorder.backend(
        {
            "read_file": lambda path: text_result(f"contents of {path}"),
            "read_secret_file": lambda path: text_result("nothing here"),
            "write_file": lambda path, content="": text_result(f"wrote {path}"),
            "search": lambda query, depth="shallow": text_result(f"results for {query}"),
            "health_records": lambda patient_id: text_result("No matching records found.")
            if patient_id == "none"
            else text_result(f"record of {patient_id}: hypertension"),
            "shell": lambda command="", missing=None: text_result("ran"),
            "leaky": lambda: text_result("the key is AKIAZ3MSJV4W7QYHRT5N"),
            "notes": lambda: text_result("notes"),
            "admin_only": lambda: text_result("admin"),
        },
        annotations={"notes": {"readOnlyHint": True}},
    )


@pytest.fixture
async def setup(tmp_path: Path):
    recorder = Recorder()
    profile = TIERS.replace('"shell"]', '"shell", "leaky"]')
    path = write_policy(tmp_path, profile, RULES)
    gateway = await open_gateway(tmp_path, path, [tools(recorder)])
    yield gateway, recorder, tmp_path
    await gateway.aclose()


def ledger_records(tmp: Path) -> list[dict]:
    with SqliteLedgerReader(tmp / "ledger.db") as reader:
        return list(query_records(reader))


async def test_allowed_call_is_forwarded_recorded_and_signed(setup):
    gateway, recorder, tmp = setup
    outcome = await gateway.call("read_file", {"path": "a.txt"}, api_key="alice-key")
    assert outcome.status is Status.OK
    assert outcome.result == text_result("contents of a.txt")
    assert recorder.calls == [("read_file", {"path": "a.txt"})]
    payload = verify_receipt(outcome.receipt, gateway.keys.jwks(), response=envelope(outcome), request={"tool": "read_file", "arguments": {"path": "a.txt"}})
    # two-phase: the decision record (seq 1) before the backend, the outcome record (seq 2) the receipt binds to
    assert payload["ledger"]["seq"] == outcome.ledger_seq == 2
    assert "decision" not in payload
    decided, record = ledger_records(tmp)
    assert decided["kind"] == "decision" and decided["seq"] == 1 and "status" not in decided
    assert decided["principal"] == "alice" and decided["decision"] == "allow" and decided["args"] == {"path": "a.txt"}
    assert record["kind"] == "outcome" and record["decision_seq"] == 1 and record["decision_hash"] == decided["hash"]
    assert record["request_id"] == decided["request_id"] and record["args_digest"] == decided["args_digest"]
    assert record["principal"] == "alice" and record["decision"] == "allow" and record["status"] == "ok"
    assert record["response_digest"] == payload["resp_sha256"] and record["hash"] == payload["ledger"]["hash"]
    tampered = dict(envelope(outcome), result=text_result("contents of b.txt"))
    with pytest.raises(ReceiptInvalid):
        verify_receipt(outcome.receipt, gateway.keys.jwks(), response=tampered)


async def test_deny_rule_blocks_before_the_backend_and_is_recorded(setup):
    gateway, recorder, tmp = setup
    outcome = await gateway.call("read_file", {"path": "../etc/passwd"}, api_key="alice-key")
    assert outcome.status is Status.BLOCKED
    assert outcome.error_code is ErrorCode.POLICY_BLOCKED
    assert outcome.message == "path leaves the sandbox: ../etc/passwd"
    assert recorder.calls == []
    [record] = ledger_records(tmp)
    assert record["decision"] == "deny" and record["enforced"] is True
    assert record["matched_rules"] == ["no-traversal"] and record["block_class"] == "safety_content"


async def test_cel_error_in_a_deny_rule_counts_as_a_match(setup):
    gateway, recorder, _ = setup
    # `no-traversal` reads args.path unguarded: a call without `path` errors, which denies.
    outcome = await gateway.call("read_file", {"name": "x"}, api_key="alice-key")
    assert outcome.error_code is ErrorCode.POLICY_BLOCKED
    assert outcome.message == "rule no-traversal could not evaluate its condition (missing field args.path); refused to be safe"
    assert recorder.calls == []


async def test_cel_error_in_an_allow_rule_does_not_allow_and_does_not_block(setup):
    gateway, _, _ = setup
    outcome = await gateway.call("shell", {"command": "ls"}, api_key="bob-key")
    assert outcome.status is Status.OK
    assert "allow-errors-do-not-allow" not in outcome.decision.rule_ids


async def test_audit_mode_records_would_deny_and_lets_the_call_through(setup):
    gateway, recorder, tmp = setup
    outcome = await gateway.call("read_file", {"path": "data.big"}, api_key="alice-key")
    assert outcome.status is Status.OK and recorder.calls
    assert outcome.decision.effect.value == "deny" and outcome.decision.enforced is False
    decided, record = ledger_records(tmp)  # it reached the backend: a decision record, then the outcome
    for r in (decided, record):
        assert r["decision"] == "deny" and r["enforced"] is False
        assert r["matched_rules"] == ["audit-big-reads"]
    assert decided["kind"] == "decision" and decided["matched_by_error"] == [] and record["kind"] == "outcome"


async def test_warn_rule_returns_its_message(setup):
    gateway, _, _ = setup
    outcome = await gateway.call("write_file", {"path": "tmp/x", "content": "hi"}, api_key="bob-key")
    assert outcome.status is Status.OK
    assert outcome.warnings == ("tmp/ is wiped nightly",)


async def test_deny_overrides_approval_and_warn(setup):
    gateway, _, _ = setup
    outcome = await gateway.call("write_file", {"path": "important/../x", "content": ""}, api_key="bob-key")
    assert outcome.error_code is ErrorCode.POLICY_BLOCKED
    assert set(outcome.decision.rule_ids) == {"no-traversal", "confirm-writes"}


async def test_findings_reach_rules_and_secrets_never_reach_the_ledger(setup):
    gateway, recorder, tmp = setup
    secret = "AKIAZ3MSJV4W7QYHRT5N"
    outcome = await gateway.call("search", {"query": f"key {secret}"}, api_key="alice-key")
    assert outcome.error_code is ErrorCode.POLICY_BLOCKED and outcome.decision.rule_ids == ("no-secrets",)
    assert recorder.calls == []
    raw = (tmp / "ledger.db").read_bytes()
    assert secret.encode() not in raw
    [record] = ledger_records(tmp)
    assert record["findings"] == ["api_key@$.query"]


async def test_redact_rule_rewrites_arguments_before_the_backend(setup):
    gateway, recorder, _ = setup
    outcome = await gateway.call("write_file", {"path": "cards.txt", "content": "card 4111 1111 1111 1111"}, api_key="bob-key")
    assert outcome.status is Status.OK
    [(_, sent)] = recorder.calls
    assert "4111" not in sent["content"]


async def test_hidden_tool_answers_exactly_like_an_unknown_tool(setup):
    gateway, recorder, _ = setup
    hidden = await gateway.call("write_file", {"path": "x"}, api_key="alice-key")
    unknown = await gateway.call("no_such_tool", {"path": "x"}, api_key="alice-key")
    assert hidden.error_code is unknown.error_code is ErrorCode.TOOL_NOT_FOUND

    def comparable(o, name):
        body = envelope(o)
        return {k: (v.replace(name, "T") if isinstance(v, str) else v) for k, v in body.items() if k not in ("request_id", "timestamp", "tool")}

    assert comparable(hidden, "write_file") == comparable(unknown, "no_such_tool")
    # schema errors must not leak that a hidden tool exists: bad arguments still say "unknown"
    bad = await gateway.call("write_file", ["not", "an", "object"], api_key="alice-key")
    assert bad.error_code is ErrorCode.TOOL_NOT_FOUND
    assert recorder.calls == []


async def test_tools_list_and_tools_call_come_from_the_same_decision(setup):
    gateway, _, _ = setup
    from gateway.core.call import Credentials

    for key in ("alice-key", "bob-key"):
        visible = {t.name for t in gateway.tools_for(Credentials(api_key=key))}
        for name in ("read_file", "write_file", "search", "notes", "shell", "admin_only", "health_records"):
            outcome = await gateway.call(name, {}, api_key=key, purpose="test", dry_run=True)
            assert (outcome.error_code is not ErrorCode.TOOL_NOT_FOUND) == (name in visible), (key, name)
    alice = {t.name for t in gateway.tools_for(Credentials(api_key="alice-key"))}
    assert alice == {"read_file", "read_secret_file", "search", "notes"}  # notes: granted by annotation
    assert gateway.tools_for(Credentials(api_key="wrong")) == []


async def test_unauthenticated_calls_are_refused_and_recorded(setup):
    gateway, recorder, tmp = setup
    outcome = await gateway.call("read_file", {"path": "a"}, api_key="nope")
    assert outcome.error_code is ErrorCode.UNAUTHENTICATED
    assert recorder.calls == [] and ledger_records(tmp)[0]["principal"] is None


async def test_sensitivity_needs_purpose_and_escalates_on_arguments(setup):
    gateway, _, _ = setup
    shallow = await gateway.call("search", {"query": "x"}, api_key="alice-key")
    deep = await gateway.call("search", {"query": "x", "depth": "deep"}, api_key="alice-key")
    deep_with_purpose = await gateway.call("search", {"query": "x", "depth": "deep"}, api_key="alice-key", purpose="research")
    assert shallow.status is Status.OK
    assert deep.error_code is ErrorCode.PURPOSE_REQUIRED and "SENSITIVE" in deep.message
    assert deep_with_purpose.status is Status.OK


async def test_tier_ceiling_forbids_more_sensitive_tools(tmp_path):
    recorder = Recorder()
    profile = TIERS.replace("max_sensitivity: SENSITIVE", "max_sensitivity: STANDARD")
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, profile), [tools(recorder)])
    try:
        outcome = await gateway.call("search", {"query": "x", "depth": "deep"}, api_key="alice-key", purpose="p")
        assert outcome.error_code is ErrorCode.FORBIDDEN
    finally:
        await gateway.aclose()


async def test_withheld_answer_is_indistinguishable_from_nothing_found(setup):
    gateway, _, _ = setup
    withheld = await gateway.call("health_records", {"patient_id": "p-1"}, api_key="bob-key", purpose="care")
    genuine = await gateway.call("health_records", {"patient_id": "none"}, api_key="bob-key", purpose="care", disclosure_mode="direct")
    direct = await gateway.call("health_records", {"patient_id": "p-1"}, api_key="bob-key", purpose="care", disclosure_mode="direct")
    assert direct.result == text_result("record of p-1: hypertension")

    def public(o):
        return json.dumps({k: v for k, v in envelope(o).items() if k not in ("request_id", "timestamp")}, sort_keys=True)

    assert public(withheld) == public(genuine)


async def test_unknown_disclosure_mode_is_treated_as_most_restrictive(setup):
    gateway, _, _ = setup
    outcome = await gateway.call("health_records", {"patient_id": "p-1"}, api_key="bob-key", purpose="care", disclosure_mode="DIRECT ")
    assert outcome.result == text_result("No matching records found.")


async def test_secrets_in_responses_are_redacted(setup):
    gateway, _, tmp = setup
    outcome = await gateway.call("leaky", {}, api_key="bob-key")
    assert "AKIAZ3MSJV4W7QYHRT5N" not in json.dumps(outcome.result)
    assert ledger_records(tmp)[-1]["disclosure"] == "REDACT"


async def test_session_history_feeds_sequence_rules(setup):
    gateway, _, _ = setup
    first = await gateway.call("shell", {"command": "ls"}, api_key="bob-key", session_id="s1")
    await gateway.call("read_secret_file", {"path": "s"}, api_key="bob-key", session_id="s1")
    after = await gateway.call("shell", {"command": "ls"}, api_key="bob-key", session_id="s1")
    other_session = await gateway.call("shell", {"command": "ls"}, api_key="bob-key", session_id="s2")
    assert first.status is Status.OK and other_session.status is Status.OK
    assert after.decision.rule_ids == ("no-shell-after-read",)


async def test_principal_karma_counts_denials(setup):
    gateway, _, _ = setup
    for _ in range(3):
        await gateway.call("read_file", {"path": "../x"}, api_key="bob-key")
    outcome = await gateway.call("shell", {"command": "ls"}, api_key="bob-key")
    assert outcome.decision.rule_ids == ("karma-brake",)
    assert (await gateway.call("shell", {"command": "ls"}, api_key="alice-key")).error_code is ErrorCode.TOOL_NOT_FOUND


async def test_approval_is_bound_single_use_and_expires(setup):
    gateway, recorder, _ = setup
    args = {"path": "important/plan.txt", "content": "v2"}
    held = await gateway.call("write_file", args, api_key="bob-key")
    assert held.status is Status.PENDING_APPROVAL and held.error_code is ErrorCode.APPROVAL_REQUIRED
    assert held.approval_id and recorder.calls == []
    still = await gateway.call("write_file", args, api_key="bob-key", approval_id=held.approval_id)
    assert still.error_code is ErrorCode.APPROVAL_REQUIRED
    assert [a.id for a in await gateway.pending_approvals()] == [held.approval_id]
    await gateway.approve(held.approval_id, by="op")
    other = await gateway.call("write_file", {**args, "content": "evil"}, api_key="bob-key", approval_id=held.approval_id)
    assert other.error_code is ErrorCode.APPROVAL_DENIED
    done = await gateway.call("write_file", args, api_key="bob-key", approval_id=held.approval_id)
    assert done.status is Status.OK and len(recorder.calls) == 1
    again = await gateway.call("write_file", args, api_key="bob-key", approval_id=held.approval_id)
    assert again.error_code is ErrorCode.APPROVAL_DENIED and len(recorder.calls) == 1
    denied = await gateway.call("write_file", args, api_key="bob-key")
    await gateway.deny(denied.approval_id, by="op")
    assert (await gateway.call("write_file", args, api_key="bob-key", approval_id=denied.approval_id)).error_code is ErrorCode.APPROVAL_DENIED


async def test_approval_hold_waits_for_a_human_and_times_out(tmp_path):
    recorder = Recorder()
    args = {"path": "important/a", "content": ""}
    path = write_policy(tmp_path, TIERS + "approval: {hold_seconds: 0.3}\n", RULES)
    gateway = await open_gateway(tmp_path, path, [tools(recorder)])
    try:
        timed_out = await gateway.call("write_file", args, api_key="bob-key")
        assert timed_out.error_code is ErrorCode.APPROVAL_TIMEOUT and recorder.calls == []
    finally:
        await gateway.aclose()
    # A hold long enough that a loaded machine cannot end it before the approver acts.
    (tmp_path / "long").mkdir()
    path = write_policy(tmp_path / "long", TIERS + "approval: {hold_seconds: 60}\n", RULES)
    gateway = await open_gateway(tmp_path / "long", path, [tools(recorder)])
    try:

        async def approve_when_pending():
            while not (pending := await gateway.approvals.pending(gateway.clock())):
                await asyncio.sleep(0.01)
            await gateway.approvals.decide(pending[0].id, approve=True, by="op", now=gateway.clock())

        async with asyncio.timeout(30), asyncio.TaskGroup() as tg:
            tg.create_task(approve_when_pending())
            held = await gateway.call("write_file", args, api_key="bob-key")
        assert held.status is Status.OK and len(recorder.calls) == 1
    finally:
        await gateway.aclose()


async def test_rate_limit_per_principal_with_retry_after(tmp_path):
    recorder = Recorder()
    limits = TIERS + "rate_limits:\n  - {id: tight, key: [principal], rate: 1, per_seconds: 60, burst: 2}\n"
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, limits), [tools(recorder)])
    try:
        results = [await gateway.call("read_file", {"path": "a"}, api_key="alice-key") for _ in range(3)]
        assert [r.status for r in results] == [Status.OK, Status.OK, Status.BLOCKED]
        assert results[2].error_code is ErrorCode.RATE_LIMITED and results[2].decision.retry_after > 50
        assert (await gateway.call("read_file", {"path": "a"}, api_key="bob-key")).status is Status.OK
    finally:
        await gateway.aclose()


async def test_tool_costs_weigh_on_the_limit(tmp_path):
    recorder = Recorder()
    limits = TIERS + "rate_limits:\n  - {id: tight, key: [principal], rate: 1, per_seconds: 60, burst: 3}\ntool_costs: {search: 3}\n"
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, limits), [tools(recorder)])
    try:
        assert (await gateway.call("search", {"query": "a"}, api_key="alice-key")).status is Status.OK
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).error_code is ErrorCode.RATE_LIMITED
    finally:
        await gateway.aclose()


async def test_circuit_breaker_opens_and_half_opens(tmp_path):
    recorder = Recorder()
    failures = {"n": 0}

    def flaky(path):
        failures["n"] += 1
        raise RuntimeError("disk on fire")

    backend = recorder.backend({"read_file": flaky})
    now = [1000.0]
    profile = TIERS + "circuit_breaker: {failure_threshold: 2, reset_seconds: 5}\n"
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, profile), [backend], clock=lambda: now[0])
    try:
        codes = [(await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).error_code for _ in range(3)]
        assert codes == [ErrorCode.BACKEND_ERROR, ErrorCode.BACKEND_ERROR, ErrorCode.BACKEND_UNAVAILABLE]
        assert failures["n"] == 2
        now[0] += 6
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).error_code is ErrorCode.BACKEND_ERROR
        assert failures["n"] == 3
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).error_code is ErrorCode.BACKEND_UNAVAILABLE
    finally:
        await gateway.aclose()


BLOCKED_PROBES = {
    # the first call after the reset time, and how a stage after the breaker check refuses it
    "dharma rule": (("read_file", {"path": "../etc/passwd"}, "alice-key"), ErrorCode.POLICY_BLOCKED),
    "approval": (("write_file", {"path": "important/plan"}, "bob-key"), ErrorCode.APPROVAL_REQUIRED),
    "rate limiter": (("write_file", {"path": "b"}, "bob-key"), ErrorCode.RATE_LIMITED),
}


@pytest.mark.parametrize("blocker", list(BLOCKED_PROBES))
async def test_breaker_recovers_when_the_half_open_call_is_blocked_later(tmp_path, blocker):
    """The breaker only checks before the other stages; forward admits the probe right before
    sending. A half-open call that a rule, an approval or the rate limiter then blocks must not
    leave the breaker "unavailable" forever after the backend recovered."""
    recorder = Recorder()
    healthy = {"now": False}

    def backend_call(path, content=""):
        if not healthy["now"]:
            raise RuntimeError("disk on fire")
        return text_result(f"contents of {path}")

    backend = recorder.backend({"read_file": backend_call, "write_file": backend_call})
    now = [1000.0]
    profile = TIERS + "circuit_breaker: {failure_threshold: 2, reset_seconds: 5}\n"
    if blocker == "rate limiter":
        profile += "rate_limits:\n  - {id: writes, key: [principal], tools: [\"write_*\"], rate: 1, per_seconds: 600, burst: 1}\n"
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, profile, RULES), [backend], clock=lambda: now[0])
    try:
        first = await gateway.call("write_file", {"path": "a"}, api_key="bob-key")  # spends bob's one write
        second = await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
        assert [first.error_code, second.error_code] == [ErrorCode.BACKEND_ERROR, ErrorCode.BACKEND_ERROR]
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).error_code is ErrorCode.BACKEND_UNAVAILABLE
        now[0] += 6
        healthy["now"] = True
        (tool, args, key), code = BLOCKED_PROBES[blocker]
        blocked = await gateway.call(tool, args, api_key=key)
        assert blocked.error_code is code
        reached = len(recorder.calls)
        later = await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
        assert later.status is Status.OK, later.message
        assert later.result == text_result("contents of a") and len(recorder.calls) == reached + 1
        assert gateway.breaker.store.state("test").state == "closed"
    finally:
        await gateway.aclose()


async def test_breaker_probe_cancelled_before_an_answer_is_released(tmp_path):
    """A call admitted as the half-open probe that ends without an answer frees the probe."""
    recorder = Recorder()
    mode = {"now": "fail"}
    sent = asyncio.Event()

    async def backend_call(path):
        if mode["now"] == "fail":
            raise RuntimeError("disk on fire")
        if mode["now"] == "hang":
            sent.set()
            await asyncio.Event().wait()
        return text_result(f"contents of {path}")

    now = [1000.0]
    profile = TIERS + "circuit_breaker: {failure_threshold: 1, reset_seconds: 5}\n"
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, profile), [recorder.backend({"read_file": backend_call})], clock=lambda: now[0])
    try:
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).error_code is ErrorCode.BACKEND_ERROR
        now[0] += 6
        mode["now"] = "hang"
        probe = asyncio.create_task(gateway.call("read_file", {"path": "a"}, api_key="alice-key"))
        await sent.wait()
        assert gateway.breaker.store.state("test").probing
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        assert not gateway.breaker.store.state("test").probing
        mode["now"] = "ok"
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).status is Status.OK
    finally:
        await gateway.aclose()


async def test_backend_timeout(tmp_path):
    recorder = Recorder()

    async def slow(path):
        await asyncio.sleep(5)

    gateway = await open_gateway(tmp_path, write_policy(tmp_path, TIERS + "backend_timeout_seconds: 0.1\n"), [recorder.backend({"read_file": slow})])
    try:
        outcome = await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
        assert outcome.error_code is ErrorCode.TIMEOUT and outcome.retryable
    finally:
        await gateway.aclose()


async def test_idempotency_key_replays_without_calling_again(setup):
    gateway, recorder, _ = setup
    first = await gateway.call("read_file", {"path": "a"}, api_key="alice-key", idempotency_key="k1")
    second = await gateway.call("read_file", {"path": "a"}, api_key="alice-key", idempotency_key="k1")
    assert first.result == second.result and len(recorder.calls) == 1
    clash = await gateway.call("read_file", {"path": "b"}, api_key="alice-key", idempotency_key="k1")
    assert clash.error_code is ErrorCode.INVALID_PARAMS and len(recorder.calls) == 1


async def test_dry_run_does_not_forward(setup):
    gateway, recorder, tmp = setup
    outcome = await gateway.call("read_file", {"path": "a"}, api_key="alice-key", dry_run=True)
    assert outcome.status is Status.DRY_RUN and recorder.calls == []
    assert ledger_records(tmp)[0]["dry_run"] is True


@pytest.mark.parametrize(
    "arguments, needle",
    [
        ([1, 2], "JSON object"),
        ("text", "JSON object"),
        ({"path": {"a": {"b": {"c": {"d": {"e": {}}}}}}}, "deeper"),
        ({"path": "x" * 5000}, "longer"),
        ({"path": "bad \ud800 surrogate"}, "surrogate"),
    ],
)
async def test_bad_arguments_are_refused_with_where_and_recorded(tmp_path, arguments, needle):
    recorder = Recorder()
    profile = TIERS + "sanitizer: {max_depth: 4, max_string: 1000}\n"
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, profile), [tools(recorder)])
    try:
        outcome = await gateway.call("read_file", arguments, api_key="alice-key")
        assert outcome.error_code is ErrorCode.INVALID_PARAMS
        assert needle in outcome.message, outcome.message
        assert recorder.calls == []
        assert ledger_records(tmp_path)[0]["status"] == "blocked"
        assert verify_ledger(SqliteLedgerReader(tmp_path / "ledger.db")).ok
    finally:
        await gateway.aclose()


async def test_ledger_failure_fails_closed(setup):
    gateway, _, _ = setup
    await gateway.ledger.aclose()
    outcome = await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
    assert outcome.status is Status.ERROR and outcome.error_code is ErrorCode.INTERNAL_ERROR
    assert outcome.result is None


async def test_reload_keeps_the_last_good_policy(setup):
    gateway, _, tmp = setup
    before = gateway.policy.version
    (tmp / "rules" / "call.yaml").write_text("apiVersion: dharma/v1\nkind: RuleSet\nmetadata: {name: x}\nrules:\n  - id: broken\n    when: '((('\n    effect: deny\n")
    failed = await gateway.reload()
    assert not failed.ok and "CEL syntax error" in failed.error and "call.yaml:" in failed.error
    assert gateway.policy.version == before and gateway.policy_status().state == "degraded"
    (tmp / "rules" / "call.yaml").write_text("apiVersion: dharma/v1\nkind: RuleSet\nmetadata: {name: x}\nrules: []\n")
    done = await gateway.reload()
    assert done.ok and done.changed and gateway.policy.version == done.new_version != before
    assert gateway.policy_status().state == "ok"
    reloads = [r for r in ledger_records(tmp) if r.get("kind") == "reload"]
    assert [(r["ok"], r["policy_version"]) for r in reloads] == [(False, before), (True, done.new_version)]


async def test_every_outcome_kind_lands_in_a_verifiable_ledger(setup):
    gateway, _, tmp = setup
    await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
    await gateway.call("read_file", {"path": "../a"}, api_key="alice-key")
    await gateway.call("write_file", {"path": "important/x"}, api_key="bob-key")
    await gateway.call("health_records", {"patient_id": "p"}, api_key="bob-key", purpose="x")
    await gateway.call("nothing", {}, api_key="alice-key")
    await asyncio.gather(*(gateway.call("read_file", {"path": f"{i}"}, api_key="alice-key") for i in range(50)))
    records = ledger_records(tmp)
    # 52 calls reached the backend (a decision and an outcome record each), 3 were refused (one record each),
    # and the held write is an approval event too
    assert len(records) == 52 * 2 + 3 + 1
    assert [(r["event"], r["principal"], r["tool"]) for r in records if r.get("kind") == "approval"] == [("held", "bob", "write_file")]
    assert sum(r.get("kind") == "decision" for r in records) == sum(r.get("kind") == "outcome" for r in records) == 52
    assert {r["status"] for r in records if "kind" not in r} >= {"blocked", "pending_approval"}
    assert {r["status"] for r in records if r.get("kind") == "outcome"} >= {"ok"}
    with SqliteLedgerReader(tmp / "ledger.db") as reader:
        report = verify_ledger(reader)
    assert report.ok and report.size == 108


async def test_closing_signs_a_checkpoint_that_verify_checks(tmp_path):
    from audit.checkpoint import verify_checkpoint

    recorder = Recorder()
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, TIERS), [tools(recorder)])
    await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
    await gateway.call("read_file", {"path": "b"}, api_key="alice-key")
    keys = gateway.keys
    await gateway.aclose()
    with SqliteLedgerReader(tmp_path / "ledger.db") as reader:
        note = reader.latest_checkpoint()
        report = verify_ledger(reader)
    checkpoint = verify_checkpoint(note, keys.checkpoint_key.public_key(), keys.checkpoint_key_name)
    assert checkpoint.size == 4 and report.ok and report.checkpoints_checked == 1  # 2 calls, 2 records each


class RefusesDecisions:
    """The real SQLite ledger, except that appending a decision record fails (as a full disk would)."""

    def __init__(self, inner: SqliteLedger) -> None:
        self.inner = inner

    async def append(self, entry: dict) -> Appended:
        if entry.get("kind") == "decision":
            raise LedgerError(f"{self.inner.path}: disk full")
        return await self.inner.append(entry)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_decision_record_that_cannot_be_written_means_nothing_is_forwarded(tmp_path):
    recorder = Recorder()
    policy = write_policy(tmp_path, TIERS, RULES)
    ledger = RefusesDecisions(await SqliteLedger.open(tmp_path / "ledger.db"))
    gateway = Gateway(load_policy(policy), [tools(recorder)], ledger=ledger, keys=KeyStore.open(tmp_path / "state"))
    try:
        outcome = await gateway.call("read_file", {"path": "a.txt"}, api_key="alice-key")
        refused = await gateway.call("read_file", {"path": "../a"}, api_key="alice-key")  # needs no decision record
    finally:
        await gateway.aclose()
    assert recorder.calls == []  # fail closed: the backend never saw the call
    assert outcome.status is Status.ERROR and outcome.error_code is ErrorCode.INTERNAL_ERROR and outcome.result is None
    assert "not forwarded" in outcome.message
    assert refused.error_code is ErrorCode.POLICY_BLOCKED
    failed, blocked = ledger_records(tmp_path)  # the refusal is one record, with no decision record before it
    assert "kind" not in failed and failed["status"] == "error" and failed["error_code"] == "internal_error"
    assert failed["decision"] == "allow" and failed["request_id"] == outcome.request_id
    assert "kind" not in blocked and blocked["status"] == "blocked"


async def test_a_closed_ledger_fails_the_call_closed_before_the_backend(setup):
    gateway, recorder, _ = setup
    await gateway.ledger.aclose()
    outcome = await gateway.call("read_file", {"path": "a.txt"}, api_key="alice-key")
    assert recorder.calls == []
    assert outcome.status is Status.ERROR and outcome.error_code is ErrorCode.INTERNAL_ERROR and outcome.result is None


async def test_the_decision_record_names_the_rules_that_matched_by_error(tmp_path):
    recorder = Recorder()
    rules = {"call.yaml": """\
        apiVersion: dharma/v1
        kind: RuleSet
        metadata: {name: call}
        rules:
          - id: audit-unguarded
            tools: ["search"]
            when: 'args.missing == 1'
            effect: deny
            mode: audit
          - id: audit-queries
            tools: ["search"]
            when: 'has(args.query)'
            effect: deny
            mode: audit
        """}
    gateway = await open_gateway(tmp_path, write_policy(tmp_path, TIERS, rules), [tools(recorder)])
    try:
        outcome = await gateway.call("search", {"query": "x"}, api_key="alice-key")
    finally:
        await gateway.aclose()
    assert outcome.status is Status.OK and recorder.calls == [("search", {"query": "x"})]
    decided, _ = ledger_records(tmp_path)
    assert decided["kind"] == "decision" and decided["enforced"] is False
    assert decided["matched_rules"] == ["audit-unguarded", "audit-queries"]
    assert decided["matched_by_error"] == ["audit-unguarded"]  # its condition errored: a match by error


async def varied_calls(gateway, tmp: Path) -> tuple[list, dict[int, bytes]]:
    """Ten calls of every kind (allowed, blocked, audit-mode, redacted arguments, disclosure REDACT
    and WITHHOLD, an idempotent replay, a tool that does not exist, a held call): each call's
    `(ctx, policy)` as the receipt left it, and the stored entry bytes by seq."""
    from audit.records import parse_record

    seen = []

    class Capture:
        name = "receipt"

        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, ctx, policy):
            await self.inner(ctx, policy)
            seen.append((ctx, policy))

    *rest, receipt = gateway.after_decision
    gateway.after_decision = (*rest, Capture(receipt))
    await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
    await gateway.call("read_file", {"path": "../a"}, api_key="alice-key")
    await gateway.call("read_file", {"path": "x.big"}, api_key="alice-key")
    await gateway.call("write_file", {"path": "tmp/x", "content": "card 4111 1111 1111 1111"}, api_key="bob-key")
    await gateway.call("write_file", {"path": "important/x"}, api_key="bob-key")
    await gateway.call("leaky", {}, api_key="bob-key")
    await gateway.call("health_records", {"patient_id": "p"}, api_key="bob-key", purpose="x")
    for _ in range(2):
        await gateway.call("search", {"query": "q"}, api_key="alice-key", idempotency_key="k-1")
    await gateway.call("nothing", {}, api_key="alice-key")
    with SqliteLedgerReader(tmp / "ledger.db") as reader:
        stored = {r.seq: parse_record(r.body).entry for r in map(reader.get, range(1, reader.size() + 1)) if r}
    assert len(seen) == 10
    return seen, stored


async def test_records_built_from_the_shared_part_match_records_built_afresh(setup):
    """A call's decision and outcome records share the fields built once (`call_part`, kept on the
    context). Each stored record must hold exactly the canonical bytes of its entry built from
    scratch after the call, for every kind of call in `varied_calls`."""
    from audit.canon import canonical_bytes
    from gateway.stages.record import call_part, decision_entry, ledger_entry

    gateway, _, tmp = setup
    seen, stored = await varied_calls(gateway, tmp)
    for ctx, policy in seen:
        shared = ctx.record_part
        ctx.record_part = None  # build everything again, from the context as the call left it
        assert call_part(ctx, policy) == shared
        ctx.record_part = None
        outcome = ctx.outcome
        entry = ledger_entry(ctx, policy, outcome, response_digest=ctx.response_digest, latency_us=ctx.latency_us)
        if ctx.decision_committed:
            ctx.record_part = None
            assert stored[ctx.decision_record.seq] == canonical_bytes(decision_entry(ctx, policy))
            entry.update(kind="outcome", decision_seq=ctx.decision_record.seq, decision_hash=ctx.decision_record.hash)
        assert stored[ctx.appended.seq] == canonical_bytes(entry)
    assert sum(ctx.decision_committed for ctx, _ in seen) >= 6
