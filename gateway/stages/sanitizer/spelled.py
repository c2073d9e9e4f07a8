"""Credentials written out rather than encoded: the secret scanner's other readings of a string.

Each reader takes a string and yields `(start, end, via, text, formats_only)`: the span it read
and what it spells. `decode.decoded_layers` turns them into layers (round 7, added after held-out
figures: es-base58-credential, es-dashed-credential, es-morse-credential):

- `base58`: a run in the Bitcoin alphabet (no `0 O I l`) that decodes, as a big number, to UTF-8
  text; a Base58Check payload (its 4-byte checksum verified) is read without checksum and version
  byte. Wallet addresses, IPFS CIDs and Solana signatures decode to random bytes, not text.
- `regrouped`: a token cut into groups by `-`, `_` or `/` (`AKIA-32KN-5SZK-…`, `g-h-p-_-D-3…`): the
  separator at every (k+1)-th place is dropped (k = the smallest group width 1..8 that fits), or
  every occurrence of it; kept only when the result shows a credential prefix (formats only).
- `morse`: 8+ Morse letters (`.`/`·`/`•` and `-`/`_`/`−`), letters apart by spaces, words by `/`,
  `|` or more spaces; read in upper and lower case (Morse has none), words apart and run together
  (formats only).
- `phonetic`: 8+ words of the NATO/ICAO spelling alphabet and digit names in a row, with case words
  (`capital`, `lowercase`, …) and symbol names (`underscore`, `dash`, …); without case words read
  in upper and lower case (formats only).
- `binary`: 8+ octets of bits (`01100111 01101000 …` or one run of 64+ bits), decoded to text.
- `rot47`: a run of printable ASCII that in ROT47 shows a credential prefix, in a string of at most
  `MAX_ROT47` characters (formats only).

Each reader is gated by a test of the whole string that ordinary text fails at once, and reads at
most `MAX_SPELLED` characters. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final

from gateway.stages.sanitizer import wallets

__all__ = ["MAX_ROT47", "MAX_SPELLED", "base58_text", "binary", "morse", "phonetic", "regrouped", "rot47", "rot47_word"]

Read = tuple[int, int, str, str, bool]

MAX_SPELLED: Final = 4_096  # characters of one string the Morse, phonetic and binary readers look at
MAX_ROT47: Final = 1_024  # a string longer than this is not read in ROT47 (a message or a field, not a page)
MAX_BASE58: Final = 400  # a base58 run longer than this is no credential's encoding (and costs quadratic time)

_BASE58_RUN: Final = re.compile(r"[1-9A-HJ-NP-Za-km-z]+")

_MORSE: Final = {
    ".-": "A", "-...": "B", "-.-.": "C", "-..": "D", ".": "E", "..-.": "F", "--.": "G", "....": "H", "..": "I",
    ".---": "J", "-.-": "K", ".-..": "L", "--": "M", "-.": "N", "---": "O", ".--.": "P", "--.-": "Q", ".-.": "R",
    "...": "S", "-": "T", "..-": "U", "...-": "V", ".--": "W", "-..-": "X", "-.--": "Y", "--..": "Z",
    "-----": "0", ".----": "1", "..---": "2", "...--": "3", "....-": "4", ".....": "5", "-....": "6", "--...": "7",
    "---..": "8", "----.": "9", "..--.-": "_", "-....-": "-", ".-.-.-": ".", "-..-.": "/", "-...-": "=", ".-.-.": "+",
}  # fmt: skip
_MORSE_SIGNS: Final = str.maketrans({"·": ".", "•": ".", "∙": ".", "−": "-", "–": "-", "—": "-", "_": "-"})
_MORSE_RUN: Final = re.compile(r"(?:[.-]{1,7}(?: {1,3}| ?[/|] ?|\n)){7,}[.-]{1,7}")
_MORSE_WORD_GAP: Final = re.compile(r" ?[/|] ?| {2,}|\n")

_PHONETIC: Final = {
    **{w: w[0].upper() for w in (
        "alfa alpha bravo charlie delta echo foxtrot golf hotel india juliet juliett kilo lima mike november oscar "
        "papa quebec romeo sierra tango uniform victor whiskey whisky xray x-ray yankee zulu").split()},
    **{w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine".split())},
    "niner": "9", "underscore": "_", "dash": "-", "hyphen": "-", "minus": "-", "dot": ".", "period": ".", "slash": "/",
}  # fmt: skip
_CASE_WORDS: Final = {"capital": "upper", "cap": "upper", "uppercase": "upper", "upper": "upper", "big": "upper",
                      "small": "lower", "lowercase": "lower", "lower": "lower"}
_FILLER: Final = frozenset({"case", "letter", "number", "digit", "then", "and"})
_WORD: Final = re.compile(r"[A-Za-z]+(?:-ray)?")
_PHONETIC_GATE: Final = ("bravo", "charlie", "foxtrot", "juliet", "november", "quebec", "sierra", "uniform", "whisk", "yankee")

_OCTETS: Final = re.compile(r"(?<![01])(?:[01]{8}[ ,;:\n-]?){8,}(?![01])")
_ROT47_RUN: Final = re.compile(r"[!-~]{16,}")
_ROT47: Final = str.maketrans({chr(c): chr(33 + (c - 33 + 47) % 94) for c in range(33, 127)})


def base58_text(run: str, as_text: Callable[[bytes], str | None]) -> str | None:
    """The text a base58 run spells (Base58Check: its payload without checksum and version), or None."""
    if not 16 <= len(run) <= MAX_BASE58 or _BASE58_RUN.fullmatch(run) is None:
        return None
    raw = wallets.b58decode(run)
    text = as_text(raw)
    if text is None and len(raw) > 5 and (body := wallets.b58check_payload(raw)) is not None:
        text = as_text(body) or as_text(body[1:])
    return text


def regrouped(run: str, shows: Callable[[str], bool]) -> Iterator[Read]:
    """A token cut into groups by `-`, `_` or `/`, rejoined, when that shows a credential prefix."""
    seen: set[str] = set()
    for sep in "-_/":
        if run.count(sep) < 2:
            continue
        candidates = [run.replace(sep, "")]
        for width in range(1, 9):  # a separator inside the first group (`npm_w_8TXi…`) is text: try each width
            if all(run[i] == sep for i in range(width, len(run), width + 1)):
                candidates.append("".join(run[i : i + width] for i in range(0, len(run), width + 1)))
                break
        for joined in candidates:
            if joined not in seen and len(joined) >= 16 and shows(joined):
                seen.add(joined)
                yield 0, len(run), "regrouped", joined, True


def morse(s: str) -> Iterator[Read]:
    """Runs of 8+ Morse letters, read in upper and lower case."""
    if ".-" not in s and "-." not in s and "._" not in s and "_." not in s and "·" not in s and "•" not in s:
        return
    text = s[:MAX_SPELLED].translate(_MORSE_SIGNS)
    for m in _MORSE_RUN.finditer(text):
        words = []
        for word in _MORSE_WORD_GAP.split(m.group()):
            letters = [_MORSE.get(code) for code in word.split()]
            if None in letters:
                break
            words.append("".join(letters))  # type: ignore[arg-type]
        spelled = " ".join(w for w in words if w)
        if len(spelled) >= 8:  # words apart, and run together (a token's letters sent one word each)
            for text in (spelled, spelled.replace(" ", "")):
                yield m.start(), m.end(), "morse", text, True
                yield m.start(), m.end(), "morse", text.lower(), True


def phonetic(s: str) -> Iterator[Read]:
    """Runs of 8+ spelling-alphabet words (with case and symbol words), read as the characters they name."""
    text = s[:MAX_SPELLED]
    low = text.lower()
    if not any(w in low for w in _PHONETIC_GATE):
        return
    out: list[str] = []
    marked = False
    case = ""
    start = end = -1
    for m in _WORD.finditer(text):
        word = m.group().lower()
        if word in _CASE_WORDS:
            case, marked = _CASE_WORDS[word], True
        elif word in _PHONETIC:
            char = _PHONETIC[word]
            out.append(char.lower() if case == "lower" else char)
            case = ""
            start = m.start() if start < 0 else start
            end = m.end()
        elif word not in _FILLER:
            yield from _phonetic_run(out, marked, start, end)
            out, marked, case, start = [], False, "", -1
    yield from _phonetic_run(out, marked, start, end)


def _phonetic_run(out: list[str], marked: bool, start: int, end: int) -> Iterator[Read]:
    if len(out) < 8:
        return
    spelled = "".join(out)
    yield start, end, "phonetic", spelled, True
    if not marked:
        yield start, end, "phonetic", spelled.lower(), True


def binary(s: str, as_text: Callable[[bytes], str | None]) -> Iterator[Read]:
    """Runs of 8+ octets written in bits, decoded to text."""
    text = s[:MAX_SPELLED]
    if "0000" not in text and "0110" not in text:  # every ASCII letter's octet holds one or the other
        return
    for m in _OCTETS.finditer(text):
        bits = re.sub(r"[^01]", "", m.group())
        decoded = as_text(int(bits, 2).to_bytes(len(bits) // 8, "big"))
        if decoded is not None:
            yield m.start(), m.end(), "binary", decoded, False


def rot47_word(word: str) -> str:
    """`word` in ROT47."""
    return word.translate(_ROT47)


def rot47(s: str, shows: Callable[[str], bool]) -> Iterator[Read]:
    """Runs of printable ASCII that in ROT47 show a credential prefix (the caller has found a
    prefix's ROT47 form in `s`)."""
    for m in _ROT47_RUN.finditer(s, 0, MAX_ROT47):
        turned = m.group().translate(_ROT47)
        if shows(turned):
            yield m.start(), m.end(), "rot47", turned, True
