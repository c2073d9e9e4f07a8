"""The fast path of the Rust engine: the CEL our rules use, compiled to Python closures.

Building the engine's context converts every variable to a Rust value (~2 µs a string) and each
`Program.execute` costs ~10 µs; most rule conditions are a few field reads, comparisons and
`exists` over short lists, which plain Python answers in a fraction of that. `compile_fast`
turns such an expression into a closure over the activation's plain (normalised) values.

Exact by construction: the closure returns a value only when it is sure the engine would
return the same one. Anything it is not sure of raises (`Defer`, or any Python error on the
way), and the adapter then asks the engine, whose result and error message stand. So it
defers on a missing key or field, a type an operator does not expect, equality of an int and a
double (``1 == 1.0``), ordering of two kinds, int overflow, a non-bool operand of ``!``/``&&``/
``||``/``?:`` (where the engine may absorb an error), a helper that raises, a comprehension
over a map whose result depends on the engine's iteration order. Source it does not know
(map literals, ``-``/``*``/``/``/``%``, uint and bytes literals, conversions, timestamps,
unknown escapes, triple-quoted strings) is not compiled at all: the engine evaluates it.

Supported: literals (string, int, double, bool, null, lists), identifiers, ``a.b``,
``a["k"]``/``a[0]``, ``has(a.b)``, ``!``, ``&&``, ``||``, ``?:``, ``==``, ``!=``, ``<``,
``<=``, ``>``, ``>=``, ``in`` (list and map), ``+`` (strings, lists, ints, doubles),
``size()``, ``type()``, the string methods ``startsWith``/``endsWith``/``contains``, every
registered helper (`HELPERS`, function or method form: ``matches`` is the same RE2 helper the
engine calls) and the macros ``exists``/``all``/``exists_one``/``filter``/``map``.
Engine facts it relies on (checked by tests/test_cel_fast.py against the engine): values of
two kinds other than int and double are unequal (``'a' == 1``, ``null == 'a'`` are false); ``&&``,
``||``, ``?:`` and ``exists``/``all`` over a list evaluate left to right and stop at the
first deciding value; ``size`` of a string counts UTF-8 bytes; string order is code point order.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from gateway.policy.cel.helpers import HELPERS, TOKEN, TYPE_NAMES

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

Fast = Callable[[dict[str, Any]], Any]
Node = tuple[Any, ...]


class Defer(Exception):
    """The fast path is not sure of the engine's answer: the engine evaluates the expression."""


class _Unsupported(Exception):
    """The source uses CEL the fast path does not compile."""


class CelType:
    """A CEL type value (``type(x)``, or a type name such as ``string``), compared by name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_TYPE_VALUES = {name: CelType(name) for name in TYPE_NAMES}
_TYPE_OF = {
    bool: _TYPE_VALUES["bool"], int: _TYPE_VALUES["int"], float: _TYPE_VALUES["double"],
    str: _TYPE_VALUES["string"], list: _TYPE_VALUES["list"], dict: _TYPE_VALUES["map"],
    type(None): _TYPE_VALUES["null_type"],
}  # fmt: skip
#: The result types the adapter takes from the fast path; any other result (a list, a map, a
#: type value) is left to the engine, whose conversion of it back to Python stands.
FAST_RESULTS = frozenset({bool, int, float, str, type(None)})
_SCALARS = frozenset({bool, int, float, str, type(None)})


# --------------------------------------------------------------------------- parsing


_ESCAPES = {"\\": "\\", "?": "?", '"': '"', "'": "'", "`": "`", "a": "\a", "b": "\b", "f": "\f",
            "n": "\n", "r": "\r", "t": "\t", "v": "\v"}  # fmt: skip
_HEX_LEN = {"x": 2, "X": 2, "u": 4, "U": 8}


def _string(text: str) -> str:
    """Decode a string literal token; raise _Unsupported for forms the fast path leaves alone."""
    raw = text[0] in "rR"
    body = text[1:] if raw else text
    if body[0] in "bB" or body.startswith(('"""', "'''")):
        raise _Unsupported("bytes or triple-quoted string")
    body = body[1:-1]
    if raw or "\\" not in body:
        return _checked_text(body)
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = body[i + 1]
        if esc in _ESCAPES:
            out.append(_ESCAPES[esc])
            i += 2
        elif esc in _HEX_LEN:
            digits = body[i + 2 : i + 2 + _HEX_LEN[esc]]
            if len(digits) != _HEX_LEN[esc] or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise _Unsupported("bad hex escape")
            out.append(chr(int(digits, 16)))
            i += 2 + len(digits)
        elif esc in "0123":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or any(c not in "01234567" for c in digits):
                raise _Unsupported("bad octal escape")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise _Unsupported(f"escape \\{esc}")
    return _checked_text("".join(out))


