"""The hot path's shortcuts build exactly what the general code builds: the signed outcome, the
ledger entries and their bytes, and the receipt."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.call import ALLOW, Decision, Effect, Outcome, Status
from gateway.core.errors import ErrorCode
from tests.test_pipeline import setup, varied_calls  # noqa: F401  (setup: the pipeline tests' gateway fixture)


def test_signed_outcome_is_replace_of_its_four_fields():
    """`Outcome.signed` spells out every field; a field added to `Outcome` and not to `signed`
    fails here (each field is set to a value that differs from its default)."""
    values = {
        "request_id": "req-1", "tool": "t", "status": Status.ERROR, "decision": Decision(effect=Effect.DENY),
        "result": {"a": [1]}, "error_code": ErrorCode.INTERNAL_ERROR, "message": "m", "warnings": ("w",),
        "receipt": "old", "ledger_seq": 1, "ledger_hash": "h1", "approval_id": "ap", "idempotency_key": "k",
        "timestamp": "2026-01-01T00:00:00.000000Z", "latency_ms": 1.5,
    }
    assert set(values) == {f.name for f in dataclasses.fields(Outcome)}
    outcome = Outcome(**values)
    for field in dataclasses.fields(Outcome):
        assert getattr(outcome, field.name) != field.default, field.name
    signed = outcome.signed("tok", 7, "h7", 2.25)
    assert signed == dataclasses.replace(outcome, receipt="tok", ledger_seq=7, ledger_hash="h7", latency_ms=2.25)
    plain = Outcome(request_id="r", tool="t", status=Status.OK, decision=ALLOW)
    assert plain.signed(None, 1, "h", 0.0) == dataclasses.replace(plain, ledger_seq=1, ledger_hash="h")


# The entry builders as they were before they completed `call_fields`' dict in place: the oracle.
def _previous_decision_entry(ctx, policy):
    from gateway.stages.record import KIND_DECISION, call_fields, decided_matches

    matched = decided_matches(ctx, ctx.decision)
    return {
        "kind": KIND_DECISION,
        **call_fields(ctx, policy, ctx.decision, matched),
        "matched_by_error": list(dict.fromkeys(m.rule_id for m in matched if m.by_error is not None)),
    }


def _previous_ledger_entry(ctx, policy, outcome, *, response_digest, latency_us):
    from gateway.stages.record import call_fields, decided_matches

    matched = decided_matches(ctx, outcome.decision)
    if ctx.disclosure is not None:
        matched.extend(ctx.disclosure.matched)
    return {
        **call_fields(ctx, policy, outcome.decision, matched),
        "time": outcome.timestamp,
        "approval_id": outcome.approval_id,
        "matched_by_error": list(dict.fromkeys(m.rule_id for m in matched if m.by_error is not None)),
        "disclosure": ctx.disclosure_note,
        "response_digest": response_digest,
        "status": outcome.status.value,
        "error_code": outcome.error_code.value if outcome.error_code else None,
        "latency_us": latency_us,
    }


async def test_entries_and_their_bytes_match_the_previous_builders(setup):
    """Every record of a varied run (allowed, refused, audit mode, redacted arguments, disclosure
    REDACT and WITHHOLD, a replay, an unknown tool, a held call) equals, as a dict (an outcome's key
    order included) and as stored bytes, what the previous builders make from the same context."""
    from audit.canon import canonical_bytes
    from audit.records import encode_entry
    from gateway.stages.record import decision_entry, ledger_entry

    gateway, _, tmp = setup
    seen, stored = await varied_calls(gateway, tmp)
    decisions = 0
    for ctx, policy in seen:
        outcome = ctx.outcome
        old = _previous_ledger_entry(ctx, policy, outcome, response_digest=ctx.response_digest, latency_us=ctx.latency_us)
        new = ledger_entry(ctx, policy, outcome, response_digest=ctx.response_digest, latency_us=ctx.latency_us)
        assert list(new.items()) == list(old.items())
        if ctx.decision_committed:
            decisions += 1
            old_decision, new_decision = _previous_decision_entry(ctx, policy), decision_entry(ctx, policy)
            assert new_decision == old_decision
            assert stored[ctx.decision_record.seq] == canonical_bytes(old_decision) == encode_entry(new_decision, ledger="t")
            link = {"kind": "outcome", "decision_seq": ctx.decision_record.seq, "decision_hash": ctx.decision_record.hash}
            old.update(link)
        assert stored[ctx.appended.seq] == canonical_bytes(old) == encode_entry(ctx.entry, ledger="t")
    assert decisions >= 6


@pytest.mark.parametrize(("level", "debug_lines"), [("warning", False), ("info", False), ("debug", True)])
async def test_call_decided_is_logged_for_refusals_always_and_for_calls_that_went_through_at_debug(
    setup, monkeypatch, capsys, level, debug_lines
):
    """The receipt's `call.decided` line: info for a refusal at every level but warning, debug for a
    call that went through, exactly as the level says (the settled logger skips only dropped lines)."""
    import structlog

    import gateway.stages.receipt
    from gateway.logging import configure_logging

    saved = structlog.get_config()
    configure_logging(level)
    monkeypatch.setattr(gateway.stages.receipt, "log", structlog.get_logger())  # not settled by earlier tests
    try:
        gateway, _, _ = setup
        await gateway.call("read_file", {"path": "a"}, api_key="alice-key")
        await gateway.call("read_file", {"path": "../a"}, api_key="alice-key")  # refused
    finally:
        structlog.configure(**saved)
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    decided = [(e["status"], e["level"]) for e in events if e["event"] == "call.decided"]
    expected = [("ok", "debug")] if debug_lines else []
    if level != "warning":
        expected.append(("blocked", "info"))
    assert decided == expected


# `index_fields` and `rule_ids` as they were before `index_row` and the empty-list shortcut: the oracle.
def _previous_index_fields(entry):
    from audit.records import IndexFields, _text, normalize_time

    get = entry.get
    raw_time = get("time")
    return IndexFields(
        time=normalize_time(raw_time) if isinstance(raw_time, str) else _text(raw_time),
        principal=_text(get("principal")),
        tool=_text(get("tool")),
        decision=_text(get("decision")),
        status=_text(get("status")),
        request_id=_text(get("request_id")),
        policy_version=_text(get("policy_version")),
    )


def _previous_rule_ids(entry):
    rules = entry.get("matched_rules")
    if isinstance(rules, str):
        return (rules,)
    if isinstance(rules, (list, tuple)):
        return tuple(dict.fromkeys(rule for rule in rules if isinstance(rule, str)))
    return ()


_scalars = st.one_of(
    st.none(), st.text(max_size=8), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["2026-11-24T19:11:57.022433Z", "2026-11-24T20:11:57+01:00", "2026-11-24", "not a time", ""]),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)
_INDEXED_KEYS = ("time", "principal", "tool", "decision", "status", "request_id", "policy_version", "matched_rules", "other")


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_INDEXED_KEYS), _values))
def test_index_row_and_rule_ids_give_what_the_previous_functions_gave(entry):
    from audit.records import index_fields, index_row, rule_ids

    old = _previous_index_fields(entry)
    assert index_row(entry) == dataclasses.astuple(old)
    assert index_fields(entry) == old
    assert rule_ids(entry) == _previous_rule_ids(entry)


def test_rule_ids_shortcut_only_takes_an_empty_list():
    from audit.records import rule_ids

    for value in ([], (), "", None, ["a", 1, "a", "b"], ("x",), [[]]):
        assert rule_ids({"matched_rules": value}) == _previous_rule_ids({"matched_rules": value})
