"""The gateway's own SSE event store for one legacy `/mcp` session: resumable streams without the
replay hole.

A 2025-11-25 client may resume an event stream (GET + `Last-Event-ID`). Forwarding that to an
upstream would let it replay events the gateway never governed (an unredacted `tools/call`
result, notes §2.4). So the gateway numbers the events itself and replays from this store, which
holds only what the gateway has already sent on the session's streams, after governance.

- Event ids are opaque and unguessable: `<stream token>.<sequence>`, where the stream token is 16
  random bytes (URL-safe). They are looked up only in the session's own store, so an id from
  another session, an upstream's id or a guess finds nothing and replays nothing.
- The store is bounded per session by event count and by bytes; the oldest events go first.
  An evicted id is unknown, so its stream is no longer resumable from it.

No I/O; the only waiting is for a stream that is still being written (`follow`).
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

MAX_EVENTS = 512
MAX_BYTES = 8 * 1024 * 1024


@dataclass(slots=True, eq=False)
class StreamLog:
    """One event stream the gateway opened on a session: its events, in order, as sent."""

    standalone: bool = False
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    events: deque[tuple[int, str, bytes]] = field(default_factory=deque)
    seq: int = 0
    done: bool = False
    changed: anyio.Event = field(default_factory=anyio.Event)

    def _wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class EventStore:
    """The events one session's streams carried (see the module docstring)."""

    def __init__(self, *, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.size = 0
        self._order: deque[tuple[StreamLog, str, int]] = deque()
        self._index: dict[str, tuple[StreamLog, int]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def open(self, *, standalone: bool = False) -> StreamLog:
        """Start a stream (its events get ids from now on); `standalone` for the GET stream."""
        return StreamLog(standalone=standalone)

    def append(self, stream: StreamLog, data: bytes) -> str:
        """Keep `data` (already governed and about to be sent) as the stream's next event; its id.

        An empty `data` is a priming event: it only carries an id and is never replayed.
        """
        stream.seq += 1
        event_id = f"{stream.token}.{stream.seq}"
        stream.events.append((stream.seq, event_id, data))
        self._order.append((stream, event_id, len(data)))
        self._index[event_id] = (stream, stream.seq)
        self.size += len(data)
        while self._order and (len(self._order) > self.max_events or self.size > self.max_bytes):
            self._evict()
        stream._wake()
        return event_id

    def finish(self, stream: StreamLog) -> None:
        """The stream has ended (its answer was sent): a resume replays and then ends too."""
        stream.done = True
        stream._wake()

    def find(self, event_id: str) -> tuple[StreamLog, int] | None:
        """The stream and position of an id this session issued and still keeps, else None."""
        return self._index.get(event_id)

    async def follow(self, stream: StreamLog, after: int, *, wait: bool = True) -> AsyncIterator[tuple[str, bytes]]:
        """Every event of `stream` after position `after`, then (with `wait`) each new one until it is done."""
        while True:
            for seq, event_id, data in list(stream.events):
                if seq > after:
                    after = seq
                    if data:
                        yield event_id, data
            if stream.done or not wait:
                return
            await stream.changed.wait()

    def _evict(self) -> None:
        stream, event_id, size = self._order.popleft()
        if stream.events and stream.events[0][1] == event_id:
            stream.events.popleft()
        self._index.pop(event_id, None)
        self.size -= size
