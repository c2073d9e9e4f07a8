"""The one adapter over the CEL engines: compile, check references, evaluate, normalise.

Two engines sit behind one small interface: ``cel-python`` (module ``celpy``, pure Python,
the reference engine) and ``common-expression-language`` (module ``cel``, Rust, the fast
engine, preferred when installed). This is the one public CEL interface: each engine's half
lives in a private module (`gateway.policy.cel.celpython`, `gateway.policy.cel.rust`), the only ones that
import an engine, and what they share (errors, helpers) in `gateway.policy.cel.helpers`.

What the adapter guarantees, whichever engine runs:

* Arithmetic never mixes numeric kinds (``2.5 + 1``, ``1 + 1u`` are errors on both).
* Compile errors are `CelSyntaxError` with a 1-based line/column inside the expression.
  Macros are checked the same way for both engines: ``all``/``exists``/``exists_one``/
  ``filter``/``map`` take exactly ``(var, expr)`` (the 3-argument ``map`` crashes cel-python,
  issue #194, and two-variable comprehensions exist in neither engine); ``has()`` takes a
  field selection ``e.f``. Calls to functions outside `FUNCTIONS` (the ones both engines
  provide) and the registered `HELPERS` are compile errors too, so a typo such as ``startswith`` fails
  at load time instead of failing closed on every call.
* `Expression.references` is the set of free top-level names (comprehension variables are
  not references); names outside ``declared`` raise `CelUndeclared`. cel-python walks the
  lark tree; for the Rust engine a scope-aware token scan is intersected with
  ``Program.variables()`` (which also lists comprehension variables).
* `Expression.evaluate` returns plain Python (bool/int/float/str/list/dict/None/aware UTC
  datetime) and raises `CelEvalError` only. Durations, bytes and type values are not
  JSON-like and become `CelEvalError`; a non-boolean result is not an error here.
* `make_activation` normalises the call's variables once; the same `Activation` serves every
  rule of the call. On the Rust engine an expression is first tried on the fast path
  (`gateway.policy.cel.fast`, plain Python over the normalised values, exact or deferring),
  and the engine's own form of the variables is built only when an expression needs it.
  Integral floats become ints (JSON ``5.0`` is ``5``: cel-python has no
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

Helpers (function-call style, both engines), registered once in `gateway.policy.cel.helpers`
with a declared result type that both engines keep (an int result stays an int):
``glob(s, pattern)`` (fnmatch, case-sensitive, ``*`` also matches ``/``), ``tool_glob(name, pattern)``
(a tool-name glob on folded spellings, as the policy's `tools` lists match: `gateway.policy.names`),
``path_normalize(p)``, ``path_within(p, root)``, ``lower(s)``, ``upper(s)`` (Unicode-aware),
and ``matches`` (RE2, replacing the engines' own).

No I/O, no environment reads. The one piece of module-level state is the lazily built
cel-python `Environment` (in `gateway.policy.cel.celpython`: it builds an LALR parser in ~0.3 s and
calls ``sys.setrecursionlimit(2500)``), created on first use of that engine.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.policy.cel.celpython import celpy_compile, celpy_context
from gateway.policy.cel.fast import FAST_RESULTS, Fast, compile_fast, fields_read, kinds_read
from gateway.policy.cel.rust import rust_compile, rust_context
from gateway.policy.cel.helpers import (
    HELPERS,
    MACROS,
    Helper,
    CelError,
    CelEvalError,
    CelSyntaxError,
    CelUndeclared,
    shorten,
    glob,
    lower,
    path_normalize,
    path_within,
    register_helper,
    unregister_helper,
    upper,
)

ENGINES: tuple[str, ...] = ("cel-python", "common-expression-language")
_CELPY, _RUST = ENGINES
_MODULES = {_CELPY: "celpy", _RUST: "cel"}

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EXACT_FLOAT_INT = 2**53

#: Built-in functions and macros an expression may call: present in both engines. Registered
#: helpers (`HELPERS`, see `register_helper`) may be called too.
FUNCTIONS: frozenset[str] = frozenset(
    {
        "has", "dyn", "size", "contains", "startsWith", "endsWith", "matches",
        "int", "uint", "double", "string", "bytes", "timestamp", "duration", "type",
        "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek",
        "getDayOfYear", "getHours", "getMinutes", "getSeconds", "getMilliseconds",
    }
    | MACROS
)  # fmt: skip


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
    return shorten(text.replace("\n", " "))


# --------------------------------------------------------------------------- values


_LEAF_TYPES = frozenset({str, int, float, bool, type(None), list, tuple})


class _NotUtf8(Exception):
    """A string the Rust engine cannot hold (a lone surrogate): `make_activation` converts eagerly then."""


def _normalise(value: Any, utf8: bool = True) -> Any:
    """Copy JSON-like input into the one shape both engines read identically.

    With `utf8`, a string that is not UTF-8 encodable raises `_NotUtf8` (see `make_activation`).
    Maps and lists are tested first by exact type, and a map's string, bool, null, int64 and
    empty map or list values (a list's strings, bools and nulls) are copied in its own loop: most
    of a call's variables are those.
    """
    kind = type(value)
    if kind is dict or (kind not in _LEAF_TYPES and isinstance(value, Mapping)):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"activation map keys must be strings, got {type(k).__name__}")
            if utf8 and not k.isascii():
                _utf8(k)
            kind = type(v)
            if kind is str:
                if utf8 and not v.isascii():
                    _utf8(v)
                out[k] = v
            elif kind is bool or v is None:
                out[k] = v
            elif kind is int and _INT64_MIN <= v <= _INT64_MAX:
                out[k] = v
            elif (kind is dict or kind is list) and not v:
                out[k] = {} if kind is dict else []
            else:
                out[k] = _normalise(v, utf8)
        return out
    if kind is list or kind is tuple:
        items = []
        for v in value:
            kind = type(v)
            if kind is str:
                if utf8 and not v.isascii():
                    _utf8(v)
                items.append(v)
            elif kind is bool or v is None:
                items.append(v)
            else:
                items.append(_normalise(v, utf8))
        return items
    if isinstance(value, str):
        if utf8 and not value.isascii():
            _utf8(value)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= _EXACT_FLOAT_INT:
            return int(value)
        return value
    if isinstance(value, (list, tuple)):
        return [_normalise(v, utf8) for v in value]
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("activation datetimes must be timezone-aware")
        return value.astimezone(dt.timezone.utc)
    if isinstance(value, dt.timedelta):
        return value
    raise TypeError(f"activation values must be JSON-like, got {type(value).__name__}")


def _utf8(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _NotUtf8 from None


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
    """The variables of one call, normalised once and shared by every rule.

    `plain` is what the fast path reads (`gateway.policy.cel.fast`); the engine's own form is
    built on first use (an expression the fast path does not answer) and then reused. `fast` is
    False when a string is not UTF-8 encodable (the engine refuses it): only the engine runs then.
    """

    __slots__ = ("plain", "engine", "fast", "_converted")

    def __init__(self, plain: dict[str, Any], engine: str = _RUST, fast: bool = True) -> None:
        self.plain = plain
        self.engine = engine
        self.fast = fast and engine == _RUST
        self._converted: dict[str, Any] = {}

    def for_engine(self, engine: str) -> Any:
        """Return the engine-native form, converting on first use for that engine."""
        try:
            return self._converted[engine]
        except KeyError:
            native = celpy_context(self.plain) if engine == _CELPY else rust_context(self.plain)
            self._converted[engine] = native
            return native

    def extend(self, variables: Mapping[str, Any]) -> Activation:
        """Add variables (e.g. `response` for the response phase) without converting the rest again.

        Names already present keep their value. Returns self. Converts only for engines already
        converted for, except when a new string is not UTF-8 encodable: then the engine's form is
        built now, so the engine raises exactly where it did when activations converted eagerly.
        """
        try:
            added = {name: _normalise(v) for name, v in variables.items() if name not in self.plain}
        except _NotUtf8:
            added = {name: _normalise(v, False) for name, v in variables.items() if name not in self.plain}
            self.fast = False
            self.for_engine(self.engine)
        self.plain.update(added)
        for engine, native in self._converted.items():
            if engine == _CELPY:
                native.update(celpy_context(added))
            else:
                for name, value in added.items():
                    native.add_variable(name, value)
        return self


def make_activation(variables: Mapping[str, Any], engine: str | None = None) -> Activation:
    """Build the activation for one call.

    For the Rust engine the engine's form is built lazily, when an expression first needs it
    (the fast path reads the plain values); for cel-python, or when a string is not UTF-8
    encodable, it is built now, so a conversion error is raised here as it always was.

    Raises:
        TypeError, ValueError: a value is not JSON-like or a datetime is naive (or the engine
            refuses a value).
    """
    engine = _resolve(engine)
    try:
        act = Activation({name: _normalise(v) for name, v in variables.items()}, engine)
    except _NotUtf8:
        act = Activation({name: _normalise(v, False) for name, v in variables.items()}, engine, fast=False)
    if not act.fast:
        act.for_engine(engine)
    return act


# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled CEL expression bound to one engine."""

    source: str
    engine: str
    references: frozenset[str]
    _run: Callable[[Any], Any] = field(repr=False, compare=False)
    _fast: Fast | None = field(default=None, repr=False, compare=False)

    @property
    def fast(self) -> bool:
        """Whether the fast path compiled this expression (it may still defer at run time)."""
        return self._fast is not None

    def evaluate(self, activation: Activation) -> Any:
        """Evaluate against ``activation``; return plain Python or raise CelEvalError.

        The fast path answers when it is sure of the engine's answer; otherwise the engine runs.
        """
        if self._fast is not None and activation.fast:
            try:
                value = self._fast(activation.plain)
            except Exception:  # not sure: the engine decides, with its own errors
                pass
            else:
                if value is True or value is False or type(value) in FAST_RESULTS:
                    return value
        return self.evaluate_engine(activation)

    def evaluate_engine(self, activation: Activation) -> Any:
        """The engine's own answer, without the fast path (tests compare the two)."""
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
            raise CelEvalError(shorten(f"engine panic: {exc}")) from exc
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
        run, refs, funcs = celpy_compile(source)
    else:
        run, refs, funcs = rust_compile(source)
    for name, (line, col) in funcs:
        if name not in FUNCTIONS and name not in HELPERS:
            raise CelSyntaxError(f"unknown function {name!r}", line=line, column=col)
    allowed = frozenset(declared)
    missing = {n: pos for n, pos in refs.items() if n not in allowed}
    if missing:
        first = min(missing.values())
        raise CelUndeclared(missing, line=first[0], column=first[1])
    fast = compile_fast(source) if engine == _RUST else None
    return Expression(source=source, engine=engine, references=frozenset(refs), _run=run, _fast=fast)


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
    "Helper",
    "available_engines",
    "compile_expression",
    "default_engine",
    "glob",
    "fields_read",
    "kinds_read",
    "lower",
    "make_activation",
    "path_normalize",
    "path_within",
    "register_helper",
    "unregister_helper",
    "upper",
]
