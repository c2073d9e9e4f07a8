"""The record format of the karma ledger, and the values passed in and out of a store.

A record is the RFC 8785 bytes of `{"entry": <entry>, "prev": <hex>, "seq": <n>}`. The entry
is canonicalised once by the caller; the writer splices prev and seq onto it (keys
entry < prev < seq, so the splice is itself canonical). The record hash is the RFC 9162
leaf hash, so the records form a hash chain and the leaves of a Merkle tree at once.
No I/O here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from audit.canon import NotCanonicalizable, canonical_bytes
from audit.errors import LedgerError

FORMAT = "dharma-ledger/1"
GENESIS_PREV = "0" * 64
SUBTREES_KEY = "subtrees"
"""meta key a ledger holds once it stores every complete subtree hash (`audit.merkle.SUBTREE_STRIDE`)."""
ENTRY_PREFIX = b'{"entry":'
PREV_MARK = b',"prev":"'
SEQ_MARK = b'","seq":'
_HEX_DIGITS = b"0123456789abcdef"
KIND_DECISION = "decision"
"""`kind` of the record committed before a call reaches its backend."""
KIND_OUTCOME = "outcome"
"""`kind` of the record of that call's outcome; `decision_seq` / `decision_hash` name its decision record.

A record with no `kind` is a whole call in one record: a refused call, or any call in a ledger
written before records were two-phase.
"""
KIND_APPROVAL = "approval"
"""`kind` of an approval event: `event` is held, approved, denied or expired; `approval_id`, `by`
(a principal id, or null for expired), `via`, `reason` and the binding (principal, tool,
args_digest, policy_version, held_request_id: the request id of the held call) say which,
who, how and why. Its `request_id` and `decision` are null: they name one call's records.
"""
KIND_RELOAD = "reload"
"""`kind` of a policy reload attempt: `trigger` (file, signal, http, api), `by` (the principal of an
HTTP reload, else null), `ok`, `old_version` (serving before), `new_version` (loaded, or null when
the new files did not load), `policy_version` (serving after: the new one, or the old one kept),
`changed` (the version moved), `files` and, when refused, `error` and `problems` (`file:line`
messages). Its `request_id` and `decision` are null: they name one call's records.
"""
KIND_REFUSAL = "refusal"
"""`kind` of an aggregate of requests the HTTP auth layer refused (`gateway.core.refusals`): `count`
requests from `source` refused for `reason` between `time` and `until`, and what the first of them
was (`request`, `method`, `tool`, `body_sha256`, `credential`, `token`). Never the credential itself.
Its `principal` and `request_id` are null: nobody was authenticated, and it is no one call's record.
"""
KINDS = (KIND_DECISION, KIND_OUTCOME, KIND_APPROVAL, KIND_RELOAD, KIND_REFUSAL)
"""Every `kind` a record may carry (a whole call in one record has none): the `kind` query filter's values."""
_CANONICAL_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an entry landed: its seq (1-based) and its record hash (lowercase hex)."""

    seq: int
    hash: str


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One stored record: seq, record hash (hex) and the exact record bytes."""

    seq: int
    hash: str
    body: bytes

    def to_dict(self) -> dict[str, Any]:
        return decode_record(self.seq, self.hash, self.body)


@dataclass(frozen=True, slots=True)
class ParsedRecord:
    """The three parts of a record's bytes."""

    entry: bytes
    prev: str
    seq: int


@dataclass(frozen=True, slots=True)
class IndexFields:
    """The entry fields copied into indexed columns (not hashed: the body is the truth).

    `matched_rules` is not here: the rule index holds `rule_ids(entry)`, one row each.
    """

    time: str | None
    principal: str | None
    tool: str | None
    decision: str | None
    status: str | None
    request_id: str | None
    policy_version: str | None


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """A query over the indexed columns; None means any. `since` inclusive, `until` exclusive.

    `tool_prefix` keeps tools whose name starts with it (taken literally: it holds no glob characters).
    `newest_first` orders by time then seq, descending (the time index read backwards), so a `limit`
    keeps the newest records of a range.
    """

    principal: str | None = None
    tool: str | None = None
    tool_prefix: str | None = None
    decision: str | None = None
    status: str | None = None
    rule: str | None = None
    policy_version: str | None = None
    request_id: str | None = None
    since: str | None = None
    until: str | None = None
    limit: int | None = None
    newest_first: bool = False


def encode_entry(entry: Mapping[str, Any], *, ledger: str) -> bytes:
    """Canonicalise one entry, or raise LedgerError naming the ledger."""
    if type(entry) is not dict:
        if not isinstance(entry, Mapping):
            raise LedgerError(f"{ledger}: a ledger entry must be a JSON object, not {type(entry).__name__}")
        entry = dict(entry)
    try:
        return canonical_bytes(entry)  # a caller's dict as it is: canonical_bytes never mutates
    except NotCanonicalizable as exc:
        raise LedgerError(f"{ledger}: entry cannot be recorded, {exc}") from exc


def record_bytes(entry: bytes, prev: str, seq: int) -> bytes:
    """Splice the canonical record bytes from canonical entry bytes, prev hash and seq."""
    return b"".join((ENTRY_PREFIX, entry, PREV_MARK, prev.encode("ascii"), SEQ_MARK, b"%d}" % seq))


def record_tail(prev: str, seq: int) -> bytes:
    """The fixed-shape end of a record: `,"prev":"<hex>","seq":<n>}`."""
    return b"".join((PREV_MARK, prev.encode("ascii"), SEQ_MARK, b"%d}" % seq))


