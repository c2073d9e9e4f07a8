"""gateway.policy.cel: compile errors, reference checks, helpers, error types and activation reuse."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

import pytest

from gateway.policy import cel

ENGINES = cel.available_engines()
CALL = frozenset({"principal", "tool", "args", "request", "session", "findings", "now", "call"})
NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
VARS: dict[str, Any] = {
    "principal": {"id": "alice", "tier": 2, "roles": ["dev"]},
    "tool": {"name": "write_file", "annotations": {"destructiveHint": True}},
    "args": {"path": "/srv/data/../etc/passwd", "n": 5.0, "f": 2.5, "items": [{"p": 1}, {"q": 2}]},
    "request": {},
    "session": {"recent": []},
    "findings": [],
    "now": NOW,
}


def run(source: str, engine: str, variables: dict[str, Any] | None = None) -> Any:
    expr = cel.compile_expression(source, declared=CALL, engine=engine)
    return expr.evaluate(cel.make_activation(VARS if variables is None else variables, engine))


def test_engine_selection() -> None:
    assert cel.ENGINES == ("cel-python", "common-expression-language")
    assert "cel-python" in ENGINES
    expected = "common-expression-language" if len(ENGINES) == 2 else "cel-python"
    assert cel.default_engine() == expected
    with pytest.raises(ValueError, match="unknown CEL engine"):
        cel.compile_expression("true", declared=(), engine="nope")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("source", "line", "column"),
    [("1 +", 1, None), ("args.path &&\n  (true", 2, None), ('"abc', 1, 1), ("a.?b", 1, None)],
)
def test_syntax_errors_carry_position(engine: str, source: str, line: int, column: int | None) -> None:
    with pytest.raises(cel.CelSyntaxError) as info:
        cel.compile_expression(source, declared={"a", "args"}, engine=engine)
    assert info.value.line == line
    assert info.value.column is not None and info.value.column >= 1
    if column is not None:
        assert info.value.column == column
    assert isinstance(info.value, cel.CelError) and info.value.message


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("args.l.map(x, x > 1, x * 2)", "map()"),
        ("args.l.exists(k, v, v > 1)", "exists()"),
        ("args.l.all(1, true)", None),
        ("has(args)", "has"),
        ('args.cmd.startswith("rm")', "startswith"),
        ('lowerAscii(args.cmd) == "x"', "lowerAscii"),
    ],
)
def test_shape_and_function_checks(engine: str, source: str, needle: str | None) -> None:
    with pytest.raises(cel.CelSyntaxError) as info:
        cel.compile_expression(source, declared=CALL, engine=engine)
    if needle:
        assert needle in info.value.message


@pytest.mark.parametrize("engine", ENGINES)
def test_undeclared_names(engine: str) -> None:
    with pytest.raises(cel.CelUndeclared) as info:
        cel.compile_expression('response.text.contains("x") || argz.a', declared=CALL, engine=engine)
    assert info.value.names == ("argz", "response")
    assert (info.value.line, info.value.column) == (1, 1)
    ok = cel.compile_expression('response.text.contains("x")', declared=CALL | {"response"}, engine=engine)
    assert ok.references == {"response"}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("source", "refs"),
    [
        ("args.items.all(x, x.p > 0)", {"args"}),
        ("args.items.exists(i, i.p == principal.tier)", {"args", "principal"}),
        ("[1, 2].map(y, y * 2).filter(z, z > 2).size() > 0", set()),
        ("args.items.exists(args, args.p == 1) && has(args.path)", {"args"}),
        ("[1].all(x, x > 0) && tool.name == 'x'", {"tool"}),
        ("type(args.n) == int && {'k': now}.k > now", {"args", "now"}),
        ("glob(tool.name, 'w*')", {"tool"}),
        ("'a.b' + \"args\" + r'x' == ''", set()),
    ],
)
def test_references(engine: str, source: str, refs: set[str]) -> None:
    assert cel.compile_expression(source, declared=CALL, engine=engine).references == refs


@pytest.mark.parametrize("engine", ENGINES)
def test_comprehension_var_leaking_out_is_undeclared(engine: str) -> None:
    with pytest.raises(cel.CelUndeclared) as info:
        cel.compile_expression("[1].all(x, x > 0) && x", declared=CALL, engine=engine)
    assert info.value.names == ("x",)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('glob(tool.name, "write_*")', True),
        ('glob(tool.name, "Write_*")', False),
        ('glob("a/b/c", "a*c")', True),
        ('path_normalize("//srv//a/./b/../c/")', "/srv/a/c"),
        ('path_normalize("a/../../b")', "../b"),
        ('path_normalize("/../etc")', "/etc"),
        ("path_normalize(args.path)", "/srv/etc/passwd"),
        ('path_within(args.path, "/srv/data")', False),
        ('path_within("/srv/root/x/../y", "/srv/root")', True),
        ('path_within("/srv/root", "/srv/root/")', True),
        ('path_within("/srv/rootx", "/srv/root")', False),
        ('path_within("/x", "/")', True),
        ('path_within("x", "/")', False),
        ('lower("ÀB")', "àb"),
        ('upper("straße")', "STRASSE"),
    ],
)
def test_helpers(engine: str, source: str, expected: Any) -> None:
    assert run(source, engine) == expected


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "source",
    [
        "args.missing",
        "args.items.all(i, i.p > 0)",
        "1 / 0",
        "9223372036854775807 + 1",
        '"a" + 1',
        'args.path.matches("[")',
        "glob(1, 'x')",
        "path_within(args.path)",
        'duration("1h")',
        'b"x"',
        "has(args.missing.x)",
    ],
)
def test_eval_errors_are_cel_eval_error(engine: str, source: str) -> None:
    with pytest.raises(cel.CelEvalError) as info:
        run(source, engine)
    assert info.value.message and len(info.value.message) <= 300


def test_a_failing_helper_is_an_error_and_not_a_stderr_line() -> None:
    """`dharma test` used to print the Rust engine's own warning (Python's last-resort log handler)
    for each helper that raised; a fresh process shows it, pytest's log capture would hide it."""
    code = (
        "from gateway.policy import cel\n"
        "expr = cel.compile_expression('sensitive_path(args.n)', declared={'args'}, engine='common-expression-language')\n"
        "try:\n"
        "    expr.evaluate(cel.make_activation({'args': {'n': 5}}, 'common-expression-language'))\n"
        "except cel.CelEvalError as exc:\n"
        "    print(exc.message)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "sensitive_path" in done.stdout, done
    assert done.stderr == "", done.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_results_are_plain_python(engine: str) -> None:
    value = run('{"a": [1, 2.5, null, true, "s"], "t": now, "n": args.n}', engine)
    assert value == {"a": [1, 2.5, None, True, "s"], "t": NOW, "n": 5}
    assert type(value["a"][3]) is bool and type(value["n"]) is int and type(value["t"]) is dt.datetime
    assert type(run("args.n == 5", engine)) is bool
    assert run("args.f", engine) == 2.5
    assert run('args.n > 4 ? "big" : "small"', engine) == "big"  # non-bool is not an error here


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('now > timestamp("2020-01-01T00:00:00Z")', True),
        ('now < timestamp("2020-01-01T00:00:00Z")', False),
        ('now - timestamp("2024-05-01T11:00:00Z") == duration("1h")', True),
        ("now.getHours()", 12),
        ('now + duration("30m")', NOW + dt.timedelta(minutes=30)),
    ],
)
def test_now_timestamps(engine: str, source: str, expected: Any) -> None:
    assert run(source, engine) == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_now_in_other_zone_is_utc(engine: str) -> None:
    east = dt.timezone(dt.timedelta(hours=2))
    variables = {**VARS, "now": dt.datetime(2024, 5, 1, 14, 0, tzinfo=east)}
    assert run("now.getHours()", engine, variables) == 12
    assert run("now", engine, variables) == NOW