def _checked_text(text: str) -> str:
    """`text` if the engine can hold it (UTF-8 encodable: no lone surrogates)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Unsupported("string the engine cannot hold") from None
    return text


class _Parser:
    """Recursive descent over CEL's grammar, for source the Rust engine already accepted."""

    _RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})

    def __init__(self, source: str) -> None:
        self.toks = [(m.lastgroup or "op", m.group()) for m in TOKEN.finditer(source) if m.lastgroup != "ws"]
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise _Unsupported("unexpected end")
        tok = self.toks[self.i]
        if expected is not None and tok[1] != expected:
            raise _Unsupported(f"expected {expected!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.expr()
        if self.i != len(self.toks):
            raise _Unsupported("trailing tokens")
        return node

    def expr(self) -> Node:
        cond = self.or_()
        if self.peek() != "?":
            return cond
        self.take("?")
        then = self.or_()
        self.take(":")
        return ("cond", cond, then, self.expr())

    def or_(self) -> Node:
        node = self.and_()
        while self.peek() == "||":
            self.take()
            node = ("or", node, self.and_())
        return node

    def and_(self) -> Node:
        node = self.relation()
        while self.peek() == "&&":
            self.take()
            node = ("and", node, self.relation())
        return node

    def relation(self) -> Node:
        node = self.addition()
        while self.peek() in self._RELATIONS:
            op = self.take()[1]
            node = ("rel", op, node, self.addition())
        return node

    def addition(self) -> Node:
        node = self.unary()
        while self.peek() in ("+", "-", "*", "/", "%"):
            op = self.take()[1]
            if op != "+":
                raise _Unsupported(f"operator {op}")
            node = ("add", node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek() == "!":
            self.take()
            return ("not", self.unary())
        if self.peek() == "-":
            self.take()
            if self.peek() == "-":
                raise _Unsupported("repeated minus")
            bare = self.i + 1 >= len(self.toks) or self.toks[self.i + 1][1] not in (".", "[")
            if self.i < len(self.toks) and self.toks[self.i][0] == "num" and bare:
                return ("lit", _number(self.take()[1], negative=True))  # -9223372036854775808 is one int64
            return ("neg", self.member())
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            nxt = self.peek()
            if nxt == ".":
                self.take()
                kind, name = self.take()
                if kind != "id":
                    raise _Unsupported("selection of a non-identifier")
                if self.peek() == "(":
                    node = ("call", name, node, self.arguments())
                else:
                    node = ("sel", node, name)
            elif nxt == "[":
                self.take()
                index = self.expr()
                self.take("]")
                node = ("idx", node, index)
            else:
                return node

    def arguments(self) -> list[Node]:
        self.take("(")
        args: list[Node] = []
        while self.peek() != ")":
            args.append(self.expr())
            if self.peek() != ",":
                break
            self.take(",")
        self.take(")")
        return args

    def primary(self) -> Node:
        kind, text = self.take()
        if kind == "str":
            return ("lit", _string(text))
        if kind == "num":
            return ("lit", _number(text, negative=False))
        if kind == "id":
            if text in ("true", "false"):
                return ("lit", text == "true")
            if text == "null":
                return ("lit", None)
            if self.peek() == "(":
                return ("call", text, None, self.arguments())
            return ("id", text)
        if text == "(":
            node = self.expr()
            self.take(")")
            return node
        if text == "[":
            items: list[Node] = []
            while self.peek() != "]":
                items.append(self.expr())
                if self.peek() != ",":
                    break
                self.take(",")
            self.take("]")
            return ("list", items)
        raise _Unsupported(f"token {text!r}")


def _number(text: str, *, negative: bool) -> int | float:
    if text[-1] in "uU":
        raise _Unsupported("uint literal")
    if text[:2] in ("0x", "0X"):
        value: int | float = int(text, 16)
    elif any(c in text for c in ".eE"):
        value = float(text)
    else:
        value = int(text)
    if negative:
        value = -value
    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
        raise _Unsupported("int literal out of range")
    return value


# --------------------------------------------------------------------------- run-time checks


_NUMBERS = frozenset({int, float})


def _eq(a: Any, b: Any) -> bool:
    """CEL equality: values of one scalar kind compare, values of two kinds are unequal (the engine's
    ``'a' == 1``, ``null == 'a'``, ``true == 1`` are false); an int and a double, two lists or
    maps, or a type value against anything else defer."""
    t = type(a)
    if t is not type(b):
        if (t in _NUMBERS and type(b) in _NUMBERS) or t is CelType or type(b) is CelType:
            raise Defer
        return False
    if t is str or t is int or t is bool or a is None:
        return bool(a == b)
    if t is float and a == a and b == b:
        return bool(a == b)
    if t is CelType:
        return bool(a.name == b.name)
    raise Defer


def _order(a: Any, b: Any) -> None:
    """Defer unless `a` and `b` are ordered the same way by Python and the engine."""
    t = type(a)
    if t is not type(b) or not (t is str or t is int or (t is float and a == a and b == b)):
        raise Defer


def _in(item: Any, container: Any) -> bool:
    tc = type(container)
    if tc is list:
        for element in container:
            if _eq(item, element):
                return True
        return False
    if tc is dict and type(item) is str:
        return item in container
    raise Defer


def _add(a: Any, b: Any) -> Any:
    t = type(a)
    if t is not type(b):
        raise Defer
    if t is str or t is list or t is float:
        return a + b
    if t is int:
        total = a + b
        if _INT64_MIN <= total <= _INT64_MAX:
            return total
    raise Defer


def _size(value: Any) -> int:
    t = type(value)
    if t is str:
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    if t is list or t is dict:
        return len(value)
    raise Defer


def _helper_result(value: Any) -> Any:
    """A helper's result as the engine would carry it back, or defer if it might not."""
    t = type(value)
    if t is list:
        for item in value:
            _scalar(item)
        return value
    return _scalar(value)


def _scalar(value: Any) -> Any:
    t = type(value)
    if t not in _SCALARS:
        raise Defer
    if t is int and not _INT64_MIN <= value <= _INT64_MAX:
        raise Defer
    if t is str and not value.isascii():
        value.encode("utf-8")
    return value


# --------------------------------------------------------------------------- closures


def _compile(node: Node) -> Fast:
    kind = node[0]
    if kind == "lit":
        value = node[1]
        return lambda env: value
    if kind == "list":
        items = [_compile(n) for n in node[1]]
        return lambda env: [f(env) for f in items]
    if kind == "id":
        name = node[1]
        if name in TYPE_NAMES:
            type_value = _TYPE_VALUES[name]
            return lambda env: type_value
        return lambda env: env[name]
    if kind == "sel":
        if node[1][0] == "id" and node[1][1] not in TYPE_NAMES:
            return _select_variable(node[1][1], node[2])
        return _select(_compile(node[1]), node[2])
    if kind == "idx":
        return _index(_compile(node[1]), _compile(node[2]))
    if kind == "not":
        return _not(_compile(node[1]))
    if kind == "neg":
        return _neg(_compile(node[1]))
    if kind == "and":
        return _and(_compile(node[1]), _compile(node[2]))
    if kind == "or":
        return _or(_compile(node[1]), _compile(node[2]))
    if kind == "cond":
        return _cond(_compile(node[1]), _compile(node[2]), _compile(node[3]))
    if kind == "rel":
        return _relation(node[1], node[2], node[3])
    if kind == "add":
        left, right = _compile(node[1]), _compile(node[2])
        return lambda env: _add(left(env), right(env))
    if kind == "call":
        return _call(node[1], node[2], node[3])
    raise _Unsupported(kind)


def _select(operand: Fast, name: str) -> Fast:
    def select(env: dict[str, Any]) -> Any:
        value = operand(env)
        if type(value) is dict:
            return value[name]
        raise Defer

    return select


def _select_variable(variable: str, name: str) -> Fast:
    """`v.name` for a variable `v`: the commonest shape, one frame instead of two."""

    def select(env: dict[str, Any]) -> Any:
        value = env[variable]
        if type(value) is dict:
            return value[name]
        raise Defer

    return select


def _index(operand: Fast, key: Fast) -> Fast:
    def index(env: dict[str, Any]) -> Any:
        value, k = operand(env), key(env)
        t, tk = type(value), type(k)
        if t is dict and tk is str:
            return value[k]
        if t is list and tk is int and k >= 0:
            return value[k]
        raise Defer

    return index


def _not(operand: Fast) -> Fast:
    def not_(env: dict[str, Any]) -> bool:
        value = operand(env)
        if value is True:
            return False
        if value is False:
            return True
        raise Defer

    return not_


def _neg(operand: Fast) -> Fast:
    def neg(env: dict[str, Any]) -> Any:
        value = operand(env)
        t = type(value)
        if t is float or (t is int and value != _INT64_MIN):
            return -value
        raise Defer

    return neg


def _and(left: Fast, right: Fast) -> Fast:
    def and_(env: dict[str, Any]) -> bool:
        a = left(env)
        if a is False:
            return False
        if a is True:
            b = right(env)
            if b is True or b is False:
                return b
        raise Defer

    return and_


def _or(left: Fast, right: Fast) -> Fast:
    def or_(env: dict[str, Any]) -> bool:
        a = left(env)
        if a is True:
            return True
        if a is False:
            b = right(env)
            if b is True or b is False:
                return b
        raise Defer

    return or_


def _cond(test: Fast, then: Fast, other: Fast) -> Fast:
    def cond(env: dict[str, Any]) -> Any:
        value = test(env)
        if value is True:
            return then(env)
        if value is False:
            return other(env)
        raise Defer

    return cond


def _relation(op: str, left_node: Node, right_node: Node) -> Fast:
    special = _literal_relation(op, left_node, right_node)
    if special is not None:
        return special
    left, right = _compile(left_node), _compile(right_node)
    if op == "==":
        return lambda env: _eq(left(env), right(env))
    if op == "!=":
        return lambda env: not _eq(left(env), right(env))
    if op == "in":
        return lambda env: _in(left(env), right(env))

    ordered = _ORDERINGS[op]

    def compare(env: dict[str, Any]) -> bool:
        a, b = left(env), right(env)
        _order(a, b)
        return bool(ordered(a, b))

    return compare


_ORDERINGS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _literal_relation(op: str, left_node: Node, right_node: Node) -> Fast | None:
    """`e == "lit"` / `e != lit` (string, int or bool), `e in ["a", "b"]` and `"a" in e`: the same
    answers as `_eq`/`_in`, without a call per operand."""
    if op in ("==", "!=") and left_node[0] == "lit" and right_node[0] != "lit":
        left_node, right_node = right_node, left_node  # equality is symmetric, and so is deferring
    literal = right_node[1] if right_node[0] == "lit" else None
    if op in ("==", "!=") and right_node[0] == "lit" and type(literal) in (str, int, bool):
        operand, want, negate = _compile(left_node), type(literal), op == "!="

        def equals(env: dict[str, Any]) -> bool:
            value = operand(env)
            if type(value) is want:
                return (value == literal) is not negate
            return _eq(value, literal) is not negate

        return equals
    if op == "in" and right_node[0] == "list" and right_node[1] and all(
        n[0] == "lit" and type(n[1]) is str for n in right_node[1]
    ):
        member, options = _compile(left_node), frozenset(n[1] for n in right_node[1])

        def in_strings(env: dict[str, Any]) -> bool:
            value = member(env)
            if type(value) is str:
                return value in options
            return any(_eq(value, option) for option in options)  # unequal, or defers (a type value)

        return in_strings
    if op == "in" and left_node[0] == "lit" and type(left_node[1]) is str:
        item, container = left_node[1], _compile(right_node)

        def string_in(env: dict[str, Any]) -> bool:
            found = container(env)
            if type(found) is dict:
                return item in found
            if type(found) is list:
                for element in found:
                    if type(element) is str:
                        if element == item:
                            return True
                    elif type(element) is CelType:
                        raise Defer
                return False
            raise Defer

        return string_in
    return None


_STRING_METHODS = {"startsWith": str.startswith, "endsWith": str.endswith, "contains": str.__contains__}


def _call(name: str, target: Node | None, args: list[Node]) -> Fast:
    helper = HELPERS.get(name)
    if helper is not None and (helper.overrides_builtin or name not in _BUILTINS):
        return _helper(name, [_compile(n) for n in ([target] if target is not None else []) + args])
    if name in _MACROS and target is not None:
        if len(args) != 2 or args[0][0] != "id" or args[0][1] in TYPE_NAMES:
            raise _Unsupported(f"{name} shape")
        return _MACROS[name](_compile(target), args[0][1], _compile(args[1]))
    if helper is not None:
        raise _Unsupported(f"helper {name} shadows a built-in")
    if name == "has" and target is None and len(args) == 1 and args[0][0] == "sel":
        field = args[0]
        if field[1][0] == "id" and field[1][1] not in TYPE_NAMES:
            return _has_variable(field[1][1], field[2])
        return _has(_compile(field[1]), field[2])
    if name == "size" and len(args) + (target is not None) == 1:
        operand = _compile(target if target is not None else args[0])
        return lambda env: _size(operand(env))
    if name == "type" and target is None and len(args) == 1:
        operand = _compile(args[0])

        def type_of(env: dict[str, Any]) -> CelType:
            value = _TYPE_OF.get(type(operand(env)))
            if value is None:
                raise Defer
            return value

        return type_of
    if name in _STRING_METHODS and target is not None and len(args) == 1:
        if args[0][0] == "lit" and type(args[0][1]) is str:
            return _string_method_literal(_STRING_METHODS[name], _compile(target), args[0][1])
        return _string_method(_STRING_METHODS[name], _compile(target), _compile(args[0]))
    raise _Unsupported(f"function {name}")


def _helper(name: str, args: list[Fast]) -> Fast:
    def call(env: dict[str, Any]) -> Any:
        helper = HELPERS.get(name)  # looked up per call, like the engine's context does
        if helper is None:
            raise Defer
        return _helper_result(helper(*[f(env) for f in args]))

    return call


def _has(operand: Fast, name: str) -> Fast:
    def has(env: dict[str, Any]) -> bool:
        value = operand(env)
        if type(value) is dict:
            return name in value
        raise Defer

    return has


def _has_variable(variable: str, name: str) -> Fast:
    def has(env: dict[str, Any]) -> bool:
        value = env[variable]
        if type(value) is dict:
            return name in value
        raise Defer

    return has


def _string_method_literal(method: Callable[[str, str], bool], target: Fast, literal: str) -> Fast:
    def call(env: dict[str, Any]) -> bool:
        s = target(env)
        if type(s) is str:
            return method(s, literal)
        raise Defer

    return call


def _string_method(method: Callable[[str, str], bool], target: Fast, arg: Fast) -> Fast:
    def call(env: dict[str, Any]) -> bool:
        s, other = target(env), arg(env)
        if type(s) is str and type(other) is str:
            return method(s, other)
        raise Defer

    return call


def _predicate(value: Any) -> bool:
    if value is True or value is False:
        return value
    raise Defer


def _exists(target: Fast, var: str, body: Fast) -> Fast:
    def exists(env: dict[str, Any]) -> bool:
        items = target(env)
        scope = dict(env)
        if type(items) is list:  # the engine stops at the first true element, in order
            for item in items:
                scope[var] = item
                if _predicate(body(scope)):
                    return True
            return False
        if type(items) is dict:  # the engine's key order is random: decide only if every key decides
            found = False
            for item in items:
                scope[var] = item
                found = _predicate(body(scope)) or found
            return found
        raise Defer

    return exists


def _all(target: Fast, var: str, body: Fast) -> Fast:
    def all_(env: dict[str, Any]) -> bool:
        items = target(env)
        scope = dict(env)
        if type(items) is list:
            for item in items:
                scope[var] = item
                if not _predicate(body(scope)):
                    return False
            return True
        if type(items) is dict:
            holds = True
            for item in items:
                scope[var] = item
                holds = _predicate(body(scope)) and holds
            return holds
        raise Defer

    return all_


def _exists_one(target: Fast, var: str, body: Fast) -> Fast:
    def exists_one(env: dict[str, Any]) -> bool:
        items = target(env)
        if type(items) is not list and type(items) is not dict:
            raise Defer
        scope = dict(env)
        count = 0
        for item in items:
            scope[var] = item
            count += _predicate(body(scope))
        return count == 1

    return exists_one


def _filter(target: Fast, var: str, body: Fast) -> Fast:
    def filter_(env: dict[str, Any]) -> list[Any]:
        items = target(env)
        if type(items) is not list:
            raise Defer  # over a map the result's order is the engine's random key order
        scope = dict(env)
        out = []
        for item in items:
            scope[var] = item
            if _predicate(body(scope)):
                out.append(item)
        return out

    return filter_


def _map(target: Fast, var: str, body: Fast) -> Fast:
    def map_(env: dict[str, Any]) -> list[Any]:
        items = target(env)
        if type(items) is not list:
            raise Defer
        scope = dict(env)
        out = []
        for item in items:
            scope[var] = item
            out.append(body(scope))
        return out

    return map_


_MACROS: dict[str, Callable[[Fast, str, Fast], Fast]] = {
    "exists": _exists, "all": _all, "exists_one": _exists_one, "filter": _filter, "map": _map,
}  # fmt: skip
_BUILTINS = frozenset({"has", "size", "type", *_STRING_METHODS, *_MACROS})


def compile_fast(source: str) -> Fast | None:
    """Compile `source` (already accepted by the Rust engine) to a closure over the plain
    activation, or None when it uses CEL the fast path leaves to the engine.

    The closure returns the value the engine would return, or raises (`Defer` or another
    error) when the engine must evaluate; only results of a type in `FAST_RESULTS` are final.
    """
    try:
        return _compile(_Parser(source).parse())
    except (_Unsupported, RecursionError, IndexError, ValueError):
        return None


class _NotSure(Exception):
    """`kinds_read` cannot bound what the expression reads."""


def kinds_read(source: str, variable: str, field: str) -> frozenset[str] | None:
    """The `kind` values of the items of `variable.field` that `source` can depend on, or None when unsure.

    Sure only when every use of `variable` selects a field by name and `variable.field` is used only
    as the target of `exists(v, P)` where P holds only for an item whose `v.kind` is one of the
    string literals P tests: `v.kind == "x"`, `v.kind in ["x", ...]`, `||` of such tests, `&&` with
    one. An item of any other kind makes P false without an error, and `exists` over a list does
    not change when such items are left out: a scan that can only produce them cannot change the
    result. Used to skip response scans whose findings no disclosure rule reads.
    """
    try:
        kinds: set[str] = set()
        _kinds_in(_Parser(source).parse(), variable, field, kinds)
        return frozenset(kinds)
    except (_NotSure, _Unsupported, RecursionError, IndexError, ValueError):
        return None


def _kinds_in(node: Node, variable: str, field: str, kinds: set[str]) -> None:
    """Add to `kinds` what `node` reads of `variable.field` (see `kinds_read`); raise _NotSure if unbounded."""
    target = ("sel", ("id", variable), field)

    def exists_over_field(node: Node) -> bool:
        if node[0] != "call" or node[1] != "exists" or node[2] != target:
            return False
        args = node[3]
        if len(args) != 2 or args[0][0] != "id":
            raise _NotSure
        bound = _kind_bound(args[1], args[0][1])
        if bound is None:
            raise _NotSure
        kinds.update(bound)
        _kinds_in(args[1], variable, field, kinds)
        return True

    def select(name: str) -> None:
        if name == field:
            raise _NotSure

    _selections(node, variable, select, exists_over_field)


def _selections(node: Node, variable: str, select: Callable[[str], None], handled: Callable[[Node], bool] | None = None) -> None:
    """Walk `node`, calling `select(f)` for each `variable.f`; raise _NotSure where `variable` is read
    any other way. `handled(n)`, if given, is asked first about each node and answers True for one
    it has dealt with itself (its children are not walked)."""
    if handled is not None and handled(node):
        return
    kind = node[0]
    if kind == "sel" and node[1] == ("id", variable):
        select(node[2])
        return
    if kind == "id" and node[1] == variable:
        raise _NotSure
    for child in _children(node):
        _selections(child, variable, select, handled)


def _children(node: Node) -> list[Node]:
    """The sub-expressions of a parsed node; raise _NotSure for a node kind not known here."""
    kind = node[0]
    if kind in ("lit", "id"):
        return []
    if kind == "list":
        return list(node[1])
    if kind == "rel":
        return [node[2], node[3]]
    if kind == "call":
        return ([node[2]] if node[2] is not None else []) + list(node[3])
    if kind in ("sel", "not", "neg"):
        return [node[1]]
    if kind in ("idx", "and", "or", "add"):
        return [node[1], node[2]]
    if kind == "cond":
        return [node[1], node[2], node[3]]
    raise _NotSure


def _kind_bound(node: Node, item: str) -> set[str] | None:
    """The kinds an item must have for `node` to hold (None: not bounded by its kind)."""
    kind_of = ("sel", ("id", item), "kind")
    if node[0] == "rel" and node[1] == "==":
        for left, right in ((node[2], node[3]), (node[3], node[2])):
            if left == kind_of and right[0] == "lit" and type(right[1]) is str:
                return {right[1]}
        return None
    if node[0] == "rel" and node[1] == "in" and node[2] == kind_of and node[3][0] == "list":
        items = node[3][1]
        if all(n[0] == "lit" and type(n[1]) is str for n in items):
            return {n[1] for n in items}
        return None
    if node[0] == "or":
        left, right = _kind_bound(node[1], item), _kind_bound(node[2], item)
        return None if left is None or right is None else left | right
    if node[0] == "and":
        left, right = _kind_bound(node[1], item), _kind_bound(node[2], item)
        if left is None or right is None:
            return left if right is None else right
        return left & right
    return None


def fields_read(source: str, variable: str) -> frozenset[str] | None:
    """The fields of `variable` that `source` selects by name (`variable.f`, `has(variable.f)`),
    or None when it may read `variable` some other way (the bare name, `variable["f"]`, a macro
    over it) or the source is not understood.

    A comprehension variable of the same name can only make the answer larger, or None. Used to build
    only the parts of the answer a disclosure rule can read.
    """
    try:
        fields: set[str] = set()
        _selections(_Parser(source).parse(), variable, fields.add)
        return frozenset(fields)
    except (_NotSure, _Unsupported, RecursionError, IndexError, ValueError):
        return None
