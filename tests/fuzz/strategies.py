"""Hostile inputs for the property tests and `make fuzz`: JSON-RPC lines, YAML documents, CEL
argument values and tokens, as hypothesis strategies.

Mutations are plain functions of a `random.Random`, so the end-to-end tests can draw the same
kinds of damage from a fixed seed without hypothesis.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]

# ---- JSON values ---------------------------------------------------------------------------

#: Strings a parser or a CEL engine may trip on: lone and paired surrogates, NUL, bidi and tag
#: characters, look-alikes, escapes as text, long runs.
ODD_STRINGS = [
    "", "\ud800", "\udfff", "a\ud83d", "\ud83d\ude00", "\x00", "\u202e", "\U000e0041", "\ufeff", "ｅｃｈｏ",
    "\\u0000", "\\ud800", "../../etc/passwd", "%00", "\r\n", "é" * 300, "x" * 5000, "1e400", "NaN",
]
ODD_NUMBERS: list[Any] = [0, -0.0, 1.5, -1, 2**53, 2**53 + 1, 2**63, -(2**64), 10**300, 1e308, 5e-324, float("nan"),
                          float("inf"), float("-inf")]

json_keys = st.one_of(st.text(max_size=8), st.sampled_from(["id", "method", "params", "name", "arguments", "_meta", "jsonrpc"]))
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.sampled_from(ODD_STRINGS),
    st.sampled_from(ODD_NUMBERS),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_keys, inner, max_size=4),
    max_leaves=24,
)


def dump(value: Any, ascii_only: bool) -> bytes:
    """JSON text for `value` as a careless client writes it: NaN/Infinity allowed; lone
    surrogates become `\\udXXX` escapes (ASCII) or raw surrogate bytes (surrogatepass)."""
    text = json.dumps(value, ensure_ascii=ascii_only, allow_nan=True, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


# ---- JSON-RPC lines ------------------------------------------------------------------------

METHODS = ["initialize", "ping", "tools/list", "tools/call", "notifications/initialized", "notifications/cancelled",
           "resources/read", "vendor/x", "", "TOOLS/CALL"]
ids = st.one_of(st.integers(), st.text(max_size=10), st.sampled_from(ODD_STRINGS), st.none(), st.booleans(),
                st.floats(), st.sampled_from(ODD_NUMBERS), st.lists(st.integers(), max_size=2))


@st.composite
def messages(draw: st.DrawFn) -> Any:
    """A JSON-RPC-shaped value: request, notification, response or batch, with odd ids and params."""
    msg: dict[str, Any] = {}
    if draw(st.booleans()) or draw(st.booleans()):
        msg["jsonrpc"] = draw(st.sampled_from(["2.0", "2.0", "1.0", 2.0, None]))
    shape = draw(st.sampled_from(["request", "notification", "response", "error"]))
    if shape != "notification":
        msg["id"] = draw(ids)
    if shape in ("request", "notification"):
        msg["method"] = draw(st.sampled_from(METHODS) | st.text(max_size=12))
        if draw(st.booleans()):
            name = draw(st.sampled_from(["echo", "admin_reset", "Echo", "echo\u200b"]) | st.text(max_size=8))
            msg["params"] = draw(st.sampled_from([
                {"name": name, "arguments": draw(json_values)}, draw(json_values),
            ]))
    elif shape == "response":
        msg["result"] = draw(json_values)
    else:
        msg["error"] = {"code": draw(st.integers()), "message": draw(st.text(max_size=10))}
    if draw(st.integers(0, 9)) == 0:
        return [msg, *draw(st.lists(json_values, max_size=2))]
    return msg


def mutate(data: bytes, rng: random.Random, rounds: int = 3) -> bytes:
    """Damage `data` the ways a hostile or broken client does (see MUTATIONS)."""
    for _ in range(rng.randint(1, rounds)):
        data = rng.choice(MUTATIONS)(data, rng)
    return data


def _flip(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    i = rng.randrange(len(data))
    return data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]


def _cut(data: bytes, rng: random.Random) -> bytes:
    i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    return data[:i] + data[j:]


def _repeat(data: bytes, rng: random.Random) -> bytes:
    i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    return data[:j] + data[i:j] * rng.randint(1, 20) + data[j:]


def _insert(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data) + 1)
    piece = rng.choice([b'"a":1,', b'"id":2,', b'"method":"tools/call",', b"NaN", b"-Infinity", b"1e400", b"9" * 5000,
                        b'"\\ud800"', b'"\\udc00\\ud800"', b"\xef\xbb\xbf", b"\r", b"\n", b"\x00", b"\xff", b"\xed\xa0\x80",
                        b"[" * 200, b"{}", b"[]", b",", b":", b'"', b"\\", b"null", b"-0", b"1e-400"])
    return data[:i] + piece + data[i:]


def _duplicate_key(data: bytes, rng: random.Random) -> bytes:
    i = data.find(b"{")
    if i < 0:
        return data
    key = rng.choice([b"id", b"method", b"name", b"params", b"arguments", b"jsonrpc"])
    return data[:i + 1] + b'"' + key + b'":' + rng.choice([b"1", b'"x"', b"{}", b'"tools/call"']) + b"," + data[i + 1:]


def _nest(data: bytes, rng: random.Random) -> bytes:
    n = rng.choice([10, 127, 128, 129, 1000, 5000, 50_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    return opener * n + data + (closer * n if rng.random() < 0.7 else b"")


def _frame(data: bytes, rng: random.Random) -> bytes:
    return rng.choice([b"\xef\xbb\xbf" + data, data + b"\r", b"\r\n" + data, b" \t" + data + b"  ", data + b"\x00"])


MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [_flip, _cut, _repeat, _insert, _duplicate_key, _nest, _frame]

VALID_LINES = [
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
    b'{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}',
    b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}',
    b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
    b'{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"x"}]}}',
    b'[{"jsonrpc":"2.0","id":4,"method":"ping"},{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"admin_reset"}}]',
]


@st.composite
def lines(draw: st.DrawFn, huge: int = 100_000) -> bytes:
    """One framed message as a hostile client may send it (no newline inside unless mutated)."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:
        return dump(draw(messages()), draw(st.booleans()))
    if kind == 2:
        return mutate(draw(st.sampled_from(VALID_LINES) | messages().map(lambda m: dump(m, True))), draw(st.randoms(use_true_random=False)))
    if kind == 3:
        return draw(st.sampled_from([b"", b" ", b"\r", b"\t\r", b"\xef\xbb\xbf", b"\x00"]))
    if kind == 4:
        size = draw(st.integers(1, huge))
        return b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"text":"' + b"x" * size + b'"}}}'
    return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")


