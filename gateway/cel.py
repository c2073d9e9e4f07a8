"""The one adapter over the CEL engines: compile, check references, evaluate, normalise.

Two engines sit behind one small interface: ``cel-python`` (module ``celpy``, pure Python,
the reference engine) and ``common-expression-language`` (module ``cel``, Rust, the fast
engine, preferred when installed). Nothing else in the project imports either module.

What the adapter guarantees, whichever engine runs:

* Arithmetic never mixes numeric kinds (``2.5 + 1``, ``1 + 1u`` are errors on both).
* Compile errors are `CelSyntaxError` with a 1-based line/column inside the expression.
  Macros are checked the same way for both engines: ``all``/``exists``/``exists_one``/
  ``filter``/``map`` take exactly ``(var, expr)`` (the 3-argument ``map`` crashes cel-python,
  issue #194, and two-variable comprehensions exist in neither engine); ``has()`` takes a
  field selection ``e.f``. Calls to functions outside `FUNCTIONS` (the ones both engines
  provide, plus our helpers) are compile errors too, so a typo such as ``startswith`` fails
  at load time instead of failing closed on every call.
* `Expression.references` is the set of free top-level names (comprehension variables are
  not references); names outside ``declared`` raise `CelUndeclared`. cel-python walks the
  lark tree; for the Rust engine a scope-aware token scan is intersected with
  ``Program.variables()`` (which also lists comprehension variables).
* `Expression.evaluate` returns plain Python (bool/int/float/str/list/dict/None/aware UTC
  datetime) and raises `CelEvalError` only. Durations, bytes and type values are not
  JSON-like and become `CelEvalError`; a non-boolean result is not an error here.
* `make_activation` converts the call's variables once; the same `Activation` serves every
  rule of the call. Integral floats become ints (JSON ``5.0`` is ``5``: cel-python has no
  heterogeneous equality, so ``args.n == 5`` with ``5.0`` would raise there, and ``5.0 + 1``
  is a no-overload error in both engines); ints outside int64 become floats.

Smoothed quirks of cel-python (custom runner and operator overrides): heterogeneous numeric
equality and ordering (``1 == 1.0``, ``1 < 1.5``, ``1 == 'a'`` is false), ``has()`` on a
missing parent is an error (spec) instead of false, negative list indexes and string
indexing are errors. Quirks that cannot be smoothed (Rust built-ins cannot be overridden)
are listed in docs/cel.md: ``size()`` of a non-ASCII string (Rust counts UTF-8 bytes),
``string()`` of doubles/durations/timestamps/bools, map iteration order (random per process
in Rust), ``42 || false``, time-zone accessors and ``int(timestamp)`` (absent in Rust),
triple-quoted strings with newlines (cel-python drops the newline).

Helpers (function-call style, both engines): ``glob(s, pattern)`` (fnmatch, case-sensitive,
``*`` also matches ``/``), ``path_normalize(p)``, ``path_within(p, root)``, ``lower(s)``,
``upper(s)`` (Unicode-aware).

No I/O, no environment reads. The one piece of module-level state is the lazily built
cel-python `Environment` (it builds an LALR parser in ~0.3 s and calls
``sys.setrecursionlimit(2500)``), created on first use of that engine.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import functools
import importlib.util
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENGINES: tuple[str, ...] = ("cel-python", "common-expression-language")
_CELPY, _RUST = ENGINES
_MODULES = {_CELPY: "celpy", _RUST: "cel"}

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EXACT_FLOAT_INT = 2**53
_MAX_MESSAGE = 300

_MACROS = frozenset({"all", "exists", "exists_one", "filter", "map"})
#: Type denotations (``type(x) == string``): identifiers, but never variables.
_TYPE_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)
HELPERS: tuple[str, ...] = ("glob", "lower", "path_normalize", "path_within", "upper")
#: Functions and macros an expression may call: present in both engines, plus our helpers.
FUNCTIONS: frozenset[str] = frozenset(
    {
        "has", "dyn", "size", "contains", "startsWith", "endsWith", "matches",
        "int", "uint", "double", "string", "bytes", "timestamp", "duration", "type",
        "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek",
        "getDayOfYear", "getHours", "getMinutes", "getSeconds", "getMilliseconds",
    }
    | _MACROS
    | set(HELPERS)
)  # fmt: skip


# --------------------------------------------------------------------------- errors


class CelError(Exception):
    """Base of every error this module raises; ``line``/``column`` are 1-based or None."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column

    def __str__(self) -> str:
        if self.line is None:
            return self.message
        return f"{self.message} (line {self.line}, column {self.column})"


