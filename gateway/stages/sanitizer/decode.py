"""Encoded text inside a string: base64 (standard and URL-safe, padded or not), hex and URL-encoding.

`decoded_layers(s)` yields every run of `s` that decodes to text, and, inside that text, every
run that decodes again, down to `MAX_DEPTH` layers. A run with `/` in it (standard base64's
alphabet, and a path separator) is also tried segment by segment, so a key encoded as one
segment of a URL path is found. Each layer carries the span of the outermost
encoded run in `s` (what a redaction must replace) and the chain of decodings that produced it
("base64>url"). The secret scanner looks for secrets in each layer's text.

Work is bounded so that the scanner can run on every call: only runs long enough to hide a secret
are candidates (a regex finds them), a run is first probed (its first bytes must decode to UTF-8
text, which rejects images, hashes, compressed data and ordinary words at once), at most
`MAX_LAYER_CHARS` of a run are decoded, and at most `MAX_LAYERS` layers and `MAX_TOTAL_CHARS`
decoded characters come out of one string. No I/O.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

__all__ = ["MAX_DEPTH", "Layer", "decode_base64", "decoded_layers"]

MAX_DEPTH: Final = 3  # layers of encoding inside one another
MAX_LAYERS: Final = 32  # decoded layers per top-level string
MAX_LAYER_CHARS: Final = 65_536  # encoded characters decoded from one run (the rest is not looked at)
MAX_TOTAL_CHARS: Final = 262_144  # decoded characters per top-level string
MIN_BASE64: Final = 16  # 12 bytes: shorter runs cannot hold a key worth finding
MIN_HEX: Final = 24
PROBE: Final = 64  # encoded characters decoded first, to reject binary early
MAX_SEGMENTS: Final = 16  # `/`-separated segments of one run tried on their own

_BASE64_RUN: Final = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX_ESCAPES: Final = re.compile(r"(?:\\x[0-9A-Fa-f]{2}){8,}")
_URL_RUN: Final = re.compile(r"[A-Za-z0-9%+._~!*'()/:@,;$-]*%[0-9A-Fa-f]{2}[A-Za-z0-9%+._~!*'()/:@,;$-]*")
_URL_ESCAPE: Final = re.compile(r"%[0-9A-Fa-f]{2}")
_HEX_ONLY: Final = re.compile(r"(?:0x)?([0-9A-Fa-f]+)\Z")
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Binary formats whose base64 starts the same way every time: images, PDF, archives.
_BINARY_PREFIXES: Final = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "JVBERi0", "UEsDB", "H4sI", "Qk0", "AAAA")
_TO_STANDARD: Final = str.maketrans("-_", "+/")


@dataclass(frozen=True, slots=True)
class Layer:
    """Decoded text, the outermost encoded span it came from in the scanned string, and how."""

    start: int
    end: int
    via: str
    text: str


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


def _decode_run(run: str) -> tuple[str, str] | None:
    """(how, text) for one candidate run: hex if it is all hex digits, else base64; None if binary."""
    hexmatch = _HEX_ONLY.match(run)
    if hexmatch is not None and len(hexmatch.group(1)) >= MIN_HEX:
        digits = hexmatch.group(1)
        digits = digits[: len(digits) & ~1]
        probe = _as_text(bytes.fromhex(digits[:PROBE]))
        if probe is not None:
            text = _as_text(bytes.fromhex(digits[:MAX_LAYER_CHARS & ~1]))
            return ("hex", text) if text is not None else None
    if run.startswith(_BINARY_PREFIXES):
        return None
    head = decode_base64(run[:PROBE])
    if head is not None and len(run) > PROBE:
        head = head[:-3]  # the cut may fall inside a character
    if head is None or _as_text(head) is None:
        return None
    data = decode_base64(run[:MAX_LAYER_CHARS])
    text = None if data is None else _as_text(data)
    if text is None:
        return None
    return ("base64url" if ("-" in run or "_" in run) else "base64"), text


def _candidates(s: str) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, how, decoded text) for each encoded run of `s` that decodes to text."""
    if "%" in s:
        for m in _URL_RUN.finditer(s):
            run = m.group()
            if len(run) >= 6 and _URL_ESCAPE.search(run) is not None:
                text = _as_text(unquote_to_bytes(run[:MAX_LAYER_CHARS].replace("+", " ")))
                if text is not None:
                    yield m.start(), m.end(), "url", text
    if "\\x" in s:
        for m in _HEX_ESCAPES.finditer(s):
            text = _as_text(bytes.fromhex(m.group()[: MAX_LAYER_CHARS].replace("\\x", "")))
            if text is not None:
                yield m.start(), m.end(), "hex", text
    if len(s) >= MIN_BASE64:
        for m in _BASE64_RUN.finditer(s):
            run = m.group()
            decoded = _decode_run(run)
            if decoded is not None:
                yield m.start(), m.end(), decoded[0], decoded[1]
            if "/" in run:  # `/` is base64 and a path separator: a URL or path segment may be the encoded part
                yield from _segments(run, m.start(), decoded)


def _segments(run: str, offset: int, whole: tuple[str, str] | None) -> Iterator[tuple[int, int, str, str]]:
    """The `/`-separated segments of a base64-looking run that decode on their own
    (`host.example/c2stYW50...`: the run starts in the host name, the key is the last segment)."""
    pos = 0
    for segment in run.split("/")[:MAX_SEGMENTS]:
        body = segment.rstrip("=")
        if len(body) >= MIN_BASE64 and len(segment) < len(run):
            decoded = _decode_run(segment)
            if decoded is not None and decoded != whole:
                yield offset + pos, offset + pos + len(segment), decoded[0], decoded[1]
        pos += len(segment) + 1


def decoded_layers(s: str) -> Iterator[Layer]:
    """Every decodable layer inside `s`, breadth first, spans in `s`'s coordinates (see the module doc)."""
    if len(s) < 6:
        return
    queue: list[tuple[int, int, str, str, int]] = [(0, len(s), "", s, 0)]
    layers = total = 0
    while queue:
        start, end, via, text, depth = queue.pop(0)
        for a, b, how, decoded in _candidates(text):
            span = (a, b) if depth == 0 else (start, end)  # deeper layers keep their outermost run's span
            chain = f"{via}>{how}" if via else how
            layers += 1
            total += len(decoded)
            if layers > MAX_LAYERS or total > MAX_TOTAL_CHARS:
                return
            yield Layer(span[0], span[1], chain, decoded)
            if depth + 1 < MAX_DEPTH:
                queue.append((span[0], span[1], chain, decoded, depth + 1))
