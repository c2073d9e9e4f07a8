"""Newline-delimited JSON-RPC framing for stdio (both `dharma stdio` and stdio upstreams of `/mcp`):
lines of any length up to a limit, read in chunks, never with a bounded `readline`. No I/O.
"""

from __future__ import annotations

import dataclasses

#: The largest message a client may send (`dharma stdio --max-message-bytes` overrides it).
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: The largest message accepted from a server (base64 resources make multi-MB lines).
SERVER_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
#: Bytes read from a pipe at a time.
CHUNK = 1 << 16


def blank(line: bytes) -> bool:
    """Whether `line` holds nothing but ASCII whitespace (what `line.strip()` would empty),
    without copying it: a server's line may be hundreds of megabytes."""
    return not line or line.isspace()


@dataclasses.dataclass(frozen=True, slots=True)
class Oversize:
    """A line over the limit: its first bytes (to find its id) and its full size."""

    prefix: bytes
    size: int


class LineSplitter:
    """Split a byte stream on b"\\n" with no line-length limit up to `limit`; longer lines become
    `Oversize` (their bytes are dropped as they arrive, only a prefix is kept for the id)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._over: bytes | None = None

    def feed(self, chunk: bytes) -> list[bytes | Oversize]:
        out: list[bytes | Oversize] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                self._add(chunk[start:])
                return out
            self._add(chunk[start:nl])
            out.append(self._take())
            start = nl + 1

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._over is not None:
            return
        if self._size > self.limit:
            self._over = (b"".join(self._parts) + piece[:4096])[:4096]
            self._parts = []
        else:
            self._parts.append(piece)

    def _take(self) -> bytes | Oversize:
        line: bytes | Oversize = Oversize(self._over, self._size) if self._over is not None else b"".join(self._parts)
        self._parts, self._size, self._over = [], 0, None
        return line
