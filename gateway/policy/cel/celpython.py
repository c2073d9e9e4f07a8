"""The cel-python engine (module ``celpy``) behind `gateway.policy.cel`: compile, check, build contexts.

Private: only `gateway.policy.cel` calls it. Here live the custom runner and operator overrides that
smooth cel-python's quirks, and the lark-tree walk that finds references and checks macros.
``celpy`` is imported on first use; the `Environment` is built once per process.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import Any

from gateway.policy.cel.helpers import (
    HELPERS,
    MACROS,
    TYPE_NAMES,
    CelSyntaxError,
    bad_macro,
    Compiled,
    Funcs,
    Refs,
)

@functools.cache
def _celpy_env() -> tuple[Any, dict[str, Any]]:
    """Build the one cel-python Environment and its operator overrides (slow; once per process).

Helpers are added per compiled program from the registry (`_helper_functions`)."""
    import celpy

    return celpy.Environment(runner_class=_strict_runner()), _operator_overrides()


def _strict_runner() -> type:
    """cel-python's interpreted runner with the spec's `has()` and comprehension checks."""
    import celpy
    from celpy import celtypes
    from celpy.evaluation import CELEvalError as PyEvalError
    from celpy.evaluation import Evaluator

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
            if method.value in MACROS:
                target = self.visit(member_tree)
                if isinstance(target, PyEvalError):
                    return target
                if not isinstance(target, (list, dict)) or isinstance(target, str):
                    return PyEvalError(f"{method.value}() needs a list or map, got {type(target).__name__}", TypeError, None)
            return super().member_dot_arg(tree)

    class _StrictRunner(celpy.InterpretedRunner):  # type: ignore[misc]
        def evaluate(self, context: Any) -> Any:
            return _StrictEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)

    return _StrictRunner


def _operator_overrides() -> dict[str, Any]:
    """The operators cel-python gets wrong against the spec (and the Rust engine): heterogeneous
    equality, numeric ordering across kinds, `in` over lists, negative and string indexing, and no
    implicit numeric conversion in arithmetic."""
    from celpy import celtypes
    from celpy.evaluation import CELEvalError as PyEvalError
    from celpy.evaluation import base_functions

    num, heq = _cel_values()

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
    }
    return functions


def _cel_values() -> tuple[Callable[[Any], int | float | None], Callable[[Any, Any], bool]]:
    """`num` (a CEL number as a Python one, else None) and `heq` (CEL's heterogeneous equality)
    over cel-python's value types."""
    from celpy import celtypes

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

    return num, heq


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


def _lark_walk(node: Any, bound: frozenset[str], refs: Refs, funcs: Funcs) -> None:
    """Collect free top-level names and called functions; check macro shapes."""
    if not hasattr(node, "data"):
        return
    kids = [c for c in node.children if c is not None]
    d = node.data
    if d in ("ident", "dot_ident"):
        tok = kids[0]
        if tok.value not in bound and tok.value not in TYPE_NAMES:
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
        if member is not None and tok.value in MACROS:
            binder = _lark_chain_to(args[0], "ident") if len(args) == 2 else None
            if binder is None:
                raise bad_macro(tok.value, pos)
            _lark_walk(args[1], bound | {binder.children[0].value}, refs, funcs)
            return
        for a in args:
            _lark_walk(a, bound, refs, funcs)
        return
    for c in kids:
        _lark_walk(c, bound, refs, funcs)


def celpy_compile(source: str) -> Compiled:
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
    refs: Refs = {}
    funcs: Funcs = []
    _lark_walk(ast, frozenset(), refs, funcs)
    return env.program(ast, functions={**functions, **_helper_functions()}).evaluate, refs, funcs


def _helper_functions() -> dict[str, Callable[..., Any]]:
    """The registered helpers, each returning its result as the matching CEL type (an int stays an int)."""
    from celpy import json_to_cel

    def native(helper: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            return json_to_cel(helper(*args))

        return call

    return {name: native(helper) for name, helper in HELPERS.items()}


def celpy_context(plain: dict[str, Any]) -> dict[str, Any]:
    from celpy import json_to_cel

    return {name: json_to_cel(value) for name, value in plain.items()}
