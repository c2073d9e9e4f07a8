"""The Rust engine's fast path (gateway/policy/cel/fast.py) answers exactly as the engine does.

Whenever the fast path answers, its value equals the engine's (type and value); when it is not
sure it defers, and the engine's own result or error stands. Checked on generated expressions
and activations (Hypothesis), on every expression of the shipped rule files over every
activation their own test cases build, and on the engine facts the fast path relies on. The
fast path must also answer the common shapes, or it would be a slow no-op.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.policy import cel
from gateway.policy.cel.fast import FAST_RESULTS, compile_fast
from gateway.policy.testing import run_tests
from tests.test_cel_differential import DECLARED, SHIPPED

RUST = "common-expression-language"
pytestmark = pytest.mark.skipif(RUST not in cel.available_engines(), reason="the fast path serves the Rust engine")

ROOT = Path(__file__).resolve().parent.parent

_DEFERRED = object()
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
GEN_DECLARED = frozenset({"args", "l", "s", "n", "x"})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _fast(source: str, act: cel.Activation) -> Any:
    run = compile_fast(source)
    if run is None:
        return _DEFERRED
    try:
        value = run(act.plain)
    except Exception:  # any exception is a deferral
        return _DEFERRED
    return value if type(value) in FAST_RESULTS else _DEFERRED  # what Expression.evaluate takes


def _engine(expr: cel.Expression, act: cel.Activation) -> tuple[str, Any]:
    try:
        return "ok", expr.evaluate_engine(act)
    except cel.CelEvalError as exc:
        return "error", exc.message


def _check(source: str, variables: dict[str, Any], declared: frozenset[str]) -> Any:
    """Assert fast == engine when the fast path answers; return the fast answer (or _DEFERRED)."""
    try:
        expr = cel.compile_expression(source, declared=declared, engine=RUST)
    except cel.CelError:
        return _DEFERRED
    act = cel.make_activation(variables, RUST)
    fast = _fast(source, act)
    kind, value = _engine(expr, act)
    if fast is not _DEFERRED:
        assert kind == "ok", f"{source!r}: fast path answered {fast!r}, the engine raised {value}"
        assert _same(fast, value), f"{source!r}: fast path {fast!r} != engine {value!r}"
        assert _same(expr.evaluate(act), value)  # the adapter returns the same through the fast path
    return fast


# --------------------------------------------------------------------------- engine facts


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("false && m.missing", False),  # && and || stop at a deciding left operand
        ("true || m.missing", True),
        ("true ? 1 : m.missing", 1),
        ("[1, 2].exists(v, v == 1 ? true : v.foo)", True),  # exists/all stop at the first deciding element
        ("[1, 2].all(v, v == 1 ? false : v.foo)", False),
        ("size('h\u00e9llo')", 6),  # UTF-8 bytes
        ("'\u00e9' > 'z' && '\U0001f600' > '\uffff'", True),  # code point order
        ("-9223372036854775808 < 0", True),
        ("'a' == 1 || null == 'a' || true == 1 || [] == m || 'x' == null", False),  # two kinds: unequal
        ("'a' in [1, 'a'] && !(1 in ['1'])", True),
        ("type(1) == int && type('a') == string && type([]) == list && type(m) == map", True),
        ("type(1.5) == double && type(null) == null_type && type(true) == bool", True),
        ("session.seen('x', '30m') == seen(session, 'x', '30m')", True),  # a helper's method form passes the receiver first
        ("'\\x41\\u00e9\\101\\U0001F600\\t' == 'A\u00e9A\U0001f600\t'", True),
    ],
)
def test_engine_facts_the_fast_path_relies_on(source: str, expected: Any) -> None:
    variables = {"m": {"a": 1}, "session": {"calls": [], "now": 0}}
    act = cel.make_activation(variables, RUST)
    expr = cel.compile_expression(source, declared={"m", "session"}, engine=RUST)
    assert _same(expr.evaluate_engine(act), expected)
    assert expr.fast and _same(_fast(source, act), expected)


@pytest.mark.parametrize(
    "source",
    [
        "[2, 1].exists(v, v == 1 ? true : v.foo)",  # the engine raises: the error is not absorbed
        "m.missing && false",  # the engine absorbs the error here: the fast path must not guess
        "m.missing || true",
        "1 == 1.0",  # an int and a double
        "1 in [1.0]",
        "[1] == [1.0]",  # lists and maps compare element-wise in the engine
        "9223372036854775807 + 1",  # overflow
        "m.filter(k, true)",  # a map's key order is the engine's
        "m.a.b",
        "[1, 2][5]",
        "!1",
        "1 ? 2 : 3",
        "args_missing_is_not_here == 1",
    ],
)
def test_unsure_cases_defer_to_the_engine(source: str) -> None:
    variables = {"m": {"a": 1, "b": 2}, "args_missing_is_not_here": None}
    act = cel.make_activation(variables, RUST)
    del act.plain["args_missing_is_not_here"]  # a variable the activation lacks
    assert _fast(source, act) is _DEFERRED
    expr = cel.compile_expression(source, declared={"m", "args_missing_is_not_here"}, engine=RUST)
    kind, value = _engine(expr, act)
    try:
        assert expr.evaluate(act) == value and kind == "ok"
    except cel.CelEvalError as exc:
        assert kind == "error" and exc.message == value  # the engine's own message


@pytest.mark.parametrize(
    "source",
    [
        "{'a': 1}.a == 1",  # map literal
        "2 - 1 == 1",
        "1u == 1u",
        "b'x' == b'x'",
        "int('1') == 1",
        "'''a''' == 'a'",
        "timestamp('2024-01-01T00:00:00Z') < now",
    ],
)
def test_unsupported_source_is_left_to_the_engine(source: str) -> None:
    expr = cel.compile_expression(source, declared={"now"}, engine=RUST)
    assert not expr.fast
    assert compile_fast(source) is None


def test_cel_python_expressions_have_no_fast_path() -> None:
    assert not cel.compile_expression("1 == 1", declared=(), engine="cel-python").fast


def test_a_string_the_engine_refuses_is_still_refused_at_activation_time() -> None:
    with pytest.raises(ValueError, match="Failed to convert"):
        cel.make_activation({"args": {"p": "a\ud800"}}, RUST)
    act = cel.make_activation({"args": {"p": "ok"}}, RUST)
    with pytest.raises(ValueError, match="Failed to convert"):
        act.extend({"response": {"text": "\udfff"}})


def test_activation_converts_for_the_engine_only_when_an_expression_defers(monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[str] = []
    original = cel.Activation.for_engine

    def spy(self: cel.Activation, engine: str) -> Any:
        converted.append(engine)
        return original(self, engine)

    monkeypatch.setattr(cel.Activation, "for_engine", spy)
    act = cel.make_activation({"args": {"path": "/etc/passwd"}}, RUST)
    act.extend({"response": {"text": "hi"}})
    fast = cel.compile_expression('has(args.path) && args.path.startsWith("/etc")', declared={"args"}, engine=RUST)
    assert fast.evaluate(act) is True and converted == []
    slow = cel.compile_expression("args.path + 'x' == args.missing", declared={"args"}, engine=RUST)
    with pytest.raises(cel.CelEvalError):
        slow.evaluate(act)
    assert converted == [RUST]
    extra = cel.compile_expression("response.text == 'hi' && 2 - 1 == 1", declared={"response"}, engine=RUST)
    assert extra.evaluate(act) is True  # the engine sees variables added before it converted


_KINDS = {"s": "a", "s1": "1", "i": 1, "i0": 0, "f": 1.5, "f1": 1.0001, "t": True, "f0": False, "z": None,
          "l": [1], "l0": [], "m": {"a": 1}, "m0": {}}  # fmt: skip


@pytest.mark.parametrize("op", ["==", "!=", "in"])
def test_every_pair_of_kinds_compares_as_the_engine_does(op: str) -> None:
    answered = 0
    for a in _KINDS:
        for b in _KINDS:
            right = f"[v.{b}]" if op == "in" else f"v.{b}"
            for source in (f"v.{a} {op} {right}", f"v.{a} {op} {json.dumps(_KINDS[b]) if op != 'in' else right}"):
                if "{" in source:
                    continue  # map literals are left to the engine
                answered += _check(source, {"v": _KINDS}, frozenset({"v"})) is not _DEFERRED
    assert answered > 250


# --------------------------------------------------------------------------- common shapes answer


COMMON = {
    'has(args.path) && args.path.contains("..")': False,
    'has(args.command) && args.command.matches("(^|[;&| ])rm\\\\s+-[a-z]*f")': True,
    'findings.exists(f, f.kind == "api_key" && f.path.startsWith("$.field"))': True,
    'principal.tier == "contractor" || "admin" in principal.roles': True,
    "has(args.query) && size(args.query) > 3": True,
    "has(args.amount) && type(args.amount) == int && args.amount > 100": True,
    '!(glob(tool.name, "read_*") || glob(lower(tool.name), "list_*"))': True,
    'args.exists(k, type(args[k]) == string && args[k].contains("://"))': True,
    "(has(args.path) ? [args.path] : []).filter(p, p.matches(r\"^/\"))[0]": "/etc/x",
    "'refused: ' + (size(findings) == 0 ? \"'\" + args.command + \"'\" : \"(not echoed)\")": "refused: (not echoed)",
    '"network_send" in call.classes && session.count("recon", "10m") >= 0': True,
    "tool.annotations.destructiveHint == true && !tool.changed": True,
    'principal.claims.fs_roots.exists(r, path_within(args.path, r))': True,
}


@pytest.mark.parametrize(("source", "expected"), COMMON.items())
def test_common_shapes_are_answered_by_the_fast_path(source: str, expected: Any) -> None:
    variables = {
        "args": {"path": "/etc/x", "command": "rm -rf /", "query": "abcd", "amount": 500, "url": "http://x"},
        "findings": [{"kind": "api_key", "path": "$.field1"}],
        "principal": {"tier": "contractor", "roles": ["admin"], "claims": {"fs_roots": ["/etc"]}},
        "tool": {"name": "write_file", "annotations": {"destructiveHint": True}, "changed": False},
        "call": {"classes": ["network_send"], "paths": {}},
        "session": {"calls": [], "now": 0},
    }
    assert _check(source, variables, DECLARED) == expected


# --------------------------------------------------------------------------- generated


_VALUES = st.recursive(
    st.none() | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX) | st.sampled_from([INT64_MIN, INT64_MAX, INT64_MAX - 1, 0, -1, 2**63, 2**64])
    | st.floats(allow_nan=True) | st.sampled_from([5.0, -0.0, 0.5])
    | st.text(max_size=6) | st.sampled_from(["", "a", "/etc/passwd", "h\u00e9llo", "\U0001f600", "A"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["a", "b", "path", "\u00e9"]), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
_ESCAPES = ["\\n", "\\t", "\\x41", "\\u00e9", "\\U0001F600", "\\101", "\\'", '\\"', "\\\\", "\\?"]


@st.composite
def _string_literal(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        text = draw(st.text(alphabet=st.characters(blacklist_characters="\"\\\n\r", blacklist_categories=["Cs"]), max_size=5))
        return ('r"' if draw(st.booleans()) else '"') + text + '"'
    pieces = draw(st.lists(st.sampled_from(_ESCAPES) | st.text(alphabet="ab/\u00e9 .", min_size=1, max_size=2), max_size=4))
    return '"' + "".join(pieces) + '"'


_ATOMS = (
    _string_literal()
    | st.integers(INT64_MIN + 1, INT64_MAX).map(str) | st.sampled_from(["-9223372036854775808", "0", "1", "0x1F", "1.5", "1e3", ".5"])
    | st.sampled_from(["true", "false", "null", "[]", "x", "s", "n", "l", "args"])
    | st.sampled_from(["args.a", "args.b", "args.path", 'args["a"]', "args['\u00e9']", "l[0]", "l[1]", "l[n]"])
    | st.sampled_from(["has(args.a)", "has(args.path)", "size(s)", "size(l)", "size(args)", "type(x)", "type(args.a)"])
    | st.sampled_from(["string", "int", "double", "bool", "list", "map", "null_type"])
)  # fmt: skip


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "+", "&&", "||"])
    return (
        st.builds(lambda a: f"!({a})", inner)
        | st.builds(lambda a: f"-({a})", inner)
        | st.builds(lambda a, op, b: f"({a}) {op} ({b})", inner, binary, inner)
        | st.builds(lambda c, a, b: f"({c}) ? ({a}) : ({b})", inner, inner, inner)
        | st.builds(lambda a, b: f"[{a}, {b}]", inner, inner)
        | st.builds(lambda a, b: f"({a})[{b}]", inner, inner)
        | st.builds(lambda a, m, b: f"({a}).{m}({b})", inner, st.sampled_from(["startsWith", "endsWith", "contains", "matches", "glob", "path_within"]), inner)
        | st.builds(lambda f, a: f"{f}({a})", st.sampled_from(["size", "lower", "upper", "path_normalize", "type"]), inner)
        | st.builds(lambda a, m, b: f"({a}).{m}(x, {b})", inner, st.sampled_from(["exists", "all", "exists_one", "filter", "map"]), inner)
    )  # fmt: skip


_EXPRESSIONS = st.recursive(_ATOMS, _extend, max_leaves=10)
_ACTIVATIONS = st.fixed_dictionaries({
    "args": st.dictionaries(st.sampled_from(["a", "b", "path", "\u00e9"]), _VALUES, max_size=4),
    "l": st.lists(_VALUES, max_size=4), "s": st.text(max_size=8), "n": st.integers(-2, 5), "x": _VALUES,
})  # fmt: skip


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(source=_EXPRESSIONS, variables=_ACTIVATIONS)
def test_generated_expressions_agree_with_the_engine(source: str, variables: dict[str, Any]) -> None:
    try:
        cel.compile_expression(source, declared=GEN_DECLARED, engine=RUST)
    except cel.CelError:
        assume(False)
    _check(source, variables, GEN_DECLARED)


# Typed generation: mostly well-typed expressions, so the fast path answers and is compared often
# (the untyped grammar above mostly probes deferral). `y` is a string variable and the variable of
# the comprehensions over `ls`, a list of strings; `args.b` is sometimes missing.
_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=6) | st.sampled_from(["", "a", "/etc", "Aé"])
_STR_ATOMS = _string_literal() | st.sampled_from(["s", "y", "args.a", "args.b", 'args["a"]', "ls[0]"])
_INT_ATOMS = (st.integers(INT64_MIN + 1, INT64_MAX).map(str) | st.sampled_from(["n", "0", "1", "-1", "9223372036854775807"]))


def _typed(str_e: st.SearchStrategy[str], int_e: st.SearchStrategy[str]) -> tuple[st.SearchStrategy[str], ...]:
    strs = st.recursive(str_e, lambda i: st.builds(lambda a, b: f"({a} + {b})", i, i)
                        | st.builds(lambda f, a: f"{f}({a})", st.sampled_from(["lower", "upper", "path_normalize"]), i),
                        max_leaves=3)
    ints = st.recursive(int_e, lambda i: st.builds(lambda a, b: f"({a} + {b})", i, i) | st.builds(lambda a: f"-({a})", i)
                        | st.builds(lambda a: f"size({a})", strs) | st.just("size(ls)"), max_leaves=3)
    lists = st.sampled_from(["ls", "[]", "args.c"]) | st.builds(lambda a, b: f"[{a}, {b}]", strs, strs)
    atoms = (
        st.sampled_from(["true", "false", "has(args.b)", "type(x) == string", "type(x) == int", "x == null"])
        | st.builds(lambda a, op, b: f"{a} {op} {b}", strs, st.sampled_from(["==", "!=", "<", ">=", "in"]).map(
            lambda op: op), strs).filter(lambda e: " in " not in e)
        | st.builds(lambda a, op, b: f"{a} {op} {b}", ints, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), ints)
        | st.builds(lambda a, b: f"{a} in {b}", strs, lists)
        | st.builds(lambda a, m, b: f"{a}.{m}({b})", strs, st.sampled_from(["startsWith", "endsWith", "contains", "matches", "glob"]), strs)
        | st.builds(lambda a, b: f"path_within({a}, {b})", strs, strs)
        | st.builds(lambda a: f"x == {a}", strs | ints)
    )  # fmt: skip

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return (
            st.builds(lambda a: f"!({a})", inner)
            | st.builds(lambda a, op, b: f"({a}) {op} ({b})", inner, st.sampled_from(["&&", "||", "==", "!="]), inner)
            | st.builds(lambda c, a, b: f"({c}) ? ({a}) : ({b})", inner, inner, inner)
            | st.builds(lambda lst, m, b: f"{lst}.{m}(y, {b})", lists, st.sampled_from(["exists", "all", "exists_one"]), inner)
            | st.builds(lambda lst, b: f"size({lst}.filter(y, {b})) > 0", lists, inner)
            | st.builds(lambda lst, a, b: f"{lst}.map(y, {a})[0] == {b}", lists, strs, strs)
        )

    return strs, ints, st.recursive(atoms, extend, max_leaves=6)


_BOOLS = _typed(_STR_ATOMS, _INT_ATOMS)[2]
_TYPED_ACTIVATIONS = st.fixed_dictionaries({
    "args": st.fixed_dictionaries({"a": _TEXT}, optional={"b": _TEXT, "c": st.lists(_TEXT, max_size=3)}),
    "s": _TEXT, "y": _TEXT, "n": st.integers(INT64_MIN, INT64_MAX) | st.integers(-3, 3),
    "ls": st.lists(_TEXT, min_size=1, max_size=4), "x": _VALUES,
})  # fmt: skip
TYPED_DECLARED = frozenset({"args", "s", "y", "n", "ls", "x"})


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(source=_BOOLS, variables=_TYPED_ACTIVATIONS)
def test_generated_typed_expressions_agree_with_the_engine(source: str, variables: dict[str, Any]) -> None:
    try:
        cel.compile_expression(source, declared=TYPED_DECLARED, engine=RUST)
    except cel.CelError:
        assume(False)
    _check(source, variables, TYPED_DECLARED)


def test_generated_expressions_are_mostly_answered() -> None:
    """Over a fixed sample, most compiled expressions answer fast (the path is not a no-op)."""
    answered = total = 0
    variables = {"args": {"a": "x", "path": "/etc/p"}, "l": [1, 2, 3], "s": "abc", "n": 1, "x": "a"}
    sources = [
        "args.a == 'x' && size(l) > 2", "l.exists(x, x > 2)", "'a' + s == 'aabc'", "s.startsWith(args.a) || n in l",
        "l.filter(x, x >= n).map(x, x + 1)[0] == 2", "has(args.b) ? args.b : lower(args.path)", "type(x) == string",
        "l.all(x, x < 4) && l.exists_one(x, x == 2)", "args.path.matches('^/etc') && glob(args.path, '/etc/*')",
        "[s, args.a][1] in ['x', 'y']", "-n < 0 && !(n > 1)", "path_within(args.path, '/etc')",
    ]
    for source in sources:
        total += 1
        answered += _check(source, variables, GEN_DECLARED) is not _DEFERRED
    assert answered == total


# --------------------------------------------------------------------------- shipped rules


def test_every_shipped_expression_compiles_to_the_fast_path() -> None:
    """All `when:` and message expressions in rules/ and policies/ (none is left to the engine)."""
    assert len(SHIPPED) >= 60
    slow = [where for where, source in SHIPPED if compile_fast(source) is None]
    assert slow == []


def test_shipped_expressions_agree_over_every_rule_test_activation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the shipped rule tests, keep every activation they build, and evaluate every shipped
    expression both ways over each one (fast == engine whenever the fast path answers)."""
    seen: dict[int, cel.Activation] = {}
    own: list[tuple[cel.Expression, cel.Activation]] = []
    original = cel.Expression.evaluate

    def keep(self: cel.Expression, activation: cel.Activation) -> Any:
        seen.setdefault(id(activation), activation)
        own.append((self, activation))
        return original(self, activation)

    monkeypatch.setattr(cel.Expression, "evaluate", keep)
    report = run_tests([ROOT / "rules"], engine=RUST)
    monkeypatch.undo()
    assert report.cases and all(c.passed for c in report.cases)
    activations = [a for a in seen.values() if a.fast]
    assert len(activations) >= 100
    exprs = {source: cel.compile_expression(source, declared=DECLARED, engine=RUST) for _, source in SHIPPED}
    answered = compared = 0
    for act in activations:
        for source, expr in exprs.items():
            if not expr.references <= act.plain.keys():
                continue
            compared += 1
            fast = _fast(source, act)
            kind, value = _engine(expr, act)
            if fast is not _DEFERRED:
                answered += 1
                assert kind == "ok" and _same(fast, value), (source, json.dumps(act.plain, default=str)[:500], fast, value)
    assert compared > 10_000 and answered > compared / 2, (answered, compared)  # many lack what others' rules read
    own_fast = [(e.source, a) for e, a in own if e.engine == RUST and a.fast]
    deferred = [(source, a.plain) for source, a in own_fast if _fast(source, a) is _DEFERRED]
    assert len(own_fast) > 300 and len(deferred) < len(own_fast) / 10, deferred[:3]


def test_now_is_left_to_the_engine() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    act = cel.make_activation({"now": now}, RUST)
    assert _fast("now", act) is _DEFERRED
    assert cel.compile_expression("now", declared={"now"}, engine=RUST).evaluate(act) == now
