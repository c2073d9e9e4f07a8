"""Encoded text inside a string: base64 (standard and URL-safe, padded or not), hex and URL-encoding,
and, for the secret scanner, the other ways a secret is disguised.

`decoded_layers(s)` yields every run of `s` that decodes to text, and, inside that text, every
run that decodes again, down to `MAX_DEPTH` layers. A run with `/` in it (standard base64's
alphabet, and a path separator) is also tried segment by segment, so a key encoded as one
segment of a URL path is found. Each layer carries the span of the outermost
encoded run in `s` (what a redaction must replace) and the chain of decodings that produced it
("base64>url"). The secret scanner looks for secrets in each layer's text.

`decoded_layers(s, prefixes=...)` (the secret scanner's call) also undoes: base32 (RFC 4648, upper
or lower case), gzip/zlib/bzip2/xz compression inside base64 or hex, base64 wrapped over lines of
equal length, base64 written backwards, backslash escapes (`\\uXXXX`, `\\u{...}`, `\\xNN`, octal
`\\NNN`), HTML character references (`&#115;`, `&#x73;`, named ones), quoted-printable (`=XX`, soft
line breaks), lists of character codes (`115, 107, ...`, `chr(115)+chr(107)`), and three
reassemblies whose text is only searched for the `prefixes` of credential formats: a run in rot13,
a run written backwards, and the string with separators removed (a token cut by spaces, pipes,
dots, quotes and `+`: concatenation in code). Escapes, character references, quoted-printable and
the reassemblies map each character back to the string, so a finding's span is exact.

Work is bounded so that the scanner can run on every call: only runs long enough to hide a secret
are candidates (a regex finds them), a run is first probed (its first bytes must decode to UTF-8
text, which rejects images, hashes, compressed data and ordinary words at once), at most
`MAX_LAYER_CHARS` of a run are decoded (or decompressed), and at most `MAX_LAYERS` layers and
`MAX_TOTAL_CHARS` decoded characters come out of one string. No I/O.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import html.entities
import io
import lzma
import re
import zipfile
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

from gateway.stages.sanitizer import spelled

__all__ = ["MAX_DEPTH", "Layer", "Prefixes", "charcode_layers", "charcode_text", "decode_base64", "decoded_layers", "whole_text"]

MAX_DEPTH: Final = 3  # layers of encoding inside one another
MAX_LAYERS: Final = 32  # decoded layers per top-level string
MAX_LAYER_CHARS: Final = 65_536  # encoded characters decoded from one run (the rest is not looked at)
MAX_TOTAL_CHARS: Final = 262_144  # decoded characters per top-level string
MIN_BASE64: Final = 16  # 12 bytes: shorter runs cannot hold a key worth finding
MIN_HEX: Final = 24
MIN_TEXT: Final = 8  # decoded text shorter than this (character codes) holds no key
PROBE: Final = 64  # encoded characters decoded first, to reject binary early
MAX_SEGMENTS: Final = 16  # `/`-separated segments of one run tried on their own
WINDOW: Final = 256  # characters around an escape scanned again once it is undone (a key holding one is found whole)
MAX_TURNED: Final = 1_024  # runs longer than this are not tried in rot13 or backwards (blobs, not tokens)

_BASE64_RUN: Final = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,6}")
_WRAPPED_TAIL: Final = re.compile(r"(?:\r?\n|(?:\\r)?\\n)([A-Za-z0-9+/_-]{1,15}={0,2})(?![A-Za-z0-9+/_=-])")
_BASE32_RUN: Final = re.compile(r"(?:[A-Z2-7]+|[a-z2-7]+)=*")
_HEX_ESCAPES: Final = re.compile(r"(?:\\x[0-9A-Fa-f]{2}){8,}")
_URL_RUN: Final = re.compile(r"[A-Za-z0-9%+._~!*'()/:@,;$-]*%[0-9A-Fa-f]{2}[A-Za-z0-9%+._~!*'()/:@,;$-]*")
_URL_ESCAPE: Final = re.compile(r"%[0-9A-Fa-f]{2}")
_HEX_ONLY: Final = re.compile(r"(?:0x)?([0-9A-Fa-f]+)\Z")
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Binary formats whose base64 starts the same way every time: images, PDF, archives.
_BINARY_PREFIXES: Final = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "JVBERi0", "UEsDB", "H4sI", "Qk0", "AAAA")
_TO_STANDARD: Final = str.maketrans("-_", "+/")
_ASCII_QUAD: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef")

#: One escape: `\u0073`, `\u{73}`, `\U00000073`, `\x73`, `\163`, also escaped again (`\\u0073`: JSON
#: inside JSON), and JavaScript's legacy `escape()` form `%u0073`.
_BACKSLASH: Final = re.compile(
    r"\\+(?:u\{([0-9A-Fa-f]{1,6})\}|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|x([0-9A-Fa-f]{2})|([0-3][0-7]{2}))|%u([0-9A-Fa-f]{4})"
)
_ENTITY: Final = re.compile(r"&(?:#([0-9]{1,7});?|#[xX]([0-9A-Fa-f]{1,6});?|([A-Za-z][A-Za-z0-9]{1,31};))")
_QUOTED_PRINTABLE: Final = re.compile(r"=(?:([0-9A-F]{2})|\r?\n)")
# What only quoted-printable has: a soft line break, an encoded `=`, three escapes in a row, or a
# UTF-8 sequence (`x=10, y=20` in code is not quoted-printable).
_QP_EVIDENCE: Final = re.compile(r"=(?:\r?\n|3D|[0-9A-F]{2}=[0-9A-F]{2}=[0-9A-F]{2}|[C-F][0-9A-F]=[89AB][0-9A-F])")
_DIGITS_AS_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_HEX_AS_ZERO: Final = bytes.maketrans(b"abcdefABCDEF", b"000000000000")  # after _DIGITS_AS_ZERO
_PRINTABLE_RUN: Final = re.compile(rb"[\t\n\r\x20-\x7e]{16,}")
_HEX_BYTES: Final = re.compile(r"(?<![0-9A-Za-z])(?:[0-9a-fA-F]{2}[ :\n-]){7,}[0-9a-fA-F]{2}(?![0-9A-Za-z])")  # `6e 70 6d 5f ...`
_CODE: Final = r"(?:0[xX][0-9A-Fa-f]{1,6}|[0-9]{1,7})"
_CODE_LIST: Final = re.compile(rf"(?<![\w.]){_CODE}(?:\s*,\s*{_CODE}){{7,}}(?![\w.])")
_CODE_WORDS: Final = re.compile(r"(?<![\w.])(?:[0-9]{2,3}\s+){7,}[0-9]{2,3}(?![\w.])")  # `110 112 109 95 ...`, one per line
_CODE_CALLS: Final = re.compile(rf"(?:(?:[Cc]hr[Ww]?|CHR|[Cc]har|CHAR)\(\s*{_CODE}\s*\)\s*[-+.&,|]*\s*){{8,}}")
_CODE_NUMBER: Final = re.compile(_CODE)
# Separators a token may be cut by (and concatenation syntax): removed to rejoin it.
_SEPARATORS: Final = re.compile(r"""[\s"'`+,|;*~.:()\[\]{}&$·•]+""")
_SEPARATOR_BYTES: Final = b" \t\r\n\x0b\x0c\"'`+,|;*~.:()[]{}&$" + "·•".encode()
_A85_FRAMED: Final = re.compile(r"<~([!-uz\s]{10,}?)~>")
_BASE85_WORD: Final = re.compile(r"(?i)(?<![a-z0-9])(?:ascii ?85|base ?85|[abz]85(?:decode|encode)?)(?![a-z0-9])")
_BASE85_RUN: Final = re.compile(r"[!-~]{20,}")  # Ascii85's `!`..`u` and RFC 1924's alphabet, no spaces
_SPACE_RUN: Final = re.compile(r"\s+")
_ROT13: Final = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", "NOPQRSTUVWXYZABCDEFGHIJKLMnopqrstuvwxyzabcdefghijklm"
)


