"""What the CEL adapter and both engine modules share: errors, the helper registry, check types.

`HELPERS` is the one registry of CEL helper functions (name → function + declared result
type): both engines read it, so adding a helper is one `register_helper` call here. The
adapter `gateway.policy.cel` re-exports the public names. Imports no CEL engine. No I/O.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import posixpath
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway.memo import Memo
from gateway.policy.names import name_matches
from gateway.sensitive_paths import sensitive_path

_MAX_MESSAGE = 300

MACROS = frozenset({"all", "exists", "exists_one", "filter", "map"})
#: Type denotations (``type(x) == string``): identifiers, but never variables.
TYPE_NAMES = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)

#: One CEL token (whitespace and comments, string, number, identifier, operator): the Rust
#: engine's reference scan and the fast evaluator's parser both read source through it.
TOKEN = re.compile(
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


def shorten(text: str) -> str:
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


def tool_glob(name: str, pattern: str) -> bool:
    """Match a tool name against a tool-name glob as the policy's `tools` lists do: on folded
    spellings (`get-sum`, `getSum` and `get_sum` are one name; `gateway.policy.names`)."""
    _need_str("tool_glob", name, pattern)
    return name_matches(name, pattern)


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


#: `regex_matches` answers for short strings, keyed on the exact (pattern, string): a search's
#: answer depends on nothing else. The same path, command name or finding kind is tested by the
#: same rules on every call, and RE2's Python wrapper costs ~2 µs a search. Bounded: emptied when full.
_MATCHED: Memo[tuple[str, str], bool] = Memo(4096)
_MATCHED_LONGEST = 256


def regex_matches(s: str, pattern: str) -> bool:
    """`matches()` for both engines: RE2 (as the CEL spec says), each pattern compiled once.

    The Rust engine recompiles the pattern on every evaluation (70-900 µs a call); routing
    both engines through one cached RE2 also makes their regex dialects identical.
    """
    key = (s, pattern)
    try:
        return _MATCHED[key]
    except (KeyError, TypeError):  # TypeError: an unhashable non-string, refused just below
        pass
    _need_str("matches", s, pattern)
    found = _regex(pattern).search(s) is not None
    if len(s) <= _MATCHED_LONGEST:
        _MATCHED.remember(key, found)
    return found


# --------------------------------------------------------------------------- session helpers
#
# Sequence rules ask what earlier calls of this session did: `session.seen(class, within)`,
# `session.count(class, within)`, `session.paths(class, within)`. The receiver is the `session`
# variable (gateway.policy.evaluate.call_variables): `calls` oldest first, each with `classes`,
# `paths` (class → list), `at` (epoch seconds) and `ran` (it reached its backend), and `now`.
# `class` is one class name or a list of them; `within` is a duration string ("90s", "10m",
# "1h30m") measured back from this call, or a positive int: the last N calls of the session.
# Only calls that ran count: a refused read put nothing in the agent's hands. The one exception
# is `session.refused(class, within)`, which looks at the calls that did not run.

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


@functools.lru_cache(maxsize=256)
def duration_seconds(text: str) -> float:
    """Seconds in a duration such as "90s", "10m" or "1h30m" (units ms, s, m, h, d)."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"within must be a duration such as \"10m\" or \"1h30m\", or a number of calls; got {text!r}")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _field(value: Any, key: str, default: Any = None) -> Any:
    """`value[key]` if `value` is a map holding it, else `default` (cel-python's map `get` raises)."""
    return value[key] if isinstance(value, dict) and key in value else default


def _session_window(fn: str, session: Any, within: Any, *, ran: bool = True) -> list[Any]:
    """The calls of `session` inside `within` that reached their backend (`ran`), or that did not
    (refused, held, dry runs), oldest first."""
    if not isinstance(_field(session, "calls"), list):
        raise TypeError(f"{fn}() is called on the session: session.{fn}(class, within)")
    calls = session["calls"]
    if isinstance(within, bool) or not isinstance(within, (int, str)):
        raise TypeError(f"{fn}(): within must be a duration string or a number of calls, got {type(within).__name__}")
    if isinstance(within, int):
        if within <= 0:
            raise ValueError(f"{fn}(): within must be a positive number of calls, got {within}")
        chosen = calls[-within:]
    else:
        since = float(_field(session, "now", 0)) - duration_seconds(str(within))
        chosen = [c for c in calls if float(_field(c, "at", float("-inf"))) >= since]
    return [c for c in chosen if isinstance(c, dict) and bool(_field(c, "ran", True)) is ran]


