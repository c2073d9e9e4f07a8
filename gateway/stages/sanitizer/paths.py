"""JSON paths: format and parse them, and redact the values they point at.

Paths look like `$.files[2].path`; keys that are not identifiers are written `$["a key"]` (JSON
string syntax, so invisible characters show as escapes). Redaction paths may also use `*` / `[*]`
wildcards. No I/O; the regexes are compiled at import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["STAR", "format_path", "parse_path", "redact_paths", "split_joined_path"]

_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATH_STEP: Final = re.compile(
    r"\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>\d+)\]|(?P<star>\.\*|\[\*\])"
    r'|\[(?P<quoted>"(?:[^"\\]|\\.)*")\]'
)


class _Star:
    """The `*` step of a redaction path: every key or element."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


STAR: Final = _Star()


def child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.match(key):
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key)}]"


def format_path(steps: Iterable[str | int]) -> str:
    """Render path steps (keys and indexes) as a JSON path starting at `$`."""
    path = "$"
    for step in steps:
        path = child_path(path, step)
    return path


def split_joined_path(path: str) -> list[str]:
    """The paths in a finding's joined path ("$.part1+$.part2", a secret split across fields).

    Raises:
        ValueError: a part is not a path `parse_path` accepts.
    """
    parts: list[str] = []
    start, pos = 0, 1
    while pos < len(path):
        if path.startswith("+$", pos):
            parts.append(path[start:pos])
            start, pos = pos + 1, pos + 2
            continue
        m = _PATH_STEP.match(path, pos)
        if m is None:
            raise ValueError(f"bad JSON path {path!r} at offset {pos}")
        pos = m.end()
    parts.append(path[start:])
    return parts


def parse_path(path: str) -> tuple[str | int | _Star, ...]:
    """Parse a JSON path as `format_path` writes it, plus `*` / `[*]` wildcards.

    Raises:
        ValueError: the path is not of that form (check rule files at load time).
    """
    if not path.startswith("$"):
        raise ValueError(f"JSON path must start with '$': {path!r}")
    steps: list[str | int | _Star] = []
    pos = 1
    while pos < len(path):
        m = _PATH_STEP.match(path, pos)
        if m is None:
            raise ValueError(f"bad JSON path {path!r} at offset {pos}")
        if m.group("name") is not None:
            steps.append(m.group("name"))
        elif m.group("index") is not None:
            steps.append(int(m.group("index")))
        elif m.group("star") is not None:
            steps.append(STAR)
        else:
            steps.append(json.loads(m.group("quoted")))
        pos = m.end()
    return tuple(steps)


def redact_paths(value: Any, paths: Iterable[str]) -> Any:
    """Return a copy with the values at these JSON paths replaced by "[REDACTED]".

    Paths use `parse_path` syntax (wildcards allowed); paths that do not exist are ignored.
    Only the containers on a redacted path are copied: the rest is shared with the input,
    which is never modified.

    Raises:
        ValueError: a path is malformed.
    """
    for steps in [parse_path(p) for p in paths]:
        value = _redact_at(value, steps, 0)
    return value


def _redact_at(node: Any, steps: tuple[str | int | _Star, ...], i: int) -> Any:
    if i == len(steps):
        return "[REDACTED]"
    step = steps[i]
    if isinstance(node, dict):
        keys = list(node) if step is STAR else [step] if step in node else []
        if not keys:
            return node
        new = dict(node)
        for k in keys:
            new[k] = _redact_at(node[k], steps, i + 1)
        return new
    if isinstance(node, (list, tuple)):
        if step is STAR:
            indexes = range(len(node))
        elif type(step) is int and step < len(node):
            indexes = range(step, step + 1)
        else:
            return node
        items = list(node)
        for j in indexes:
            items[j] = _redact_at(node[j], steps, i + 1)
        return items
    return node