@pytest.mark.parametrize("engine", ENGINES)
def test_activation_is_reused_across_expressions(engine: str) -> None:
    act = cel.make_activation(VARS, engine)
    native = act.for_engine(engine)
    sources = ["args.n == 5", 'tool.name.startsWith("write")', "principal.tier >= 2", "size(findings) == 0"]
    exprs = [cel.compile_expression(s, declared=CALL, engine=engine) for s in sources]
    assert [e.evaluate(act) for e in exprs] == [True, True, True, True]
    assert act.for_engine(engine) is native  # converted once, not per rule


def test_activation_serves_both_engines() -> None:
    act = cel.make_activation(VARS)
    for engine in ENGINES:
        assert cel.compile_expression("args.n == 5", declared=CALL, engine=engine).evaluate(act) is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5.0, 5), (-0.0, 0), (2.5, 2.5), (2.0**60, 2.0**60), (2**64, float(2**64)), (True, True)],
)
def test_activation_number_normalisation(value: Any, expected: Any) -> None:
    out = cel.make_activation({"args": {"v": value}}, "cel-python")
    expr = cel.compile_expression("args.v", declared={"args"}, engine="cel-python")
    result = expr.evaluate(out)
    assert result == expected and type(result) is type(expected)


def test_activation_rejects_non_json() -> None:
    with pytest.raises(TypeError):
        cel.make_activation({"args": {"x": object()}})
    with pytest.raises(TypeError):
        cel.make_activation({"args": {1: "x"}})
    with pytest.raises(ValueError, match="timezone-aware"):
        cel.make_activation({"now": dt.datetime(2024, 1, 1)})