def _class_names(fn: str, classes: Any) -> tuple[str, ...]:
    if isinstance(classes, str):
        return (str(classes),)
    if isinstance(classes, list) and all(isinstance(c, str) for c in classes):
        return tuple(str(c) for c in classes)
    raise TypeError(f"{fn}(): class must be a class name or a list of them, got {type(classes).__name__}")


def _has_class(call: dict[str, Any], names: tuple[str, ...]) -> bool:
    have = _field(call, "classes") or ()
    return any(n in have for n in names)


def session_seen(session: Any, classes: Any, within: Any) -> bool:
    """Whether a call of this session within `within` had one of `classes` (see above)."""
    names = _class_names("seen", classes)
    return any(_has_class(c, names) for c in _session_window("seen", session, within))


def session_refused(session: Any, classes: Any, within: Any) -> bool:
    """Whether a call of this session within `within` had one of `classes` and was refused or
    held (it did not reach its backend and its decision was deny or require_approval; a dry run
    of an allowed call is neither): an attempt that put nothing in the agent's hands, but says
    what the agent is after."""
    names = _class_names("refused", classes)
    return any(_has_class(c, names) and _field(c, "decision") in _REFUSING
               for c in _session_window("refused", session, within, ran=False))


_REFUSING = frozenset({"deny", "require_approval"})


def session_count(session: Any, classes: Any, within: Any) -> int:
    """How many calls of this session within `within` had one of `classes`."""
    names = _class_names("count", classes)
    return sum(1 for c in _session_window("count", session, within) if _has_class(c, names))


def session_paths(session: Any, classes: Any, within: Any) -> list[str]:
    """The paths/URLs the calls of this session within `within` touched as one of `classes`, oldest first."""
    names = _class_names("paths", classes)
    out: dict[str, None] = {}
    for call in _session_window("paths", session, within):
        by_class = _field(call, "paths")
        for name in names:
            for p in _field(by_class, name) or ():
                out[str(p)] = None
    return list(out)


# --------------------------------------------------------------------------- egress helpers
#
# Egress rules ask whether a URL of `args_urls` is on one of the caller's lists (`egress.allow`,
# `egress.deny`: the profile's `egress:` section for the caller's tier, docs/detection.md "Egress"):
# `egress_listed(u, egress.allow)`. An entry is a domain (`example.com`: it and every name under
# it; `*.example.com` or `.example.com`: only the names under it), an IP address or a CIDR block
# (`10.20.0.0/16`, `fd00::/8`: matched against the address the host is or spells), each optionally
# with a port (`localhost:8080`, `[::1]:8080`, `10.0.0.0/8:5432`; without one, any port).

_PATTERN_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")


@dataclass(frozen=True, slots=True)
class EgressPattern:
    """One parsed entry of an egress list (see above)."""

    domain: str = ""
    under_only: bool = False
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    port: int = 0


def egress_pattern(text: str) -> EgressPattern:
    """Parse one egress list entry.

    Raises:
        ValueError: the entry is none of the forms above (the message says which forms there are).
    """
    if not isinstance(text, str):
        raise TypeError(f"an egress list entry is a string, got {type(text).__name__}")
    entry = text.strip().lower()
    if "://" in entry:
        raise ValueError(f"egress entry {text!r} is a URL: list its host (and :port), e.g. {entry.split('://', 1)[1].split('/', 1)[0]!r}")
    host, port = entry, ""
    if entry.startswith("["):
        end = entry.find("]")
        host, port = entry[1:end] if end > 0 else entry, entry[end + 1:] if end > 0 else ""
        if port and not port.startswith(":"):
            raise ValueError(f"egress entry {text!r}: only a port may follow an IPv6 address in brackets")
        port = port[1:]
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    if port and not (port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"egress entry {text!r}: the port must be a number from 1 to 65535")
    try:
        return EgressPattern(network=ipaddress.ip_network(host, strict=False), port=int(port or 0))
    except ValueError:
        pass
    under_only = host.startswith(("*.", "."))
    name = host[2:] if host.startswith("*.") else host[1:] if host.startswith(".") else host
    if not name or not _PATTERN_NAME.fullmatch(name.rstrip(".")):
        raise ValueError(f"egress entry {text!r} is not a domain (example.com, *.example.com; IDNs in punycode, "
                         "xn--...), an IP address or CIDR block (10.0.0.0/8, fd00::/8), with an optional :port")
    return EgressPattern(domain=name.rstrip("."), under_only=under_only, port=int(port or 0))