@dataclass(frozen=True, slots=True)
class Prefixes:
    """The literal starts of credential formats, which turn on the other decodings and the
    reassemblies of `decoded_layers` (only a reassembly that shows one of them is kept)."""

    words: tuple[str, ...]
    heads: frozenset[str]  # their first characters: a run that cannot start one is not turned
    marks: Callable[[bytes], re.Match[bytes] | None]  # "_", "-" or a word without either: in any text holding a word
    search: Callable[[bytes], re.Match[bytes] | None]  # any of the words
    by_head: tuple[Callable[[bytes], re.Match[bytes] | None], ...]  # the words of one first character each

    @classmethod
    def of(cls, words: Sequence[str]) -> Prefixes:
        encoded = [w.encode() for w in words]
        marks = b"|".join([b"[_-]", *(re.escape(w) for w in encoded if b"_" not in w and b"-" not in w)])
        groups: dict[bytes, list[bytes]] = {}
        for w in encoded:
            groups.setdefault(w[:1], []).append(re.escape(w[1:]))
        by_head = tuple(re.compile(re.escape(h) + b"(?:" + b"|".join(rest) + b")").search for h, rest in groups.items())
        return cls(tuple(words), frozenset(w[0] for w in words), re.compile(marks).search,
                   re.compile(b"|".join(re.escape(w) for w in encoded)).search, by_head)

    def in_bytes(self, data: bytes) -> bool:
        """Whether any of the words is in `data`: on a short text two regexes, the first of which
        most texts fail; on a long one a regex per first character (each skips to that character)."""
        if len(data) > 256:
            return any(search(data) is not None for search in self.by_head)
        return self.marks(data) is not None and self.search(data) is not None