@pytest.mark.parametrize("engine", ENGINES)
def test_smoothed_celpy_quirks(engine: str) -> None:
    # heterogeneous numeric equality/ordering, strict has(), no negative or string indexing
    assert run("1 == 1.0 && 1 < 1.5 && !(1 == 'a') && 5 in [5.0]", engine) is True
    for source in ("has(args.missing.x)", "args.items[-1]", '"abc"[0]', "2.5 + 1", "1 + 1u"):
        with pytest.raises(cel.CelEvalError):
            run(source, engine)


def test_errors_render_position() -> None:
    err = cel.CelSyntaxError("bad", line=2, column=3)
    assert str(err) == "bad (line 2, column 3)"
    assert str(cel.CelEvalError("boom")) == "boom"
    und = cel.CelUndeclared(["b", "a", "b"])
    assert und.names == ("a", "b") and und.line is None


@pytest.mark.parametrize("engine", cel.available_engines())
def test_activation_extend_adds_variables_without_touching_existing_ones(engine):
    act = cel.make_activation({"args": {"n": 1}}, engine)
    expr = cel.compile_expression("args.n == 1 && response.ok == true", declared={"args", "response"}, engine=engine)
    with pytest.raises(cel.CelEvalError):
        expr.evaluate(act)
    act.extend({"response": {"ok": True}, "args": {"n": 2}})
    assert expr.evaluate(act) is True  # `args` kept its value; `response` was added


@pytest.fixture
def count_segments():
    """A helper registered in the one registry for this test only: it returns an int, not a bool or string."""
    cel.register_helper("count_segments", lambda p: len([s for s in p.split("/") if s]), int)
    cel.register_helper("segments", lambda p: [s for s in p.split("/") if s], list)
    cel.register_helper("claims_int", lambda p: p, int)
    yield
    for name in ("count_segments", "segments", "claims_int"):
        cel.unregister_helper(name)


@pytest.mark.parametrize("engine", cel.ENGINES)
def test_registered_helper_keeps_its_result_type_on_both_engines(engine: str, count_segments: None) -> None:
    if engine not in ENGINES:
        pytest.fail(f"{engine} is not installed: the helper registry must be tested on both engines")
    assert run('count_segments("a/b/c") == 3', engine) is True
    assert run('count_segments("a/b") + 1 == 3', engine) is True
    assert run('count_segments("a/b/c")', engine) == 3 and type(run('count_segments("a/b/c")', engine)) is int
    assert run('segments("a/b") == ["a", "b"]', engine) is True
    assert run('size(segments("/srv/x/y")) == 3', engine) is True
    assert run('path_within("/srv/x", "/srv") && lower("A") == "a"', engine) is True
    with pytest.raises(cel.CelEvalError):
        run('claims_int("not an int") == 1', engine)  # the declared result type is checked


def test_helper_registry_refuses_bad_registrations(count_segments: None) -> None:
    with pytest.raises(ValueError, match="already registered"):
        cel.register_helper("count_segments", len, int)
    with pytest.raises(ValueError, match="not an identifier"):
        cel.register_helper("count-segments", len, int)
    with pytest.raises(ValueError, match="declares result type"):
        cel.register_helper("as_bytes", bytes, bytes)
    with pytest.raises(cel.CelSyntaxError, match="unknown function 'not_registered'"):
        cel.compile_expression('not_registered("a")', declared=CALL)


def test_rust_engine_loads_without_the_cel_package_cli() -> None:
    """The Rust engine is loaded without `cel`'s interactive CLI (typer, prompt_toolkit, rich:
    start-up the gateway never uses), evaluates as usual, and a later `import cel` reuses it."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("cel")
    probe = (
        "import sys\n"
        "from gateway.policy import cel as c\n"
        "e = c.compile_expression('args.n + 1 == 3', declared=['args'], engine='common-expression-language')\n"
        "print('RESULT', e.evaluate(c.make_activation({'args': {'n': 2}}, 'common-expression-language')))\n"
        "print('CLI', sorted(m for m in ('typer', 'prompt_toolkit', 'pygments', 'cel.cli') if m in sys.modules))\n"
        "import cel\n"
        "print('SAME', cel.compile is sys.modules['cel.cel'].compile)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout
    assert "RESULT True" in out and "CLI []" in out and "SAME True" in out, out