def parse_record(body: bytes) -> ParsedRecord:
    """Split record bytes into entry bytes, prev and seq, reading the tail from the end.

    Raises:
        ValueError: the bytes do not have the record shape.
    """
    if not body.startswith(ENTRY_PREFIX) or not body.endswith(b"}"):
        raise ValueError("does not have the shape {\"entry\":…,\"prev\":…,\"seq\":…}")
    at = body.rfind(SEQ_MARK)
    digits = body[at + len(SEQ_MARK) : -1] if at >= 0 else b""
    if not digits.isdigit() or (len(digits) > 1 and digits.startswith(b"0")):
        raise ValueError("has no canonical seq at its end")
    start = at - 64 - len(PREV_MARK)
    if start < len(ENTRY_PREFIX) or body[start : start + len(PREV_MARK)] != PREV_MARK:
        raise ValueError("has no prev hash before its seq")
    prev = body[start + len(PREV_MARK) : at]
    if prev.translate(None, _HEX_DIGITS):
        raise ValueError("has a prev that is not a lowercase hex hash")
    return ParsedRecord(entry=body[len(ENTRY_PREFIX) : start], prev=prev.decode("ascii"), seq=int(digits))


def decode_record(seq: int, hash_hex: str, body: bytes) -> dict[str, Any]:
    """Return the record as one flat dict: seq, hash, then the entry's fields."""
    entry = json.loads(body)["entry"]
    out: dict[str, Any] = {"seq": seq, "hash": hash_hex}
    out.update((k, v) for k, v in entry.items() if k not in out)
    return out


def index_fields(entry: Mapping[str, Any]) -> IndexFields:
    """Copy the queryable fields out of an entry, normalising `time` to UTC microseconds."""
    return IndexFields(*index_row(entry))


def index_row(entry: Mapping[str, Any]) -> tuple[str | None, ...]:
    """`index_fields(entry)` as a plain tuple in `IndexFields`' order: the columns the SQLite writer
    inserts, without building the frozen dataclass on each append. Text and null are kept as they
    are (what `_text` returns for them) without a call."""
    get = entry.get
    raw_time, principal, tool, decision = get("time"), get("principal"), get("tool"), get("decision")
    status, request_id, policy_version = get("status"), get("request_id"), get("policy_version")
    return (
        normalize_time(raw_time) if isinstance(raw_time, str) else _text(raw_time),
        principal if principal is None or type(principal) is str else _text(principal),
        tool if tool is None or type(tool) is str else _text(tool),
        decision if decision is None or type(decision) is str else _text(decision),
        status if status is None or type(status) is str else _text(status),
        request_id if request_id is None or type(request_id) is str else _text(request_id),
        policy_version if policy_version is None or type(policy_version) is str else _text(policy_version),
    )


def rule_ids(entry: Mapping[str, Any]) -> tuple[str, ...]:
    """The rows the rule index holds for an entry, in the order the writers insert them: the text
    items of its `matched_rules` array, each once at its first place, or its one text value.

    An array is whatever the canonical encoder writes as one (a list or a tuple), so the rows follow
    the recorded bytes whether `entry` is a caller's object or `json.loads` of a record. Those that
    compare with stored rows regardless of order sort it.
    """
    rules = entry.get("matched_rules")
    if type(rules) is list and not rules:  # most records: no rule matched
        return ()
    if isinstance(rules, str):
        return (rules,)
    if isinstance(rules, (list, tuple)):
        return tuple(dict.fromkeys(rule for rule in rules if isinstance(rule, str)))
    return ()


class _IndexedEntry(msgspec.Struct, gc=False):
    """The entry fields the indexes hold, as `quick_index` accepts them; msgspec skips every other field."""

    time: str | None = None
    principal: str | None = None
    tool: str | None = None
    decision: str | None = None
    status: str | None = None
    request_id: str | None = None
    policy_version: str | None = None
    matched_rules: list[Any] | str | None = None


class _IndexedRecord(msgspec.Struct, gc=False):
    entry: _IndexedEntry


_INDEX_DECODER = msgspec.json.Decoder(_IndexedRecord)


def quick_index(body: bytes) -> tuple[Any, ...] | None:
    """`(*index_fields(entry), sorted(rule_ids(entry)) or None)` of a record's entry, read by a parser
    that builds only those fields (several times faster than `json.loads` on ledger records).

    It answers only when every indexed field is a string or null and `matched_rules` a list, a
    string or null; then it gives exactly what `json.loads` + `index_fields` + `rule_ids` give (both
    parsers keep the last of duplicate keys and decode strings alike; msgspec refuses lone
    surrogates, NaN and bytes that are not UTF-8). None means "not sure": take the exact path.
    """
    try:
        e = _INDEX_DECODER.decode(body).entry
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None
    rules = e.matched_rules
    if type(rules) is list:
        rules = sorted({rule for rule in rules if type(rule) is str}) or None
    elif rules is not None:
        rules = [rules]
    time = e.time
    if time is not None and not _CANONICAL_TIME.fullmatch(time):
        time = normalize_time(time)
    return (time, e.principal, e.tool, e.decision, e.status, e.request_id, e.policy_version, rules)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    try:
        return canonical_bytes(value).decode("utf-8")
    except NotCanonicalizable:
        return str(value)


def normalize_time(value: str | datetime) -> str:
    """Return `value` as `YYYY-MM-DDTHH:MM:SS.ffffffZ` in UTC, so strings sort as instants.

    Naive datetimes and dates are taken as UTC. A string that is not RFC 3339 comes back as
    given (it is still stored; it just will not sort with the rest).
    """
    if isinstance(value, str):
        if _CANONICAL_TIME.fullmatch(value):
            return value
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
    else:
        parsed = value
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