# ---- YAML documents ------------------------------------------------------------------------

POLICY_SAMPLES = sorted((REPO / "policies").glob("*.yaml")) + sorted((REPO / "rules").glob("*.yaml"))
CONFIG_SAMPLES = [REPO / "examples" / "dharma.yaml"]


def _yaml_mutate(text: str, rng: random.Random) -> str:
    lines_ = text.splitlines()
    for _ in range(rng.randint(1, 4)):
        if not lines_:
            lines_.append("")
        i = rng.randrange(len(lines_))
        op = rng.randrange(7)
        if op == 0:
            del lines_[i]
        elif op == 1:
            lines_.insert(i, lines_[i])
        elif op == 2:
            lines_[i] = " " * rng.randint(0, 6) + lines_[i].lstrip()
        elif op == 3:
            lines_[i] += rng.choice([": x", " [", " {", " &a", " *a", " !!python/object:os.system", " !!binary AAA", "\t",
                                     " 1e400", " .nan", " -.inf", " 99999999999999999999999999", " '\\ud800'", ' "\\ud800"'])
        elif op == 4:
            cut = rng.randrange(len(lines_[i]) + 1)
            lines_[i] = lines_[i][:cut]
        elif op == 5:
            lines_.insert(i, rng.choice(["---", "...", "%YAML 1.1", "? x", "- - -", "<<: *a", "a: &a [*a]", "b: &b {c: *b}",
                                         "\ufeff", "x: " + "[" * 3000, "y: " + "{a: " * 2000, "- " * 2000 + "x"]))
        else:
            lines_[i] = lines_[i].replace(":", rng.choice([" :", "::", ""]), 1)
    return "\n".join(lines_) + rng.choice(["", "\n", "\r\n"])


