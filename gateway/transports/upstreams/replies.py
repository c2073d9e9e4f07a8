"""What an MCP upstream answers, whatever carries it (HTTP or a stdio child): `UpstreamReply`, and
`UpstreamError` when it cannot. Kept apart from the HTTP client so the stdio side does not load it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


class UpstreamError(Exception):
    """The upstream could not be reached (`unavailable`) or did not answer in time (`timeout`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(slots=True)
class UpstreamReply:
    """An upstream HTTP answer: status, headers, and either a body or a stream of SSE messages."""

    status: int
    headers: dict[str, str]
    sse: bool
    body: bytes = b""
    _events: AsyncIterator[bytes] | None = None
    session_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Called when the upstream closed its event stream before the answer, before this client
    #: resumes it (so the gateway can close its own client's stream the same way).
    on_pause: Callable[[], Awaitable[None]] | None = None
    #: The awaited answer came on this reply's event stream (what is left of it is only its end).
    answered: bool = False

    async def messages(self) -> AsyncIterator[bytes]:
        """The data of each SSE message (priming events and comments skipped), or the JSON body once."""
        if not self.sse:
            if self.body.strip():
                yield self.body
            return
        assert self._events is not None
        async for data in self._events:
            yield data