@dataclass(frozen=True, slots=True)
class Layer:
    """Decoded text, the outermost encoded span it came from in the scanned string, and how.

    `formats_only`: the text was reassembled (rot13, backwards, separators removed) rather than
    decoded: look in it only for credential formats. `index` (one entry per character of `text`
    plus one): where each character came from in the scanned string, when the layer maps back
    exactly. `glued`: separators were removed, so a token may touch what followed it.
    """

    start: int
    end: int
    via: str
    text: str
    formats_only: bool = False
    index: Sequence[int] | None = None
    glued: bool = False

    def span_of(self, a: int, b: int) -> tuple[int, int]:
        """Where `text[a:b]` came from in the scanned string (the whole run without an `index`)."""
        if self.index is None:
            return self.start, self.end
        if self.glued:  # one character each: the span ends with the token, not at the next one
            return self.index[a], self.index[b - 1] + 1
        i, j = self.index[a], self.index[b]
        return (i, j) if i <= j else (j + 1, i + 1)


def _as_text(data: bytes) -> str | None:
    """`data` as text if it is UTF-8 with few control characters; binary yields None."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text or (not text.isprintable() and len(_CONTROL.findall(text)) * 20 > len(text)):
        return None
    return text


def decode_base64(run: str) -> bytes | None:
    """Bytes of standard or URL-safe base64, padded or not; None if it is not base64."""
    body = run.rstrip("=").translate(_TO_STANDARD)
    if len(body) % 4 == 1:
        body = body[:-1]
    try:
        return binascii.a2b_base64(body + "=" * (-len(body) % 4), strict_mode=True)
    except binascii.Error:
        return None


def _base32(run: str) -> bytes | None:
    """Bytes of RFC 4648 base32 (either case, padded or not); None if it is not base32."""
    body = run.rstrip("=").upper()
    if len(body) % 8 in (1, 3, 6):
        body = body[:-1]
    try:
        return base64.b32decode(body + "=" * (-len(body) % 8))
    except binascii.Error:
        return None


def _inflate(data: bytes) -> tuple[str, str] | None:
    """(how, text) of gzip, zlib, bzip2, xz or zip data, decompressed (at most `MAX_LAYER_CHARS`
    bytes of output: a compression bomb stops there); text that is not UTF-8 throughout (a tar
    archive, a binary) is read as its printable runs, as `strings` does. None otherwise."""
    try:
        if data.startswith(b"PK\x03\x04"):
            how, out = "zip", _unzip(data)
        elif data.startswith(b"\x1f\x8b"):
            how, out = "gzip", zlib.decompressobj(wbits=47).decompress(data, MAX_LAYER_CHARS)
        elif len(data) > 2 and data[0] == 0x78 and (data[0] << 8 | data[1]) % 31 == 0:
            how, out = "zlib", zlib.decompressobj().decompress(data, MAX_LAYER_CHARS)
        elif data.startswith(b"BZh"):
            how, out = "bzip2", bz2.BZ2Decompressor().decompress(data, MAX_LAYER_CHARS)
        elif data.startswith(b"\xfd7zXZ\x00"):
            how, out = "xz", lzma.LZMADecompressor().decompress(data, MAX_LAYER_CHARS)
        else:
            return None
    except (zlib.error, OSError, EOFError, ValueError, lzma.LZMAError, zipfile.BadZipFile, NotImplementedError):
        return None
    text = _as_text(out) or _strings(out)
    return (how, text) if text else None


def _unzip(data: bytes) -> bytes:
    """The members of an in-memory zip archive, one after another, at most `MAX_LAYER_CHARS` bytes."""
    out = b""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist()[:MAX_SEGMENTS]:
            with archive.open(info) as member:
                out += member.read(MAX_LAYER_CHARS - len(out)) + b"\n"
            if len(out) >= MAX_LAYER_CHARS:
                break
    return out


def _strings(data: bytes) -> str:
    """The runs of 16+ printable ASCII characters (tabs and line breaks included) in binary data."""
    return "\n".join(m.group().decode("ascii") for m in _PRINTABLE_RUN.finditer(data))


def _compressed(head: bytes | None) -> bool:
    return head is not None and (head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"PK\x03\x04")) or (
        len(head) > 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0))


def _decode_run(run: str, extended: bool = False) -> tuple[str, str] | None:
    """(how, text) for one candidate run: hex if it is all hex digits, else base32 or base64; None if binary.
    `extended`: also base32, compressed data and base64 written backwards."""
    hexmatch = _HEX_ONLY.match(run)
    if hexmatch is not None and len(hexmatch.group(1)) >= MIN_HEX:
        digits = hexmatch.group(1)
        digits = digits[: len(digits) & ~1]
        head = bytes.fromhex(digits[:PROBE])
        if extended and _compressed(head):
            inflated = _inflate(bytes.fromhex(digits[: MAX_LAYER_CHARS & ~1]))
            return ("hex>" + inflated[0], inflated[1]) if inflated is not None else None
        if _as_text(head) is not None:
            text = _as_text(bytes.fromhex(digits[:MAX_LAYER_CHARS & ~1]))
            return ("hex", text) if text is not None else None
    if extended and _BASE32_RUN.fullmatch(run) is not None:
        head = _base32(run[:PROBE])
        if head is not None and _as_text(head[:-4] if len(run) > PROBE else head) is not None:
            data = _base32(run[:MAX_LAYER_CHARS])
            text = None if data is None else _as_text(data)
            if text is not None:
                return "base32", text
    decoded = _base64_text(run, extended)
    if decoded is None and extended and len(run) <= MAX_TURNED and _ascii_base64(run.rstrip("=")[::-4][:4]):
        backwards = _base64_text(run[::-1].lstrip("="), False)
        return ("reversed>" + backwards[0], backwards[1]) if backwards is not None else None
    return decoded


def whole_text(s: str) -> tuple[str, str] | None:
    """(how, text) when all of `s` is one base64, base32 or hex run that decodes to text (a piece
    of a secret split across fields and encoded piece by piece), else None."""
    return _decode_run(s, True) if _BASE64_RUN.fullmatch(s) is not None else None


def _ascii_base64(firsts: str) -> bool:
    """Whether these first characters of base64 quads can start ASCII text (a byte < 0x80: A-Z, a-f)."""
    return all(c in _ASCII_QUAD for c in firsts)


def _base64_text(run: str, extended: bool) -> tuple[str, str] | None:
    """(how, text) for a base64 run (compressed data inflated when `extended`), or None."""
    how = "base64url" if ("-" in run or "_" in run) else "base64"
    head = decode_base64(run[:PROBE])
    if extended and _compressed(head):
        data = decode_base64(run[:MAX_LAYER_CHARS])
        inflated = None if data is None else _inflate(data)
        return (f"{how}>{inflated[0]}", inflated[1]) if inflated is not None else None
    if run.startswith(_BINARY_PREFIXES):
        return None
    if head is not None and len(run) > PROBE:
        head = head[:-3]  # the cut may fall inside a character
    if head is None or _as_text(head) is None:
        return None
    data = decode_base64(run[:MAX_LAYER_CHARS])
    text = None if data is None else _as_text(data)
    return (how, text) if text is not None else None


def _candidates(s: str, prefixes: Prefixes | None, top: bool) -> Iterator[Layer]:
    """Each encoded run of `s` that decodes to text, as a layer in `s`'s coordinates."""
    if "%" in s:
        for m in _URL_RUN.finditer(s):
            run = m.group()
            if len(run) >= 6 and _URL_ESCAPE.search(run) is not None:
                text = _as_text(unquote_to_bytes(run[:MAX_LAYER_CHARS].replace("+", " ")))
                if text is not None:
                    yield Layer(m.start(), m.end(), "url", text)
    if "\\x" in s:
        for m in _HEX_ESCAPES.finditer(s):
            text = _as_text(bytes.fromhex(m.group()[: MAX_LAYER_CHARS].replace("\\x", "")))
            if text is not None:
                yield Layer(m.start(), m.end(), "hex", text)
    if prefixes is not None and len(s) >= MIN_BASE64:  # a shorter text cannot disguise a key
        yield from _reassembled(s, prefixes, top)
        if "\\" in s or "&#" in s or "=" in s or "%u" in s or "%U" in s:
            yield from _escaped(s)
        if "," in s or "(" in s or " " in s or "\n" in s or ":" in s:
            yield from charcode_layers(s)
        if "<~" in s or "85" in s or len(s) - len(s.translate(_NO_B85_SYMBOLS)) >= 4:
            yield from _base85(s)
        if top:
            yield from _spelled(s, prefixes)
    if len(s) >= MIN_BASE64:
        yield from _runs(s, prefixes)