@functools.lru_cache(maxsize=256)
def _egress_patterns(entries: tuple[str, ...]) -> tuple[EgressPattern, ...]:
    return tuple(egress_pattern(e) for e in entries)


@functools.lru_cache(maxsize=1024)
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def egress_listed(url: Any, entries: Any) -> bool:
    """Whether a URL of `args_urls` (its `host`, `ip` and `port`) is on an egress list."""
    if not isinstance(url, dict) or not all(k in url for k in ("host", "ip", "port")):
        raise TypeError("egress_listed() takes a URL of args_urls (a map with host, ip and port) and a list")
    if not isinstance(entries, list):
        raise TypeError(f"egress_listed(): the list must be a list of entries, got {type(entries).__name__}")
    host, port = str(url["host"]), url["port"]
    address = _address(str(url["ip"])) if url["ip"] else None
    for p in _egress_patterns(tuple(entries)):
        if p.port and p.port != port:
            continue
        if p.network is not None:
            if address is not None and address.version == p.network.version and address in p.network:
                return True
        elif host.endswith("." + p.domain) or (host == p.domain and not p.under_only):
            return True
    return False


# --------------------------------------------------------------------------- the helper registry

#: Result types a helper may declare: what both engines carry back into CEL without loss.
RESULT_TYPES: tuple[type, ...] = (bool, int, float, str, list)


@dataclass(frozen=True, slots=True)
class Helper:
    """One CEL helper: its name in expressions, the Python function, and its declared result type.

    Calling a Helper runs the function and checks the result against the declared type, so a
    helper that returns the wrong kind fails the same way on both engines (a CelEvalError).
    `overrides_builtin` marks a helper that replaces an engine built-in of the same name.
    """

    name: str
    fn: Callable[..., Any]
    result: type
    overrides_builtin: bool = False

    def __call__(self, *args: Any) -> Any:
        value = self.fn(*args)
        if not isinstance(value, self.result) or (isinstance(value, bool) and self.result is not bool):
            raise TypeError(f"{self.name}() returned {type(value).__name__}, declared {self.result.__name__}")
        return value


#: The one place CEL helpers are registered; both engines read it when they compile and evaluate.
HELPERS: dict[str, Helper] = {}

_HELPER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def register_helper(name: str, fn: Callable[..., Any], result: type, *, overrides_builtin: bool = False) -> Helper:
    """Make `fn` callable from CEL as `name(...)` on both engines; `result` is its declared result type.

    `fn` must be a pure function of its arguments: the Rust engine's fast path
    (`gateway.policy.cel.fast`) calls it too, and may then leave the expression to the engine,
    which calls it again.

    Raises:
        ValueError: the name is not an identifier, is taken, or the result type is not supported.
    """
    if not _HELPER_NAME.fullmatch(name):
        raise ValueError(f"CEL helper name {name!r} is not an identifier")
    if name in HELPERS:
        raise ValueError(f"CEL helper {name!r} is already registered")
    if result not in RESULT_TYPES:
        allowed = ", ".join(t.__name__ for t in RESULT_TYPES)
        raise ValueError(f"CEL helper {name!r} declares result type {result!r}; expected one of {allowed}")
    helper = HELPERS[name] = Helper(name, fn, result, overrides_builtin)
    return helper


def unregister_helper(name: str) -> None:
    """Remove a helper (tests that register their own); unknown names are ignored."""
    HELPERS.pop(name, None)


register_helper("glob", glob, bool)
register_helper("tool_glob", tool_glob, bool)
register_helper("lower", lower, str)
register_helper("path_normalize", path_normalize, str)
register_helper("path_within", path_within, bool)
register_helper("sensitive_path", sensitive_path, bool)
register_helper("upper", upper, str)
register_helper("matches", regex_matches, bool, overrides_builtin=True)
register_helper("seen", session_seen, bool)
register_helper("refused", session_refused, bool)
register_helper("count", session_count, int)
register_helper("paths", session_paths, list)
register_helper("egress_listed", egress_listed, bool)


# --------------------------------------------------------------------------- shared checks

Pos = tuple[int, int]
Refs = dict[str, Pos]
Funcs = list[tuple[str, Pos]]
Compiled = tuple[Callable[[Any], Any], Refs, Funcs]


def bad_macro(name: str, pos: Pos) -> CelSyntaxError:
    return CelSyntaxError(
        f"{name}() takes exactly (variable, expression); map(x, p, t) and two-variable "
        "comprehensions are not supported by both engines",
        line=pos[0],
        column=pos[1],
    )