class CelSyntaxError(CelError):
    """The expression does not compile (syntax, macro shape, unknown function)."""


class CelUndeclared(CelError):
    """The expression references top-level variables that are not declared."""

    def __init__(
        self, names: Iterable[str], *, line: int | None = None, column: int | None = None
    ):
        self.names: tuple[str, ...] = tuple(sorted(set(names)))
        super().__init__(f"undeclared reference to {', '.join(self.names)}", line=line, column=column)


class CelEvalError(CelError):
    """Evaluation failed: missing key, no overload, overflow, helper failure, non-JSON result."""


# --------------------------------------------------------------------------- engines


@functools.cache
def available_engines() -> tuple[str, ...]:
    """Return the installed engines, in `ENGINES` order."""
    return tuple(e for e in ENGINES if importlib.util.find_spec(_MODULES[e]) is not None)


def default_engine() -> str:
    """Return the fast engine if it is installed, else the reference engine."""
    return _RUST if _RUST in available_engines() else _CELPY


def _resolve(engine: str | None) -> str:
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise ValueError(f"unknown CEL engine {engine!r}; expected one of {ENGINES}")
    if engine not in available_engines():
        raise ValueError(f"CEL engine {engine!r} is not installed")
    return engine


def _describe(exc: BaseException) -> str:
    """Turn an engine exception into one short line (cel-python packs a tuple into args)."""
    args = exc.args
    if type(exc).__name__ == "CELEvalError" and args and isinstance(args[0], str):
        detail = args[2] if len(args) > 2 and isinstance(args[2], tuple) else ()
        text = "; ".join([args[0], *(str(d) for d in detail if d != args[0])])
    else:
        text = f"{type(exc).__name__}: {exc}"
    return _short(text.replace("\n", " "))


def _short(text: str) -> str:
    text = text.split(" (in activation", 1)[0]  # cel-python dumps the whole activation
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# --------------------------------------------------------------------------- helpers


def _need_str(fn: str, *values: object) -> None:
    for v in values:
        if not isinstance(v, str):
            raise TypeError(f"{fn}() expects string arguments, got {type(v).__name__}")


def glob(s: str, pattern: str) -> bool:
    """Match ``s`` against a shell glob: case-sensitive, and ``*`` also matches ``/``."""
    _need_str("glob", s, pattern)
    return fnmatch.fnmatchcase(s, pattern)


def path_normalize(p: str) -> str:
    """Normalise a POSIX path lexically: collapse ``//``, resolve ``.``/``..``, keep a leading ``/``."""
    _need_str("path_normalize", p)
    return posixpath.normpath(re.sub(r"/{2,}", "/", p)) if p else "."


def path_within(p: str, root: str) -> bool:
    """Return whether normalised ``p`` is ``root`` or below it (``/srv/rootx`` is not in ``/srv/root``)."""
    _need_str("path_within", p, root)
    np, nr = path_normalize(p), path_normalize(root)
    if nr == ".":
        return not np.startswith("/") and np != ".." and not np.startswith("../")
    return np == nr or np.startswith(nr if nr == "/" else nr + "/")


def lower(s: str) -> str:
    """Lower-case ``s`` (Unicode-aware, unlike cel-go's ``lowerAscii``)."""
    _need_str("lower", s)
    return s.lower()