def _runs(s: str, prefixes: Prefixes | None) -> Iterator[Layer]:
    """Base64, base32 and hex runs (and, with `prefixes`, wrapped base64 and runs in rot13 or backwards)."""
    extended = prefixes is not None
    runs = list(_BASE64_RUN.finditer(s))
    i = 0
    while i < len(runs):
        m = runs[i]
        if prefixes is not None:
            block = _wrapped(s, runs, i) if s[m.end() : m.end() + 1] in ("\n", "\r", "\\") else None
            if block is not None:
                i, layer = block
                yield layer
                continue
            run = m.group()
            if run[0].translate(_ROT13) in prefixes.heads or run.rstrip("=")[-1] in prefixes.heads:
                yield from _turned(run, m.start(), prefixes)
        run = m.group()
        decoded = _decode_run(run, extended)
        if decoded is not None:
            yield Layer(m.start(), m.end(), decoded[0], decoded[1])
        elif prefixes is not None:
            yield from _written_out(run, m.start(), prefixes)
        if "/" in run:  # `/` is base64 and a path separator: a URL or path segment may be the encoded part
            yield from _segments(run, m.start(), decoded, prefixes)
        i += 1


def _written_out(run: str, start: int, prefixes: Prefixes) -> Iterator[Layer]:
    """A run that is no base64 text read as base58, and as a token cut into groups (`spelled`)."""
    text = spelled.base58_text(run, _as_text)
    if text is not None:
        yield Layer(start, start + len(run), "base58", text)
    if "-" in run or "_" in run or "/" in run:
        for a, b, via, joined, only in spelled.regrouped(run, lambda t: prefixes.in_bytes(t.encode())):
            yield Layer(start + a, start + b, via, joined, only)


