"""Two-phase records on a real ledger, on each backend (`ledger_backend`: SQLite file, PostgreSQL database): decision records paired with their outcome records.

`check_outcomes` (what `dharma audit verify` reports) and `call_rows` (what `dharma audit query`
shows) find a decision with no outcome ("outcome unknown"), and old single records stay valid.
"""

from __future__ import annotations

from typing import Any

from audit.query import OUTCOME_UNKNOWN, call_rows, query_records, status_text
from audit.records import KIND_DECISION, KIND_OUTCOME
from audit.verify import check_outcomes, verify_ledger
from tests.audit.conftest import Location, make_entry, open_ledger, open_reader


def decision(i: int) -> dict[str, Any]:
    entry = make_entry(i)
    for field in ("status", "error_code", "response_digest", "latency_ms"):
        del entry[field]
    return {**entry, "kind": KIND_DECISION}


def outcome(i: int, seq: int, hash_hex: str) -> dict[str, Any]:
    return {**make_entry(i), "kind": KIND_OUTCOME, "decision_seq": seq, "decision_hash": hash_hex}


async def write_mixed(location: Location) -> dict[str, int]:
    """An old single record, a decided-and-answered call, a decision left unanswered, one more single."""
    ledger = await open_ledger(location)
    try:
        await ledger.append(make_entry(1))  # seq 1: the single-record form (refusals, older ledgers)
        decided = await ledger.append(decision(2))  # seq 2
        # args that merely contain the marks must not count as a decision or an outcome
        await ledger.append({**make_entry(5), "args": {"kind": "decision", "k2": {"kind": "outcome"}}})  # seq 3
        answered = await ledger.append(outcome(2, decided.seq, decided.hash))  # seq 4
        unanswered = await ledger.append(decision(3))  # seq 5: the gateway died before its outcome
        await ledger.append(make_entry(4))  # seq 6
    finally:
        await ledger.aclose()
    return {"decided": decided.seq, "answered": answered.seq, "unanswered": unanswered.seq}


async def test_verify_reports_a_decision_without_outcome_and_still_passes(ledger_backend: Location) -> None:
    seqs = await write_mixed(ledger_backend)
    with open_reader(ledger_backend) as reader:
        report = verify_ledger(reader)
        found = check_outcomes(reader)
    assert report.ok and report.size == 6  # not tampering: the chain is whole
    assert found.decisions == 2 and found.unknown == (seqs["unanswered"],) and found.dangling == ()


async def test_an_outcome_naming_no_decision_of_its_call_is_dangling(ledger_backend: Location) -> None:
    ledger = await open_ledger(ledger_backend)
    try:
        first = await ledger.append(decision(1))
        await ledger.append(outcome(2, first.seq, first.hash))  # another request's outcome claims it
        await ledger.append(outcome(3, 99, "00" * 32))  # names a seq that is no decision
        good = await ledger.append(outcome(1, first.seq, first.hash))
        await ledger.append(outcome(1, first.seq, first.hash))  # a second answer to an answered decision
    finally:
        await ledger.aclose()
    with open_reader(ledger_backend) as reader:
        found = check_outcomes(reader)
    assert found.unknown == () and found.dangling == (2, 3, good.seq + 1)


async def test_query_shows_one_row_per_call_and_flags_outcome_unknown(ledger_backend: Location) -> None:
    seqs = await write_mixed(ledger_backend)
    with open_reader(ledger_backend) as reader:
        calls = list(call_rows(reader, query_records(reader)))
        every = list(call_rows(reader, query_records(reader), show="records"))
        unknown = list(call_rows(reader, query_records(reader), show="unknown"))
    # the answered decision (seq 2) folds into its outcome record; the unanswered one stays, flagged
    assert sorted(r["seq"] for r in calls) == [1, 3, 4, 5, 6]  # oldest first by time, so not in seq order
    every = sorted(every, key=lambda r: r["seq"])
    assert [r["seq"] for r in every] == [1, 2, 3, 4, 5, 6]
    assert every[1]["outcome"] == seqs["answered"] and status_text(every[1]) == f"decided→{seqs['answered']}"
    assert [r["seq"] for r in unknown] == [seqs["unanswered"]]
    assert unknown[0]["outcome"] == OUTCOME_UNKNOWN and status_text(unknown[0]) == "outcome unknown"
    assert "outcome" not in every[0] and status_text(every[0]) == every[0]["status"]  # old single records as before