def upper(s: str) -> str:
    """Upper-case ``s`` (Unicode-aware)."""
    _need_str("upper", s)
    return s.upper()


@functools.lru_cache(maxsize=4096)
def _regex(pattern: str) -> Any:
    import re2

    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


def regex_matches(s: str, pattern: str) -> bool:
    """`matches()` for both engines: RE2 (as the CEL spec says), each pattern compiled once.

    The Rust engine recompiles the pattern on every evaluation (70-900 µs a call); routing
    both engines through one cached RE2 also makes their regex dialects identical.
    """
    _need_str("matches", s, pattern)
    return _regex(pattern).search(s) is not None


_RE_MATCHES = "_dharma_matches"

_HELPER_FNS: dict[str, Callable[..., Any]] = {
    "glob": glob,
    "lower": lower,
    "path_normalize": path_normalize,
    "path_within": path_within,
    "upper": upper,
}


# --------------------------------------------------------------------------- values


def _normalise(value: Any) -> Any:
    """Copy JSON-like input into the one shape both engines read identically."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= _EXACT_FLOAT_INT:
            return int(value)
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"activation map keys must be strings, got {type(k).__name__}")
            out[k] = _normalise(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("activation datetimes must be timezone-aware")
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, dt.timedelta):
        return value
    raise TypeError(f"activation values must be JSON-like, got {type(value).__name__}")


_CELPY_TYPE_NAMES = {
    "IntType": "int", "UintType": "uint", "DoubleType": "double", "BoolType": "bool",
    "StringType": "string", "BytesType": "bytes", "ListType": "list", "MapType": "map",
    "NoneType": "null_type", "TypeType": "type",
    "TimestampType": "google.protobuf.Timestamp", "DurationType": "google.protobuf.Duration",
}  # fmt: skip


def _plain(value: Any) -> Any:
    """Convert an engine result to plain Python, or raise CelEvalError if it is not JSON-like."""
    if value is None:
        return None
    if isinstance(value, bool) or type(value).__name__ == "BoolType":  # celpy's is an int
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dt.datetime):
        v = value.astimezone(dt.timezone.utc)
        return dt.datetime(
            v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, tzinfo=dt.timezone.utc
        )
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            key = _plain(k)
            if not isinstance(key, (str, int)):
                raise CelEvalError(f"result map key of type {type(k).__name__} is not JSON-like")
            out[key] = _plain(v)
        return out
    if isinstance(value, type) and value.__name__ in _CELPY_TYPE_NAMES:
        return _CELPY_TYPE_NAMES[value.__name__]  # cel-python's type(x); Rust returns the name
    kind = "duration" if isinstance(value, dt.timedelta) else type(value).__name__
    raise CelEvalError(f"result of type {kind} is not JSON-like")


class Activation:
    """The variables of one call, converted for an engine once and reused by every rule."""

    __slots__ = ("_plain", "_converted")

    def __init__(self, plain: dict[str, Any]) -> None:
        self._plain = plain
        self._converted: dict[str, Any] = {}

    def for_engine(self, engine: str) -> Any:
        """Return the engine-native form, converting on first use for that engine."""
        try:
            return self._converted[engine]
        except KeyError:
            native = _celpy_context(self._plain) if engine == _CELPY else _rust_context(self._plain)
            self._converted[engine] = native
            return native


def make_activation(variables: Mapping[str, Any], engine: str | None = None) -> Activation:
    """Build the activation for one call; converts eagerly for ``engine``.

    Raises:
        TypeError, ValueError: a value is not JSON-like or a datetime is naive.
    """
    act = Activation({name: _normalise(v) for name, v in variables.items()})
    act.for_engine(_resolve(engine))
    return act


# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled CEL expression bound to one engine."""

    source: str
    engine: str
    references: frozenset[str]
    _run: Callable[[Any], Any] = field(repr=False, compare=False)

    def evaluate(self, activation: Activation) -> Any:
        """Evaluate against ``activation``; return plain Python or raise CelEvalError."""
        try:
            raw = self._run(activation.for_engine(self.engine))
            if raw is True or raw is False:
                return raw  # the common case: skip normalisation
        except CelError:
            raise
        except Exception as exc:
            raise CelEvalError(_describe(exc)) from exc
        except BaseException as exc:  # pyo3 PanicException derives from BaseException
            if type(exc).__name__ != "PanicException":
                raise
            raise CelEvalError(_short(f"engine panic: {exc}")) from exc
        return _plain(raw)