def _spelled(s: str, prefixes: Prefixes) -> Iterator[Layer]:
    """Morse, spelling-alphabet words, bits and ROT47 in the scanned string itself (`spelled`),
    each only in a string long enough to spell a credential that way."""
    reads: list[Iterator[tuple[int, int, str, str, bool]]] = []
    if len(s) >= 24:
        reads.append(spelled.morse(s))
    if len(s) >= 48 and " " in s:
        reads.append(spelled.phonetic(s))
    if len(s) >= 64:
        reads.append(spelled.binary(s, _as_text))
    if len(s) <= spelled.MAX_ROT47 and _rot47_words(prefixes).search(s) is not None:
        reads.append(spelled.rot47(s, lambda t: prefixes.in_bytes(t.encode())))
    for read in reads:
        for a, b, via, text, only in read:
            yield Layer(a, b, via, text, only)


_ROT47_OF: dict[tuple[str, ...], re.Pattern[str]] = {}


def _rot47_words(prefixes: Prefixes) -> re.Pattern[str]:
    """The credential prefixes as ROT47 writes them, one regex (built once per prefix set)."""
    found = _ROT47_OF.get(prefixes.words)
    if found is None:
        found = _ROT47_OF[prefixes.words] = re.compile("|".join(re.escape(spelled.rot47_word(w)) for w in prefixes.words))
    return found


def _wrapped(s: str, runs: list[re.Match[str]], i: int) -> tuple[int, Layer] | None:
    """Base64 wrapped over lines (runs[i] and the next runs, one line break apart, all but the last
    of one length divisible by 4): (index of the run after the block, its layer), or None. In JSON
    text a line break is the escape `\\n`, whose `n` the next run starts with."""
    lines = [runs[i].group()]
    width = len(lines[0])
    j = i
    while j + 1 < len(runs) and len(lines[-1]) == width:
        gap, following = s[runs[j].end() : runs[j + 1].start()], runs[j + 1].group()
        if gap in ("\n", "\r\n"):
            lines.append(following)
        elif gap in ("\\", "\\r\\") and following.startswith("n"):
            lines.append(following[1:])
        else:
            break
        j += 1
    if j == i or width % 4 or "=" in lines[0]:
        return None
    end = runs[j].end()
    tail = _WRAPPED_TAIL.match(s, end) if len(lines[-1]) == width else None
    if tail is not None:  # a last line shorter than a run
        lines.append(tail.group(1))
        end = tail.end()
    decoded = _base64_text("".join(lines), True)
    if decoded is None:
        return None
    return j + 1, Layer(runs[i].start(), end, decoded[0], decoded[1])


