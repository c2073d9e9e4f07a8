"""Legacy `/mcp` sessions and their event stores in one process's memory: the embedded default.

Sessions unused for `idle_seconds` expire: a use finds them gone, and `reap` (the endpoint's
background reaper) hands them over so their upstream sessions end and their server processes stop.
Open sessions are counted per principal and in total (`SessionLimits`): `create` is O(1) below the
limits and looks for expired sessions only when one is reached. With one process there is no
other replica to signal: `publish` does nothing and `signals` ends at once.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway.stores.base import PER_PRINCIPAL, TOTAL, SessionFacts, SessionLimits, SessionSignal, StreamLog, session_limit

MAX_EVENTS = 512
MAX_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class _Stream:
    events: deque[tuple[int, str, bytes]] = field(default_factory=deque)
    done: bool = False
    changed: anyio.Event = field(default_factory=anyio.Event)

    def wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


class MemoryEventStore:
    """The events one session's streams carried (`gateway.stores.base.EventStore`), in memory."""

    def __init__(self, *, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.size = 0
        self._order: deque[tuple[str, str, int]] = deque()  # (token, event id, size), oldest first
        self._index: dict[str, tuple[StreamLog, int]] = {}
        self._streams: dict[str, _Stream] = {}

    def __len__(self) -> int:
        return len(self._order)

    def open(self, *, standalone: bool = False) -> StreamLog:
        log = StreamLog(standalone=standalone)
        self._streams[log.token] = _Stream()
        return log

    async def append(self, stream: StreamLog, data: bytes) -> str:
        state = self._streams.setdefault(stream.token, _Stream())
        stream.seq += 1
        event_id = f"{stream.token}.{stream.seq}"
        state.events.append((stream.seq, event_id, data))
        self._order.append((stream.token, event_id, len(data)))
        self._index[event_id] = (stream, stream.seq)
        self.size += len(data)
        while self._order and (len(self._order) > self.max_events or self.size > self.max_bytes):
            self._evict()
        state.wake()
        return event_id

    async def finish(self, stream: StreamLog) -> None:
        state = self._streams.get(stream.token)
        if state is not None:
            state.done = True
            state.wake()
            if not state.events:  # nothing to resume (a GET stream that carried nothing): forget it
                del self._streams[stream.token]

    async def find(self, event_id: str) -> tuple[StreamLog, int] | None:
        return self._index.get(event_id)

    async def follow(self, stream: StreamLog, after: int, *, wait: bool = True) -> AsyncIterator[tuple[str, bytes]]:
        state = self._streams.get(stream.token)
        if state is None:
            return
        while True:
            for seq, event_id, data in list(state.events):
                if seq > after:
                    after = seq
                    if data:
                        yield event_id, data
            if state.done or not wait:
                return
            await state.changed.wait()

    def _evict(self) -> None:
        token, event_id, size = self._order.popleft()
        state = self._streams.get(token)
        if state is not None:
            if state.events and state.events[0][1] == event_id:
                state.events.popleft()
            if not state.events and state.done:
                del self._streams[token]
        self._index.pop(event_id, None)
        self.size -= size


def json_copy(value: Any) -> Any:
    """A deep copy of a decoded JSON value (dicts, lists and scalars); anything else through
    `copy.deepcopy`. A tenth of `deepcopy`'s cost on the few small dicts a session holds."""
    kind = type(value)
    if kind is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if kind is list:
        return [json_copy(v) for v in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)


def detached(facts: SessionFacts) -> SessionFacts:
    """A copy of `facts` that shares no mutable value with them, as a shared store's would be.

    Runs on every request of a session (`load`): a shallow copy with fresh containers costs ~12 µs
    where `model_copy(deep=True)` (pydantic's generic `deepcopy`) cost ~40 µs.
    """
    return facts.model_copy(update={"capabilities": json_copy(facts.capabilities),
                                    "upstream_sids": dict(facts.upstream_sids),
                                    "upstream_versions": dict(facts.upstream_versions)})



class MemorySessionStore:
    """Legacy sessions of this process (`gateway.stores.base.SessionStore`), with idle expiry and limits."""

    def __init__(self, idle_seconds: float, *, limits: SessionLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_seconds = idle_seconds
        self.limits = limits if limits is not None else SessionLimits()
        self.replica = secrets.token_hex(4)
        self._clock = clock
        self._sessions: dict[str, SessionFacts] = {}
        self._events: dict[str, MemoryEventStore] = {}
        self._used: dict[str, float] = {}
        self._owned: dict[str, set[str]] = {}  # principal -> its open session ids
        # Dropped for idleness, not yet handed to `reap` (bounded: without a reaper the oldest go).
        self._expired: deque[SessionFacts] = deque(maxlen=4 * self.limits.total)

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(self, facts: SessionFacts) -> None:
        if facts.id in self._sessions:
            raise ValueError("a session with this id exists already")
        now = self._clock()
        self._admit(facts.principal, now)
        self._sessions[facts.id] = detached(facts)
        self._used[facts.id] = now
        self._owned.setdefault(facts.principal, set()).add(facts.id)

    def _admit(self, principal: str, now: float) -> None:
        """Raise `LimitReached` if `principal` (or the gateway) has as many sessions open as allowed;
        expired sessions are looked for only then (O(open) at a limit, O(1) below)."""
        owned = self._owned.get(principal, ())
        if len(owned) >= self.limits.per_principal:
            for sid in [s for s in owned if now - self._used[s] >= self.idle_seconds]:
                self._expire(sid)
            owned = self._owned.get(principal, ())
            if len(owned) >= self.limits.per_principal:
                raise session_limit(PER_PRINCIPAL, len(owned), principal, self._free_in(owned, now))
        if len(self._sessions) >= self.limits.total:
            self._expire_idle(now)
            if len(self._sessions) >= self.limits.total:
                raise session_limit(TOTAL, len(self._sessions), None, self._free_in(self._used, now))

    def _free_in(self, sids: Iterable[str], now: float) -> float:
        """Seconds until the first of `sids` expires if nobody uses it."""
        return min(self._used[s] for s in sids) + self.idle_seconds - now

    async def load(self, session_id: str) -> SessionFacts | None:
        used = self._used.get(session_id)
        if used is None:
            return None
        now = self._clock()
        if now - used >= self.idle_seconds:
            self._expire(session_id)
            return None
        self._used[session_id] = now
        return detached(self._sessions[session_id])

    async def save(self, facts: SessionFacts) -> None:
        if facts.id in self._sessions:
            self._sessions[facts.id] = detached(facts)

    async def end(self, session_id: str) -> None:
        self._drop(session_id)

    async def touch(self, session_ids: Iterable[str]) -> None:
        now = self._clock()
        for sid in session_ids:
            if sid in self._used:
                self._used[sid] = now

    async def reap(self) -> list[SessionFacts]:
        self._expire_idle(self._clock())
        expired = list(self._expired)
        self._expired.clear()
        return expired

    def events(self, session_id: str) -> MemoryEventStore:
        """The session's store (made for a session being opened; `end` forgets it if it never opens)."""
        store = self._events.get(session_id)
        if store is None:
            store = self._events[session_id] = MemoryEventStore()
        return store

    async def publish(self, signal: SessionSignal) -> None:
        return None

    async def signals(self) -> AsyncIterator[SessionSignal]:
        return
        yield  # an async generator that ends at once

    def _expire_idle(self, now: float) -> None:
        for sid in [s for s, used in self._used.items() if now - used >= self.idle_seconds]:
            self._expire(sid)

    def _expire(self, session_id: str) -> None:
        """Drop an idle session; `reap` hands it over so its upstream sessions are ended too."""
        facts = self._drop(session_id)
        if facts is not None:
            self._expired.append(facts)

    def _drop(self, session_id: str) -> SessionFacts | None:
        facts = self._sessions.pop(session_id, None)
        self._events.pop(session_id, None)
        self._used.pop(session_id, None)
        if facts is not None:
            owned = self._owned.get(facts.principal)
            if owned is not None:
                owned.discard(session_id)
                if not owned:
                    del self._owned[facts.principal]
        return facts
