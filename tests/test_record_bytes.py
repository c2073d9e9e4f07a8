"""The hot path's shortcuts build exactly what the general code builds: the signed outcome, the
ledger entries and their bytes, and the receipt."""

from __future__ import annotations

import dataclasses

from gateway.core.call import ALLOW, Decision, Effect, Outcome, Status
from gateway.core.errors import ErrorCode


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