@st.composite
def yaml_texts(draw: st.DrawFn, samples: list[Path]) -> str:
    """YAML text: arbitrary characters, damaged copies of the shipped files, or random mappings."""
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(st.text(max_size=300))
    if kind == 1:
        sample = draw(st.sampled_from(samples)).read_text(encoding="utf-8")
        return _yaml_mutate(sample, draw(st.randoms(use_true_random=False)))
    import yaml

    value = draw(st.dictionaries(st.sampled_from(["apiVersion", "kind", "metadata", "rules", "tiers", "principals",
                                                  "upstreams", "policy", "server", "ledger", "x"]),
                                 json_values, max_size=5))
    return yaml.safe_dump(value, allow_unicode=draw(st.booleans()))


# ---- CEL argument values -------------------------------------------------------------------

#: Keys generated arguments never use: the fuzz policy's deny rule reads `args[ABSENT]`, so every
#: evaluation of that rule is an error, and an error in a deny rule must deny.
ABSENT = "zz_absent"
cel_arguments = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k != ABSENT) | st.sampled_from(["path", "text", "x", "depth", "\ud800"]),
    json_values, max_size=6,
)


# ---- tokens --------------------------------------------------------------------------------

token_segments = st.one_of(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", max_size=40),
                           st.text(max_size=20))


# ---- a fixed corpus for the end-to-end tests -----------------------------------------------

_CALL = b'{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"admin_reset","arguments":%s}}'

#: One line per kind of damage; every tool call among them names a tool the test principal may
#: not call (`admin_reset`), so none of them may ever reach the server.
HOSTILE_LINES: dict[str, bytes] = {
    "deep-array": b"[" * 5000,
    "deep-object": b'{"a":' * 5000,
    "deep-params": _CALL % (b"1", b"[" * 3000 + b"]" * 3000),
    "surrogate-id": b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
    "surrogate-id-call": _CALL % (b'"\\udfff"', b"{}"),
    "surrogate-argument": _CALL % (b"2", b'{"text":"\\ud800"}'),
    "surrogate-name": b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"admin_reset\\ud800"}}',
    "raw-surrogate-bytes": _CALL % (b"4", b'{"text":"\xed\xa0\x80"}'),
    "duplicate-name": b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","name":"admin_reset"}}',
    "duplicate-in-batch": b'[1,{"a":1,"a":2}]',
    "duplicate-id": b'{"jsonrpc":"2.0","id":6,"id":7,"method":"tools/call","params":{"name":"admin_reset"}}',
    "nan": _CALL % (b"8", b'{"x":NaN}'),
    "infinity": _CALL % (b"9", b'{"x":-Infinity}'),
    "float-overflow": _CALL % (b"10", b'{"x":1e400}'),
    "huge-integer-id": _CALL % (b"9" * 5000, b"{}"),
    "huge-integer-argument": _CALL % (b"11", b'{"x":' + b"9" * 4000 + b"}"),
    "bom": b"\xef\xbb\xbf" + _CALL % (b"12", b"{}"),
    "carriage-return": _CALL % (b"13", b"{}") + b"\r",
    "empty": b"",
    "blank": b" \t\r",
    "nul": b"\x00",
    "not-utf8": b'{"jsonrpc":"2.0","id":14,"method":"\xff\xfe"}',
    "truncated": (_CALL % (b"15", b"{}"))[:-3],
    "float-id": _CALL % (b"1.5", b"{}"),
    "null-id-call": _CALL % (b"null", b"{}"),
    "batch-smuggling": b'[' + _CALL % (b"16", b"{}") + b',{"jsonrpc":"2.0","id":17,"method":"ping"}]',
    "notification-call": b'{"jsonrpc":"2.0","method":"tools/call","params":{"name":"admin_reset"}}',
    "params-string": b'{"jsonrpc":"2.0","id":18,"method":"tools/call","params":"admin_reset"}',
    "arguments-deep-in-limit": _CALL % (b"19", b'{"x":' + b"[" * 100 + b"]" * 100 + b"}"),
    "big-line": _CALL % (b"20", b'{"text":"' + b"x" * 1_000_000 + b'"}'),
}


def seeded_mutations(count: int, seed: int = 12) -> list[bytes]:
    """`count` damaged copies of admin_reset calls and batches, the same for every run."""
    rng = random.Random(seed)
    bases = [_CALL % (b"21", b'{"text":"hi"}'), HOSTILE_LINES["batch-smuggling"], HOSTILE_LINES["duplicate-name"]]
    return [mutate(rng.choice(bases), rng).replace(b"\n", b" ") for _ in range(count)]
