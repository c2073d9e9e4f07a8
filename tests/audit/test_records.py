"""The record byte format: the splice is canonical JSON, and the tail parses from the end."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from audit.canon import canonical_bytes
from audit.errors import LedgerError
from audit.records import (
    GENESIS_PREV,
    decode_record,
    encode_entry,
    index_fields,
    normalize_time,
    parse_record,
    quick_index,
    record_bytes,
    rule_ids,
)

from .conftest import make_entry

ENTRIES = [
    make_entry(0),
    make_entry(7),
    {},
    {"prev": "x", "seq": 3, "entry": {"nested": [1, 2.5, 1e21, None, True]}},
    {"emoji": "😀", "ctl": "a\u0001b\"c\\d", "z": -0.0, "a": 10**15},
    {",\"prev\":\"": ",\"seq\":1}"},
]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("prev", "seq"), [(GENESIS_PREV, 1), ("ab" * 32, 2), ("0f" * 32, 1234567890123)])
def test_spliced_record_is_the_canonical_json_of_entry_prev_seq(entry: dict, prev: str, seq: int) -> None:
    spliced = record_bytes(encode_entry(entry, ledger="t"), prev, seq)
    assert spliced == canonical_bytes({"entry": entry, "prev": prev, "seq": seq})
    parsed = parse_record(spliced)
    assert (parsed.entry, parsed.prev, parsed.seq) == (canonical_bytes(entry), prev, seq)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b'{"entry":{},"prev":"' + b"0" * 64 + b'","seq":01}',
        b'{"entry":{},"prev":"' + b"0" * 64 + b'","seq":1 }',
        b'{"entry":{},"prev":"' + b"0" * 64 + b'","seq":-1}',
        b'{"entry":{},"prev":"' + b"A" * 64 + b'","seq":1}',
        b'{"entry":{},"prev":"' + b"0" * 63 + b'","seq":1}',
        b'{"entry":{},"prev":"' + b"0" * 64 + b'","seq":}',
        b'{"entry":{},"seq":1}',
    ],
)
def test_malformed_records_do_not_parse(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_record(body)


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {"x": float("inf")}, {"x": 2**60}, {"x": object()}, ["a"]])
def test_entries_that_are_not_canonical_json_raise_ledger_error_naming_the_ledger(bad: object) -> None:
    with pytest.raises(LedgerError, match="/var/karma.db"):
        encode_entry(bad, ledger="/var/karma.db")  # type: ignore[arg-type]


def test_index_fields_copy_the_query_columns() -> None:
    fields = index_fields(
        {
            "time": "2026-11-22T02:02:03.5+01:00",
            "principal": "alice",
            "tool": "fs.read",
            "decision": "deny",
            "status": "ok",
            "request_id": "r1",
            "policy_version": "pv",
            "matched_rules": ["a", "b", "a"],
        }
    )
    assert fields.time == "2026-11-22T01:02:03.500000Z"
    assert (fields.principal, fields.tool, fields.decision, fields.status) == ("alice", "fs.read", "deny", "ok")
    assert (fields.request_id, fields.policy_version) == ("r1", "pv")
    assert index_fields({"principal": {"sub": "a"}}).principal == '{"sub":"a"}'
    empty = index_fields({})
    assert empty.time is None and empty.principal is None


def test_normalize_time_sorts_as_instants() -> None:
    assert normalize_time("2026-11-22T01:02:03Z") == "2026-11-22T01:02:03.000000Z"
    assert normalize_time("2026-11-22") == "2026-11-22T00:00:00.000000Z"
    assert normalize_time("not a time") == "not a time"
    assert normalize_time("2026-11-22T01:02:03Z") < normalize_time("2026-11-22T01:02:03.5Z")


def test_decode_record_flattens_seq_hash_and_entry() -> None:
    body = record_bytes(encode_entry({"tool": "t", "seq": 99}, ledger="t"), GENESIS_PREV, 1)
    assert decode_record(1, "ab", body) == {"seq": 1, "hash": "ab", "tool": "t"}


_JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
_JSON = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                     max_leaves=8)
_INDEX_KEYS = ("time", "principal", "tool", "decision", "status", "request_id", "policy_version", "matched_rules")


def _exact_index(body: bytes) -> tuple[object, ...] | None:
    """What verify's exact check derives from a body (json.loads, index_fields, rule_ids)."""
    try:
        entry = json.loads(body)["entry"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(entry, dict):
        return None
    return (*dataclasses.astuple(index_fields(entry)), sorted(rule_ids(entry)) or None)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_INDEX_KEYS + ("args", "other")), _JSON | st.text(max_size=30)
                       | st.lists(st.text(max_size=5) | st.integers(), max_size=4)))
@example({"matched_rules": [float("inf")]})  # json.dumps writes Infinity: the quick path rightly refuses it
def test_quick_index_gives_exactly_what_the_exact_check_derives_or_nothing(entry: dict[str, object]) -> None:
    body = json.dumps({"entry": entry, "prev": "0" * 64, "seq": 1}).encode()
    quick = quick_index(body)
    assert quick is None or quick == _exact_index(body), (body, quick)
    try:
        json.dumps(entry, allow_nan=False)
    except ValueError:
        return  # Infinity or NaN somewhere: not JSON, so no fast path is owed (msgspec refuses it)
    if all(v is None or isinstance(v, str) for k, v in entry.items() if k in _INDEX_KEYS[:-1]) and not any(
            isinstance(entry.get("matched_rules"), t) for t in (dict, int, float, bool)):
        assert quick is not None  # the usual shapes take the fast path


@pytest.mark.parametrize("body", [
    b'{"entry":{"principal":"a","principal":"b"},"prev":"","seq":1}',  # duplicate keys: the last one counts
    b'{"entry":{"principal":"a"},"entry":{"tool":"t"},"seq":1}',
    b'{"entry":{"principal":"\\ud800"},"seq":1}',  # a lone surrogate
    b'{"entry":{"principal":NaN},"seq":1}',
    b'{"entry":{"principal":1e400},"seq":1}',
    b'\xef\xbb\xbf{"entry":{"principal":"a"},"seq":1}',
    b'{"entry":{"principal":"\xff"},"seq":1}',
    b'{"entry":{"time":"2025-01-01T00:00:00+02:00","matched_rules":["b","a","b",3]},"seq":1}',
    b'{"entry":{"args":{"principal":"nested"},"matched_rules":"r"},"seq":1}',
    b'{"entry":[1,2],"seq":1}',
    b'{"entry":{"principal":"a"}}trailing',
])
def test_quick_index_on_awkward_bodies(body: bytes) -> None:
    quick = quick_index(body)
    assert quick is None or quick == _exact_index(body), (body, quick)
