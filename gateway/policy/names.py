"""Tool names in one spelling: `get-tiny-image`, `getTinyImage`, `get.tiny.image` and `GET_TINY_IMAGE`
all fold to `get_tiny_image`.

Servers name tools in every style (kebab, camel, dotted, snake, upper case), while a policy author
writes one glob (`get_*`). Every tool-name glob of a policy (grants, dharma and disclosure rules'
`tools`, sensitivity, rate limits, tool costs and annotations, the CEL helper `tool_glob`) is matched
on folded names, so a grant or a deny rule cannot miss a tool because of its spelling.

The security argument: folding is many-to-one, so two distinct tools of one catalog could fold to
one name and be told apart by exact comparisons (pins, approvals, the ledger) but not by globs. The
MCP governance refuses such a pair (`collisions`): neither is listed or callable, and the gateway
says why. Names stay as the server spelled them everywhere else (ledger, pins, calls forwarded).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable

__all__ = ["collisions", "fold_glob", "fold_name", "name_matches"]

#: Camel-case boundaries: `aB` / `1B` (a word starts) and `ABc` (an acronym ends: HTTPRequest).
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[-._]+")


@functools.lru_cache(maxsize=16_384)
def fold_name(name: str) -> str:
    """The one spelling of a tool name: camel-case words split, `-` `.` `_` runs as one `_`, lower case."""
    return _SEPARATORS.sub("_", _CAMEL.sub("_", name)).casefold()


@functools.lru_cache(maxsize=4_096)
def fold_glob(pattern: str) -> str:
    """A tool-name glob folded like the names it matches: literal runs fold as names do, `*` and `?`
    stay, and a `[set]` only loses case (its `-` may be a range)."""
    out: list[str] = []
    literal: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        end = _set_end(pattern, i) if c == "[" else -1
        if c in "*?" or end > 0:
            out.append(fold_name("".join(literal)))
            literal.clear()
            out.append(c if end < 0 else pattern[i:end].casefold())
            i = i + 1 if end < 0 else end
        else:
            literal.append(c)
            i += 1
    out.append(fold_name("".join(literal)))
    return "".join(out)


@functools.lru_cache(maxsize=16_384)
def name_matches(name: str, pattern: str) -> bool:
    """Whether a tool name matches a tool-name glob (fnmatch on folded spellings); memoised, as every
    call matches its tool against the same few globs."""
    return fnmatch.fnmatchcase(fold_name(name), fold_glob(pattern))


def _set_end(pattern: str, start: int) -> int:
    """The index after the `[...]` set opening at `start`, as fnmatch reads it; -1 for a literal `[`."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "!":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    end = pattern.find("]", i)
    return -1 if end < 0 else end + 1


def collisions(names: Iterable[str]) -> dict[str, str]:
    """Each name of a catalog that folds to the same name as another one of it, with that other one."""
    first: dict[str, str] = {}
    found: dict[str, str] = {}
    for name in names:
        key = fold_name(name)
        other = first.setdefault(key, name)
        if other != name:
            found[name] = other
            found.setdefault(other, name)
    return found