def _turned(run: str, start: int, prefixes: Prefixes) -> Iterator[Layer]:
    """A run that, in rot13 or written backwards, starts with a credential prefix."""
    if len(run) > MAX_TURNED:
        return
    rotated = run.translate(_ROT13) if run[0].translate(_ROT13) in prefixes.heads else ""
    if rotated.startswith(prefixes.words):
        yield Layer(start, start + len(run), "rot13", rotated, True, range(start, start + len(run) + 1))
    backwards = run[::-1] if run.rstrip("=")[-1:] in prefixes.heads else ""
    if backwards.lstrip("=").startswith(prefixes.words):
        end = start + len(run)
        yield Layer(start, end, "reversed", backwards, True, range(end - 1, start - 2, -1))


def _segments(run: str, offset: int, whole: tuple[str, str] | None, prefixes: Prefixes | None) -> Iterator[Layer]:
    """The `/`-separated segments of a base64-looking run that decode (or, with `prefixes`, turn)
    on their own (`host.example/c2stYW50...`: the run starts in the host name, the key is the
    last segment)."""
    pos = 0
    for segment in run.split("/")[:MAX_SEGMENTS]:
        body = segment.rstrip("=")
        if len(body) >= MIN_BASE64 and len(segment) < len(run):
            decoded = _decode_run(segment, prefixes is not None)
            if decoded is not None and decoded != whole:
                yield Layer(offset + pos, offset + pos + len(segment), decoded[0], decoded[1])
            elif decoded is None and prefixes is not None:
                yield from _written_out(segment, offset + pos, prefixes)
            if prefixes is not None:
                yield from _turned(segment, offset + pos, prefixes)
        pos += len(segment) + 1


def _reassembled(s: str, prefixes: Prefixes, top: bool) -> Iterator[Layer]:
    """The whole string in rot13 or backwards when that shows a PEM block, and (`top`: in the
    scanned string itself) the string with its separators removed when that shows a credential
    prefix (a token cut by spaces, pipes, dots, quotes and `+`), each for credential formats."""
    if "-----" in s:
        if "-----ORTVA" in s:
            yield Layer(0, len(s), "rot13", s.translate(_ROT13), True, range(len(s) + 1))
        if "NIGEB-----" in s:
            yield Layer(0, len(s), "reversed", s[::-1], True, range(len(s) - 1, -2, -1))
    limit = min(len(s), MAX_LAYER_CHARS)
    if not top:
        return
    squeezed = s[:limit].encode("utf-8", "surrogatepass").translate(None, _SEPARATOR_BYTES)  # a fast first look
    if len(squeezed) == limit or not prefixes.in_bytes(squeezed):
        return
    joined = _SEPARATORS.sub("", s[:limit])
    if len(joined) == limit:
        return
    index: list[int] = []
    pos = 0
    for m in _SEPARATORS.finditer(s, 0, limit):
        index.extend(range(pos, m.start()))
        pos = m.end()
    index.extend(range(pos, limit + 1))
    yield Layer(0, limit, "joined", joined, True, index, glued=True)


def _mapped(s: str, pattern: re.Pattern[str], via: str, decode: Callable[[re.Match[str]], str | None]) -> Layer | None:
    """The neighbourhoods (`WINDOW` characters on each side) of every match of `pattern` in `s`,
    each match replaced by `decode(match)` (left alone when that is None), as one layer whose
    `index` maps each character back to `s`; neighbourhoods that do not touch are joined by a line
    break. None when nothing was replaced. Text far from any escape is not scanned again."""
    out: list[str] = []
    index: list[int] = []
    limit = min(len(s), MAX_LAYER_CHARS)
    first = pos = end = 0
    for m in pattern.finditer(s, 0, limit):
        rep = decode(m)
        if rep is None:
            continue
        if not out or m.start() > end:  # a new neighbourhood: close the one before
            if out:
                out.append(s[pos:end] + "\n")
                index.extend(range(pos, end + 1))
            pos = max(m.start() - WINDOW, end)
            first = pos if not out else first
        out.append(s[pos : m.start()])
        index.extend(range(pos, m.start()))
        out.append(rep)
        index.extend([m.start()] * len(rep))
        pos, end = m.end(), min(limit, m.end() + WINDOW)
    if not out:
        return None
    out.append(s[pos:end])
    index.extend(range(pos, end + 1))
    return Layer(first, end, via, "".join(out), index=index)


