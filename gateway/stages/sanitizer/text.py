"""Text cleaning: strip invisible, bidi-control, tag and control characters, then NFKC.

Lone surrogates (what undecodable bytes turn into) are refused, never passed on. No I/O; the
regexes are compiled at import.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Final

from gateway.stages.sanitizer.errors import SanitizeError

__all__ = ["SHELL_SYNTAX", "STRIPPED_RANGES", "clean_shell_text", "clean_text"]

# Unicode category Cf as of Unicode 14 (Python 3.11); a test checks this against unicodedata.
_CF_RANGES: Final = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
)  # fmt: skip
_OTHER_STRIP_RANGES: Final = (
    (0x0000, 0x0008), (0x000B, 0x000C), (0x000E, 0x001F), (0x007F, 0x009F),  # C0/C1 but \t \n \r
    (0xE0000, 0xE007F),  # tag characters (invisible ASCII smuggling)
    (0xE0100, 0xE01EF),  # variation selectors supplement (used to smuggle bytes)
    (0x115F, 0x1160), (0x3164, 0x3164), (0xFFA0, 0xFFA0),  # Hangul fillers (blank "letters")
)  # fmt: skip
STRIPPED_RANGES: Final = _CF_RANGES + _OTHER_STRIP_RANGES


def _char_class(ranges: Iterable[tuple[int, int]]) -> str:
    return "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges
    )


_STRIP: Final = re.compile(f"[{_char_class(STRIPPED_RANGES)}]+")
_ASCII_CTRL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class BadChar(ValueError):
    def __init__(self, index: int, char: str) -> None:
        super().__init__(index, char)
        self.index = index
        self.char = char


def clean_or_raise(s: str) -> str:
    """Return `s` cleaned; the very same object when nothing changed. Raises BadChar."""
    if s.isascii():
        if s.isprintable() or _ASCII_CTRL.search(s) is None:
            return s
        return _ASCII_CTRL.sub("", s)
    bad = _SURROGATE.search(s)
    if bad is not None:
        raise BadChar(bad.start(), bad.group())
    t = _STRIP.sub("", s)
    if not t.isascii() and not unicodedata.is_normalized("NFKC", t):
        n = unicodedata.normalize("NFKC", t)
        stripped = _STRIP.sub("", n)  # NFKC can map to a stripped char (U+FFA0 -> U+1160)
        t = n if stripped == n else unicodedata.normalize("NFKC", stripped)
    return s if t == s else t


#: What bash reads as syntax (quotes, grouping, separators, expansions, globs). NFKC turns some
#: letters into these (`（` → `(`, `＂` → `"`, `；` → `;`, NBSP → space), which bash would not.
SHELL_SYNTAX: Final = frozenset(" \t\n\r;&|()<>'\"`$\\{}[]*?!#=,")
_NON_ASCII: Final = re.compile(r"[^\x00-\x7f]+")


def clean_shell_text(s: str) -> str:
    """`clean_text` for a command bound for a shell: the same stripping and NFKC, except that a
    character whose NFKC form holds shell syntax stays as it is. Bash reads `（` or `＂` as a
    letter; rewriting it to `(` or `"` would hand the shell a different command (often one that
    does not parse) from the one the agent wrote. Raises BadChar as `clean_or_raise` does."""
    if s.isascii() or unicodedata.is_normalized("NFKC", _STRIP.sub("", s)):
        return clean_or_raise(s)
    bad = _SURROGATE.search(s)
    if bad is not None:
        raise BadChar(bad.start(), bad.group())
    return _NON_ASCII.sub(lambda m: "".join(_clean_shell_char(ch) for ch in m.group()), _ASCII_CTRL.sub("", s))


def _clean_shell_char(ch: str) -> str:
    cleaned = clean_or_raise(ch)
    return ch if cleaned != ch and any(c in SHELL_SYNTAX for c in cleaned) else cleaned


def bad_char_message(what: str, exc: BadChar) -> str:
    return (
        f"{what} contains a lone surrogate U+{ord(exc.char):04X} at index {exc.index} "
        "(invalid UTF-8/UTF-16 in the request)"
    )


def clean_text(s: str) -> str:
    """Strip invisible, bidi-control, tag and control characters (not \\t \\n \\r), then NFKC.

    Raises:
        SanitizeError: `s` holds a lone surrogate (what undecodable bytes turn into).
    """
    try:
        return clean_or_raise(s)
    except BadChar as exc:
        raise SanitizeError(bad_char_message("string", exc), "$") from None