def compile_expression(
    source: str, *, declared: Iterable[str], engine: str | None = None
) -> Expression:
    """Compile ``source`` for ``engine`` and check its references against ``declared``.

    Raises:
        CelSyntaxError: the expression does not parse, misuses a macro or calls an unknown function.
        CelUndeclared: it references top-level names outside ``declared``.
    """
    engine = _resolve(engine)
    if engine == _CELPY:
        run, refs, funcs = _celpy_compile(source)
    else:
        run, refs, funcs = _rust_compile(source)
    for name, (line, col) in funcs:
        if name not in FUNCTIONS:
            raise CelSyntaxError(f"unknown function {name!r}", line=line, column=col)
    allowed = frozenset(declared)
    missing = {n: pos for n, pos in refs.items() if n not in allowed}
    if missing:
        first = min(missing.values())
        raise CelUndeclared(missing, line=first[0], column=first[1])
    return Expression(source=source, engine=engine, references=frozenset(refs), _run=run)


# --------------------------------------------------------------------------- shared checks

_Pos = tuple[int, int]
_Refs = dict[str, _Pos]
_Funcs = list[tuple[str, _Pos]]
_Compiled = tuple[Callable[[Any], Any], _Refs, _Funcs]


def _bad_macro(name: str, pos: _Pos) -> CelSyntaxError:
    return CelSyntaxError(
        f"{name}() takes exactly (variable, expression); map(x, p, t) and two-variable "
        "comprehensions are not supported by both engines",
        line=pos[0],
        column=pos[1],
    )


# --------------------------------------------------------------------------- cel-python