def _code_point(value: int) -> str | None:
    return chr(value) if 0 < value <= 0x10FFFF else None


def _backslash(m: re.Match[str]) -> str | None:
    u4, u8, x, octal = m.group(2) or m.group(6), m.group(3), m.group(4), m.group(5)
    value = int(m.group(1) or u4 or u8 or x, 16) if octal is None else int(octal, 8)
    return _code_point(value)


def _entity(m: re.Match[str]) -> str | None:
    if m.group(3) is not None:
        return html.entities.html5.get(m.group(3))
    return _code_point(int(m.group(1)) if m.group(1) is not None else int(m.group(2), 16))


def _quoted(m: re.Match[str]) -> str:
    return chr(int(m.group(1), 16)) if m.group(1) is not None else ""


def _escaped(s: str) -> Iterator[Layer]:
    """Backslash escapes, HTML character references and quoted-printable, each undone in place."""
    for via, pattern, decode, present in (
        ("escape", _BACKSLASH, _backslash, "\\" in s or "%u" in s or "%U" in s),
        ("html", _ENTITY, _entity, "&#" in s),
        ("quoted-printable", _QUOTED_PRINTABLE, _quoted, "=" in s and _QP_EVIDENCE.search(s, 0, MAX_LAYER_CHARS) is not None),
    ):
        layer = _mapped(s, pattern, via, decode) if present else None
        if layer is not None:
            yield layer


def charcode_text(codes: Sequence[int]) -> str | None:
    """Text spelled by character codes (bytes of UTF-8, or code points), or None if it is not text."""
    if len(codes) < MIN_TEXT or any(not 0 < c <= 0x10FFFF for c in codes):
        return None
    if all(c < 256 for c in codes):
        return _as_text(bytes(codes))
    text = "".join(chr(c) for c in codes if not 0xD800 <= c <= 0xDFFF)
    return text if len(text) == len(codes) and _as_text(text.encode("utf-8")) is not None else None


def charcode_layers(s: str) -> Iterator[Layer]:
    """Lists of character codes (`115, 107, 95`, `String.fromCharCode(...)`, `chr(115)+chr(107)`,
    `115 107 95 ...`) and hex dumps with the bytes apart (`41 49 20 61`, `41:49:20`); the instruction
    scanner also calls it without the cues `decoded_layers` needs, for text hidden that way."""
    raw = s[:MAX_LAYER_CHARS].encode("utf-8", "surrogatepass")
    if len(raw) - len(raw.translate(None, b"0123456789abcdefABCDEF")) < 2 * MIN_TEXT:  # 8 codes: 16 digits
        return
    found: list[re.Match[str]] = []
    shape = raw.translate(_DIGITS_AS_ZERO)  # a fast first look
    if (b"0, 0" in shape or b"0,0" in shape) and s.count(",") >= 7:
        found += _CODE_LIST.finditer(s, 0, MAX_LAYER_CHARS)
    if "hr(" in s or "har(" in s or "HR(" in s or "HAR(" in s or "hrW(" in s:
        found += _CODE_CALLS.finditer(s, 0, MAX_LAYER_CHARS)
    if b"00 00" in shape or b"00\n00" in shape:
        found += _CODE_WORDS.finditer(s, 0, MAX_LAYER_CHARS)
    for m in found:
        codes = [int(n, 0) if n[:2] in ("0x", "0X") else int(n) for n in _CODE_NUMBER.findall(m.group())]
        text = charcode_text(codes)
        if text is not None:
            yield Layer(m.start(), m.end(), "charcodes", text)
    shape = shape.translate(_HEX_AS_ZERO)
    if b"00 00 00" in shape or b"00:00:00" in shape or b"00-00-00" in shape:
        for m in _HEX_BYTES.finditer(s, 0, MAX_LAYER_CHARS):  # a hex dump: bytes apart
            text = _as_text(bytes.fromhex(re.sub(r"[ :\n-]", "", m.group())))
            if text is not None and len(text) >= MIN_TEXT:
                yield Layer(m.start(), m.end(), "hex", text)


