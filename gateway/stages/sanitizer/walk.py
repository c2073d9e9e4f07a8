"""The sanitizer's pure core: one walk over a call's arguments, then schema validation.

`sanitize(arguments, limits, input_schema)` makes ONE iterative walk over the arguments that
checks every limit, rejects non-JSON values and lone surrogates, strips invisible, bidi-control,
tag and control characters from keys and strings, NFKC-normalises them, and collects findings
(secrets and personal data) from the cleaned strings. The cleaned copy is then validated against
the tool's inputSchema.

This module is also the sanitizer's public interface; the parts live next to it, each usable on
its own: `sanitize_text` (`clean_text`), `sanitize_secrets` (`detect_secrets`, `redact_secrets`,
e.g. on backend responses in the disclosure phase), `sanitize_schema` (`compile_schema`),
`sanitize_paths` (`format_path`, `parse_path`, `redact_paths`), `sanitize_errors`.

No I/O, no clock, no logging, no event loop.

Measured (Python 3.11, best of 40 runs on a shared, loaded 2-core box; `sanitize` incl. detection):
    5 keys, short strings:     ~4.5 µs without a schema, ~9 µs with a 5-property schema
    9 KB, ~420 values:         ~0.55 ms without a schema, ~0.6 ms with one (jsonschema alone: ~2 ms;
                               the fast path handles common keywords and defers the rest to it)
    clean_text: 0.1 µs for ASCII, ~1.7 µs for a short non-ASCII string
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.core.call import Finding
from gateway.stages.sanitizer.errors import SanitizeError, json_type_name
from gateway.stages.sanitizer.paths import STAR, child_path, format_path, parse_path, redact_paths, split_joined_path
from gateway.stages.sanitizer.schema import SchemaValidator, compile_schema
from gateway.stages.sanitizer.secrets import (
    MIN_SCAN,
    NO_KINDS,
    Spread,
    add_findings,
    charcode_hits,
    detect_secrets,
    key_edges,
    kind_of_key,
    redact_secrets,
    split_piece,
    split_secrets,
    value_hits,
)
from gateway.stages.sanitizer.text import STRIPPED_RANGES, BadChar, bad_char_message, clean_or_raise, clean_text

__all__ = [
    "STAR",
    "STRIPPED_RANGES",
    "SanitizeError",
    "Sanitized",
    "SanitizerLimits",
    "SchemaValidator",
    "clean_text",
    "compile_schema",
    "detect_secrets",
    "format_path",
    "parse_path",
    "redact_paths",
    "redact_secrets",
    "sanitize",
    "split_joined_path",
]

# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class SanitizerLimits:
    """Hard limits on one call's arguments (a profile's `sanitizer:` section)."""

    max_bytes: int = 1_048_576  # approximate UTF-8 JSON size of the cleaned arguments
    max_depth: int = 32  # nesting of objects/arrays; the arguments object itself is depth 1
    max_string: int = 262_144  # characters in one string or key (before and after NFKC)
    max_items: int = 10_000  # total number of values: object keys + object values + array elements


@dataclass(frozen=True, slots=True)
class Sanitized:
    """The result of `sanitize`: a cleaned copy of the arguments and what was detected in it."""

    arguments: dict[str, Any]
    findings: tuple[Finding, ...]
    changed: bool  # True when cleaning altered a key or a string


# --------------------------------------------------------------------------- sanitize

_MAX_SAFE_INT: Final = 2**53 - 1  # beyond this, canonical JSON (the ledger digest) cannot encode it
_JSON_TYPES: Final = frozenset({str, int, float, bool, type(None), dict, list, tuple})


def _plain(v: Any, where: Callable[[], str]) -> Any:
    """A subclass of a JSON type (StrEnum, IntEnum, OrderedDict, ...) as its base type."""
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, dict):
        return dict(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    raise SanitizeError(f"{json_type_name(v)} value is not JSON", where())


def _clean_key(key: Any, path: str, max_string: int) -> str:
    if not isinstance(key, str):
        raise SanitizeError(f"object key {key!r} is not a string", path)
    if len(key) > max_string:
        raise SanitizeError(f"object key longer than {max_string} characters", path)
    try:
        return clean_or_raise(str.__str__(key))
    except BadChar as exc:
        raise SanitizeError(bad_char_message(f"object key {json.dumps(key)}", exc), path) from None


def _collision(key: str, cleaned: str, path: str, src: dict[Any, Any]) -> SanitizeError:
    def cleans_to(k: Any) -> bool:
        try:
            return isinstance(k, str) and k != key and clean_or_raise(k) == cleaned
        except BadChar:
            return False

    other = next((k for k in src if cleans_to(k)), cleaned)
    return SanitizeError(
        f"object keys {json.dumps(other)} and {json.dumps(key)} collide after cleaning "
        f"(both become {json.dumps(cleaned)})",
        path,
    )


def _walk(root: dict[Any, Any], limits: SanitizerLimits) -> tuple[dict[str, Any], list[Finding], bool]:
    """One iterative pass: limits, JSON types, cleaning, findings. Paths are built only when needed."""
    max_depth, max_string, max_items, max_bytes = limits.max_depth, limits.max_string, limits.max_items, limits.max_bytes
    if max_depth < 1:
        raise SanitizeError(f"nesting deeper than {max_depth}", "$")
    findings: list[Finding] = []
    changed = False
    items = size = 0
    out: dict[str, Any] = {}
    stack: list[tuple[Any, Any, str, int, tuple[int, ...]]] = [(root, out, "$", 1, ())]
    spread = Spread()  # short strings of every object: a secret split across objects
    while stack:
        src, dst, path, depth, order = stack.pop()
        is_object = type(dst) is dict
        n = len(src)
        items += 2 * n if is_object else n
        size += 2 + 2 * n if is_object else 2 + n  # brackets, separators
        if items > max_items:
            raise SanitizeError(f"more than {max_items} values in total", path)
        entries: Iterable[tuple[Any, Any]] = src.items() if is_object else enumerate(src)
        pieces: list[tuple[str | int, str, frozenset[str]]] = []  # short strings: a secret may be split across them
        indexes: list[int] = []
        texts: list[tuple[str | int, str, frozenset[str]]] = []  # every string: a key cut at a seam
        for i, (key, v) in enumerate(entries):
            key_kind = None
            if is_object:
                raw = key
                if type(key) is str and key.isascii() and key.isprintable() and len(key) <= max_string:
                    size += len(key) + 2
                else:
                    key = _clean_key(raw, path, max_string)
                    size += len(key.encode()) + 2
                    if key != raw:
                        changed = True
                if key in dst:
                    raise _collision(raw, key, path, src)
                key_kind = kind_of_key(key)
            t = type(v)
            if t not in _JSON_TYPES:
                v = _plain(v, lambda: child_path(path, key))
                t = type(v)
            if t is str:
                if len(v) > max_string:
                    raise SanitizeError(f"string longer than {max_string} characters", child_path(path, key))
                if v.isascii():
                    c = v if v.isprintable() else clean_or_raise(v)
                    size += len(c) + 2
                else:
                    try:
                        c = clean_or_raise(v)
                    except BadChar as exc:
                        raise SanitizeError(bad_char_message("string", exc), child_path(path, key)) from None
                    if len(c) > max_string:
                        raise SanitizeError(
                            f"string longer than {max_string} characters after normalisation", child_path(path, key)
                        )
                    size += len(c.encode()) + 2
                if c is not v:
                    changed = True
                    v = c
                hits = value_hits(v, key_kind) if key_kind is not None or len(v) >= MIN_SCAN else []
                if hits:
                    add_findings(hits, child_path(path, key), findings)
                kinds = frozenset(h[0] for h in hits) if hits else NO_KINDS
                if split_piece(v):
                    pieces.append((key, v, kinds))
                    indexes.append(i)
                texts.append((key, v, kinds))
            elif t is dict or t is list or t is tuple:
                child = child_path(path, key)
                if depth >= max_depth:
                    raise SanitizeError(f"nesting deeper than {max_depth}", child)
                new: Any = {} if t is dict else []
                stack.append((v, new, child, depth + 1, order + (i,)))
                v = new
            elif t is int:
                if not -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT:
                    raise SanitizeError("integer outside the interoperable range ±(2**53-1)", child_path(path, key))
                size += len(str(v))
                if key_kind == "otp_code":
                    add_findings(value_hits(v, key_kind), child_path(path, key), findings)
            elif t is float:
                if not math.isfinite(v):
                    raise SanitizeError(f"{v!r} is not a JSON number", child_path(path, key))
                size += len(repr(v))
            else:  # bool or None
                size += 5
            if size > max_bytes:
                raise SanitizeError(f"arguments larger than {max_bytes} bytes", child_path(path, key))
            if is_object:
                dst[key] = v
            else:
                dst.append(v)
        _joined_findings(path, order, pieces, indexes, dst, spread, findings)
        if len(texts) > 1:
            findings.extend(key_edges(path, texts))
    findings.extend(finding for finding, _places in spread.secrets())
    return out, findings, changed


def _joined_findings(path: str, order: tuple[int, ...], pieces: list[tuple[str | int, str, frozenset[str]]],
                     indexes: list[int], dst: Any, spread: Spread, findings: list[Finding]) -> None:
    """A container's secrets that show only joined: split across its short strings (and, later,
    `spread`: across objects), or spelled by a list of character codes."""
    if pieces:
        spread.add(order, path, pieces, indexes)
    if len(pieces) > 1:
        findings.extend(finding for finding, _parts in split_secrets(path, pieces))
    if type(dst) is list and dst and type(dst[0]) is int:
        add_findings(charcode_hits(dst), path, findings)


def sanitize(
    arguments: Any,
    limits: SanitizerLimits,
    input_schema: Mapping[str, Any] | SchemaValidator | None = None,
) -> Sanitized:
    """Check limits, clean text, validate against the schema and detect secrets, in that order.

    `None` arguments count as `{}` (MCP allows omitting them). `input_schema` may be a schema
    (compiled once and cached) or a `SchemaValidator` from `compile_schema`.

    Raises:
        SanitizeError: anything that makes the arguments unacceptable; `path` says where.
    """
    if arguments is None:
        arguments = {}
    elif not isinstance(arguments, dict):
        raise SanitizeError(f"arguments must be a JSON object, got {json_type_name(arguments)}", "$")
    cleaned, findings, changed = _walk(arguments, limits)
    if input_schema is not None:
        validator = input_schema if isinstance(input_schema, SchemaValidator) else compile_schema(input_schema)
        validator.validate(cleaned)
    return Sanitized(arguments=cleaned, findings=tuple(findings), changed=changed)