@functools.cache
def _celpy_env() -> tuple[Any, dict[str, Any]]:
    """Build the one cel-python Environment and its function table (slow; once per process)."""
    import celpy
    from celpy import celtypes
    from celpy.evaluation import CELEvalError as PyEvalError
    from celpy.evaluation import Evaluator, base_functions

    class _StrictEvaluator(Evaluator):  # type: ignore[misc]
        def macro_has_eval(self, exprlist: Any) -> Any:
            # Spec: has(e.f) is an error when e is an error or not a map (celpy says false).
            member_tree, name = _lark_chain_to(exprlist.children[0], "member_dot").children
            member = self.visit(member_tree)
            if isinstance(member, PyEvalError):
                return member
            if isinstance(member, celtypes.MapType):
                return celtypes.BoolType(celtypes.StringType(name.value) in member)
            return PyEvalError(f"has() needs a map, got {type(member).__name__}", TypeError, None)

        def member_dot_arg(self, tree: Any) -> Any:
            # Spec (and Rust): comprehensions range over lists and maps only; celpy also
            # iterates strings character by character, so `"/srv".exists(r, ...)` held there.
            member_tree, method = tree.children[:2]
            if method.value in _MACROS:
                target = self.visit(member_tree)
                if isinstance(target, PyEvalError):
                    return target
                if not isinstance(target, (list, dict)) or isinstance(target, str):
                    return PyEvalError(f"{method.value}() needs a list or map, got {type(target).__name__}", TypeError, None)
            return super().member_dot_arg(tree)

    class _StrictRunner(celpy.InterpretedRunner):  # type: ignore[misc]
        def evaluate(self, context: Any) -> Any:
            return _StrictEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)

    numeric = (celtypes.IntType, celtypes.UintType, celtypes.DoubleType)

    def num(v: Any) -> int | float | None:
        if isinstance(v, numeric) and not isinstance(v, celtypes.BoolType):
            return float(v) if isinstance(v, celtypes.DoubleType) else int(v)
        return None

    def kind(v: Any) -> str:
        for k, types in (
            ("bool", celtypes.BoolType), ("num", numeric), ("str", str), ("bytes", bytes),
            ("ts", dt.datetime), ("dur", dt.timedelta), ("list", list), ("map", dict),
        ):  # fmt: skip
            if isinstance(v, types):
                return k
        return "null" if v is None else type(v).__name__

    def heq(a: Any, b: Any) -> bool:
        """CEL runtime (heterogeneous) equality: numbers on one line, other kinds never equal."""
        ka, kb = kind(a), kind(b)
        if ka != kb:
            return False
        if ka == "num":
            return num(a) == num(b)
        if ka == "list":
            return len(a) == len(b) and all(heq(x, y) for x, y in zip(a, b))
        if ka == "map":
            return len(a) == len(b) and all(k in b and heq(v, b[k]) for k, v in a.items())
        return bool(a == b)

    def lifted(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def fn(a: Any, b: Any) -> Any:
            if isinstance(a, PyEvalError):
                return a
            if isinstance(b, PyEvalError):
                return b
            return celtypes.BoolType(op(a, b))

        return fn

    def ordered(name: str, op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
        base = base_functions[name]

        def fn(a: Any, b: Any) -> Any:
            na, nb = num(a), num(b)
            if na is not None and nb is not None:
                return celtypes.BoolType(op(na, nb))
            return base(a, b)

        return fn

    base_in, base_index = base_functions["_in_"], base_functions["_[_]"]

    def op_in(item: Any, container: Any) -> Any:
        if isinstance(container, list) and not isinstance(item, PyEvalError):
            return celtypes.BoolType(any(heq(item, c) for c in container))
        return base_in(item, container)

    def op_index(container: Any, index: Any) -> Any:
        if isinstance(container, str):
            raise TypeError("no such overload: strings cannot be indexed")
        if isinstance(container, list) and (num(index) or 0) < 0:
            raise IndexError(f"index out of bounds: {index}")
        return base_index(container, index)

    def strict(name: str) -> Callable[[Any, Any], Any]:
        base = base_functions[name]

        def fn(a: Any, b: Any) -> Any:
            # Spec: no implicit numeric conversion (celpy allows 2.5 + 1 and 1 + 1u).
            if num(a) is not None and num(b) is not None and numkind(a) != numkind(b):
                raise TypeError(f"no such overload: {numkind(a)} {name} {numkind(b)}")
            return base(a, b)

        return fn

    def numkind(v: Any) -> str:
        if isinstance(v, celtypes.DoubleType):
            return "double"
        return "uint" if isinstance(v, celtypes.UintType) else "int"

    def helper(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            r = fn(*args)
            return celtypes.BoolType(r) if isinstance(r, bool) else celtypes.StringType(r)

        return call

    functions: dict[str, Any] = {
        "_==_": lifted(heq),
        "_!=_": lifted(lambda a, b: not heq(a, b)),
        "_<_": ordered("_<_", lambda a, b: a < b),
        "_<=_": ordered("_<=_", lambda a, b: a <= b),
        "_>_": ordered("_>_", lambda a, b: a > b),
        "_>=_": ordered("_>=_", lambda a, b: a >= b),
        **{op: strict(op) for op in ("_+_", "_-_", "_*_", "_/_", "_%_")},
        "_in_": op_in,
        "_[_]": op_index,
        **{name: helper(fn) for name, fn in _HELPER_FNS.items()},
        "matches": helper(regex_matches),
    }
    return celpy.Environment(runner_class=_StrictRunner), functions


def _lark_chain_to(node: Any, target: str) -> Any:
    """Follow single-child nodes from ``node`` down to a ``target`` node, or return None."""
    while hasattr(node, "data"):
        if node.data == target:
            return node
        kids = [c for c in node.children if c is not None]
        if len(kids) != 1:
            return None
        node = kids[0]
    return None


def _lark_walk(node: Any, bound: frozenset[str], refs: _Refs, funcs: _Funcs) -> None:
    """Collect free top-level names and called functions; check macro shapes."""
    if not hasattr(node, "data"):
        return
    kids = [c for c in node.children if c is not None]
    d = node.data
    if d in ("ident", "dot_ident"):
        tok = kids[0]
        if tok.value not in bound and tok.value not in _TYPE_NAMES:
            refs.setdefault(tok.value, (tok.line, tok.column))
        return
    if d in ("ident_arg", "dot_ident_arg", "member_dot_arg"):
        member = kids.pop(0) if d == "member_dot_arg" else None
        tok = kids[0]
        args = kids[1].children if len(kids) > 1 else []
        pos = (tok.line, tok.column)
        funcs.append((tok.value, pos))
        if member is not None:
            _lark_walk(member, bound, refs, funcs)
        if d == "ident_arg" and tok.value == "has":
            if len(args) != 1 or _lark_chain_to(args[0], "member_dot") is None:
                raise CelSyntaxError(
                    "has() takes one field selection such as has(args.path)", line=pos[0], column=pos[1]
                )
        if member is not None and tok.value in _MACROS:
            binder = _lark_chain_to(args[0], "ident") if len(args) == 2 else None
            if binder is None:
                raise _bad_macro(tok.value, pos)
            _lark_walk(args[1], bound | {binder.children[0].value}, refs, funcs)
            return
        for a in args:
            _lark_walk(a, bound, refs, funcs)
        return
    for c in kids:
        _lark_walk(c, bound, refs, funcs)


def _celpy_compile(source: str) -> _Compiled:
    env, functions = _celpy_env()
    from celpy import CELParseError

    try:
        ast = env.compile(source)
    except CELParseError as exc:
        cause = exc.__context__
        token = getattr(cause, "token", None)
        if token is not None:
            what = "end of input" if token.type == "$END" else repr(str(token))
        elif getattr(cause, "char", None) is not None:
            what = f"character {getattr(cause, 'char')!r}"
        else:
            what = "input"
        line, column = exc.line, exc.column
        if line is None:  # lark gives no position for an unexpected end of input
            end = len(source.rstrip())
            line = source.count("\n", 0, end) + 1
            column = end - source.rfind("\n", 0, end)
        raise CelSyntaxError(f"syntax error: unexpected {what}", line=line, column=column) from None
    refs: _Refs = {}
    funcs: _Funcs = []
    _lark_walk(ast, frozenset(), refs, funcs)
    return env.program(ast, functions=functions).evaluate, refs, funcs


def _celpy_context(plain: dict[str, Any]) -> dict[str, Any]:
    from celpy import json_to_cel

    return {name: json_to_cel(value) for name, value in plain.items()}


# --------------------------------------------------------------------------- Rust engine

_TOKEN = re.compile(
    r"""(?P<ws>\s+|//[^\n]*)
    |(?P<str>[bB]?[rR][bB]?(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
       |[bB]?(?:\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'''(?:\\[\s\S]|[^\\])*?'''
                |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
    |(?P<num>(?:0[xX][0-9a-fA-F]+|\d+\.\d+(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?
       |\d+[eE][+-]?\d+|\d+)[uU]?)
    |(?P<id>[_a-zA-Z][_a-zA-Z0-9]*)
    |(?P<op>&&|\|\||==|!=|<=|>=|[\s\S])""",
    re.X,
)
_NOT_NAMES = frozenset({"true", "false", "null", "in"}) | _TYPE_NAMES


def _scan(source: str) -> tuple[_Refs, _Funcs]:
    """Find free top-level names and called functions by a scope-aware token scan.

    Only used after the Rust parser accepted ``source``, so the token stream is valid CEL.
    """
    toks: list[tuple[str, str, int]] = [
        (m.lastgroup or "op", m.group(), m.start())
        for m in _TOKEN.finditer(source)
        if m.lastgroup != "ws"
    ]

    def pos(i: int) -> _Pos:
        at = toks[i][2]
        return source.count("\n", 0, at) + 1, at - (source.rfind("\n", 0, at) + 1) + 1

    closing: dict[int, int] = {}
    stack: list[int] = []
    for i, (_, text, _) in enumerate(toks):
        if text in "([{":
            stack.append(i)
        elif text in ")]}" and stack:
            closing[stack.pop()] = i
    funcs: _Funcs = []
    binders: set[int] = set()
    scopes: list[tuple[str, int, int]] = []
    for i, (kind, text, _) in enumerate(toks):
        if kind != "id" or i + 1 >= len(toks) or toks[i + 1][1] != "(":
            continue
        funcs.append((text, pos(i)))
        if text not in _MACROS or i == 0 or toks[i - 1][1] != ".":
            continue
        start, end = i + 2, closing.get(i + 1, len(toks))
        commas, depth = [], 0
        for j in range(start, end):
            t = toks[j][1]
            depth += t in "([{"
            depth -= t in ")]}"
            if t == "," and depth == 0:
                commas.append(j)
        if len(commas) != 1 or commas[0] != start + 1 or toks[start][0] != "id":
            raise _bad_macro(text, pos(i))
        binders.add(start)
        scopes.append((toks[start][1], commas[0], end))
    refs: _Refs = {}
    for i, (kind, text, _) in enumerate(toks):
        if kind != "id" or text in _NOT_NAMES or i in binders:
            continue
        if i + 1 < len(toks) and toks[i + 1][1] == "(":
            continue  # function or macro call
        if i >= 2 and toks[i - 1][1] == "." and (
            toks[i - 2][0] in ("id", "num", "str") or toks[i - 2][1] in ")]}"
        ):
            continue  # field selection
        if any(name == text and lo < i < hi for name, lo, hi in scopes):
            continue  # comprehension variable
        refs.setdefault(text, pos(i))
    return refs, funcs


@functools.cache
def _rust() -> Any:
    import cel

    return cel


_RUST_POS = re.compile(r"<input>:(\d+):(\d+): (.*)")


def _rewrite_matches(source: str) -> str:
    """Route `matches` calls (method or function form) to the cached RE2 helper."""
    out, last = [], 0
    for m in _TOKEN.finditer(source):
        if m.lastgroup == "id" and m.group() == "matches" and source[m.end():].lstrip().startswith("("):
            out.append(source[last:m.start()])
            out.append(_RE_MATCHES)
            last = m.end()
    out.append(source[last:])
    return "".join(out)


def _rust_compile(source: str) -> _Compiled:
    try:
        program = _rust().compile(_rewrite_matches(source))
    except Exception as exc:
        m = _RUST_POS.search(str(exc))
        if m is None:
            raise CelSyntaxError(_short(f"syntax error: {exc}")) from None
        raise CelSyntaxError(
            _short(m.group(3)), line=int(m.group(1)), column=int(m.group(2))
        ) from None
    refs, funcs = _scan(source)
    engine_vars = {v.lstrip(".") for v in program.variables()}
    refs = {n: p for n, p in refs.items() if n in engine_vars}
    return program.execute, refs, funcs


_RUST_FNS = {**_HELPER_FNS, _RE_MATCHES: regex_matches}


def _rust_context(plain: dict[str, Any]) -> Any:
    return _rust().Context(plain, functions=_RUST_FNS)

__all__ = [
    "ENGINES",
    "FUNCTIONS",
    "HELPERS",
    "Activation",
    "CelError",
    "CelEvalError",
    "CelSyntaxError",
    "CelUndeclared",
    "Expression",
    "available_engines",
    "compile_expression",
    "default_engine",
    "glob",
    "lower",
    "make_activation",
    "path_normalize",
    "path_within",
    "upper",
]