def _base85_text(run: str) -> tuple[str, str] | None:
    """(how, text) for an Ascii85 (Adobe/btoa) or base85 (RFC 1924, Python's b85, git) run, or None."""
    body = _SPACE_RUN.sub("", run)[:MAX_LAYER_CHARS]
    for how, decode85 in (("ascii85", base64.a85decode), ("base85", base64.b85decode), ("z85", _z85decode)):
        try:
            text = _as_text(decode85(body))
        except ValueError:
            continue
        if text is not None and len(text) >= MIN_TEXT:
            return how, text
    return None


def _base85(s: str) -> Iterator[Layer]:
    """Ascii85 framed by `<~ ~>` (PostScript, PDF, Python's `a85encode(adobe=True)`), and unframed
    Ascii85/base85 runs in a text that names the encoding ("ascii85", "base85", "a85", "b85").
    Each run is decoded only if its text is UTF-8 (`_as_text`), so ordinary words do not pass;
    an unnamed run is tried when it is dense in base85's symbols (`_looks_base85`)."""
    if "<~" in s:
        for m in _A85_FRAMED.finditer(s, 0, MAX_LAYER_CHARS):
            decoded = _base85_text(m.group(1))
            if decoded is not None:
                yield Layer(m.start(), m.end(), decoded[0], decoded[1])
    named = "85" in s and _BASE85_WORD.search(s) is not None
    if not named and len(s) - len(s.translate(_NO_B85_SYMBOLS)) < 4:  # no run can be dense in symbols
        return
    for m in _BASE85_RUN.finditer(s, 0, MAX_LAYER_CHARS):
        run = m.group()
        if run.startswith("<~") or run.isalnum() or not (named or _looks_base85(run)):
            continue
        decoded = _base85_text(run)
        if decoded is not None:
            yield Layer(m.start(), m.end(), decoded[0], decoded[1])


#: Symbols of the base85 alphabets that words, paths, URLs and identifiers seldom hold together.
_B85_SYMBOLS: Final = frozenset("!#$%&()*+;<=>?@^`{|}~[]\\'\"")
_NO_B85_SYMBOLS: Final = str.maketrans("", "", "".join(_B85_SYMBOLS))
_Z85: Final = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX: Final = {c: i for i, c in enumerate(_Z85)}


def _looks_base85(run: str) -> bool:
    """An unlabelled run dense in base85's symbols (round 6, es-ascii85-credential: Ascii85, base85
    and Z85 without a frame or a name): 30+ characters, 4+ different symbols, one in twelve."""
    if len(run) < 30 or (len(run) - len(run.translate(_NO_B85_SYMBOLS))) * 12 < len(run):
        return False
    return len(_B85_SYMBOLS.intersection(run)) >= 4


def _z85decode(body: str) -> bytes:
    """ZeroMQ's Z85 (RFC 32/Z85) decoded; ValueError when `body` is not Z85."""
    if len(body) % 5:
        raise ValueError("Z85 length is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(body), 5):
        n = 0
        for ch in body[i : i + 5]:
            n = n * 85 + _Z85_INDEX[ch] if ch in _Z85_INDEX else -1
            if n < 0:
                raise ValueError("not a Z85 character")
        if n > 0xFFFFFFFF:
            raise ValueError("Z85 group out of range")
        out += n.to_bytes(4, "big")
    return bytes(out).rstrip(b"\0")


def decoded_layers(s: str, prefixes: Prefixes | None = None) -> Iterator[Layer]:
    """Every decodable layer inside `s`, breadth first, spans in `s`'s coordinates (see the module doc).

    `prefixes` (credential formats' literal starts) turns on the other decodings and the reassemblies.
    """
    if len(s) < 6:
        return
    queue: deque[tuple[Layer | None, str, int]] = deque([(None, s, 0)])
    layers = total = 0
    while queue:
        parent, text, depth = queue.popleft()
        for layer in _candidates(text, prefixes, parent is None):
            if parent is not None:  # deeper layers keep their outermost run's span
                layer = Layer(parent.start, parent.end, f"{parent.via}>{layer.via}", layer.text, layer.formats_only)
            layers += 1
            total += len(layer.text)
            if layers > MAX_LAYERS or total > MAX_TOTAL_CHARS:
                return
            yield layer
            if depth + 1 < MAX_DEPTH and not layer.formats_only:
                queue.append((layer, layer.text, depth + 1))
