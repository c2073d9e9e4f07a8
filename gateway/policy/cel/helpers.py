"""What the CEL adapter and both engine modules share: errors, helper functions, check types.

Private to `gateway.policy.cel`, which re-exports the public names (`CelError` and its subclasses,
`glob`, `path_normalize`, `path_within`, `lower`, `upper`). Imports no CEL engine. No I/O.
"""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import re
from collections.abc import Callable, Iterable
from typing import Any

_MAX_MESSAGE = 300

_MACROS = frozenset({"all", "exists", "exists_one", "filter", "map"})
#: Type denotations (``type(x) == string``): identifiers, but never variables.
_TYPE_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)


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
