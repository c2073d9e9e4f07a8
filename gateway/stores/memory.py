"""In-memory stores: the embedded default for one process."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from gateway.stores.base import LEDGER_EVENTS, Approval, ApprovalEvent, OidcFlowRecord, UiSessionRecord


@contextlib.asynccontextmanager
async def one_process_recording() -> AsyncIterator[None]:
    """`ApprovalStore.recording` of a store only one process writes the ledger from: nothing to claim."""
    yield


class MemoryLimiterStore:
    """GCRA over a dict of theoretical arrival times: O(1) per call, no background sweeps."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self._tat: OrderedDict[str, float] = OrderedDict()
        self._max_keys = max_keys

    async def acquire(self, key: str, *, interval: float, burst: int, cost: int, now: float) -> float:
        return gcra(self._tat, key, interval=interval, burst=burst, cost=cost, now=now, max_keys=self._max_keys)


def gcra(
    tats: OrderedDict[str, float], key: str, *, interval: float, burst: int, cost: int, now: float, max_keys: int
) -> float:
    """Generic cell rate algorithm: allow if the new arrival time stays within the burst tolerance."""
    tat = max(tats.get(key, now), now)
    new_tat = tat + interval * cost
    allow_at = new_tat - interval * burst
    if allow_at > now:
        return allow_at - now
    tats[key] = new_tat
    tats.move_to_end(key)
    while len(tats) > max_keys:
        tats.popitem(last=False)
    return 0.0


@dataclass(slots=True)
class BreakerState:
    state: str = "closed"  # closed | open | half_open
    failures: int = 0
    opened_at: float = 0.0
    probing: bool = False


def probe_wait(reset_seconds: float) -> float:
    """How long a call waits while another call is the half-open probe."""
    return max(reset_seconds / 10, 0.1)


def check(s: BreakerState, *, now: float, reset_seconds: float) -> float:
    """0.0 if a call could go to the backend now, else seconds to wait. Changes nothing."""
    if s.state == "open":
        waited = now - s.opened_at
        return reset_seconds - waited if waited < reset_seconds else 0.0
    if s.state == "half_open" and s.probing:
        return probe_wait(reset_seconds)
    return 0.0


def admit(s: BreakerState, *, now: float, reset_seconds: float) -> float:
    """Like `check`, but claims the call's place: after the reset time the breaker half-opens and
    this call becomes its one probe. Every admitted call must end in `record` or `release`."""
    if s.state == "open":
        waited = now - s.opened_at
        if waited < reset_seconds:
            return reset_seconds - waited
        s.state, s.probing = "half_open", False
    if s.state == "half_open":
        if s.probing:
            return probe_wait(reset_seconds)
        s.probing = True
    return 0.0


def record(s: BreakerState, *, ok: bool, now: float, threshold: int) -> None:
    """The backend answered an admitted call: success closes the breaker, failures open it."""
    if ok:
        s.state, s.failures, s.probing = "closed", 0, False
        return
    s.failures += 1
    if s.state == "half_open" or s.failures >= threshold:
        s.state, s.opened_at, s.probing = "open", now, False


def release(s: BreakerState) -> None:
    """An admitted call ended without a backend answer (cancelled): free the probe for the next call."""
    s.probing = False


class MemoryBreakerStore:
    """The breaker states of one process: the state machine above over a dict."""

    def __init__(self) -> None:
        self._states: dict[str, BreakerState] = {}

    def state(self, backend: str) -> BreakerState:
        s = self._states.get(backend)
        if s is None:
            s = self._states[backend] = BreakerState()
        return s

    async def check(self, backend: str, *, now: float, reset_seconds: float) -> float:
        return check(self.state(backend), now=now, reset_seconds=reset_seconds)

    async def admit(self, backend: str, *, now: float, reset_seconds: float) -> float:
        return admit(self.state(backend), now=now, reset_seconds=reset_seconds)

    async def record(self, backend: str, *, ok: bool, now: float, threshold: int) -> None:
        record(self.state(backend), ok=ok, now=now, threshold=threshold)

    async def release(self, backend: str) -> None:
        release(self.state(backend))


class MemoryApprovalStore:
    """Approvals as an append-only list of events; an approval's state is its latest event."""

    def __init__(self) -> None:
        self._holds: dict[str, Approval] = {}
        self._events: list[ApprovalEvent] = []
        self._recorded: dict[int, tuple[int, str]] = {}

    def _add(self, approval: Approval, event: str, by: str, via: str, reason: str, at: float) -> Approval:
        state = "pending" if event == "held" else event
        decided_by = by if event in ("approved", "denied") else approval.decided_by
        current = dataclasses.replace(approval, state=state, decided_by=decided_by)
        self._holds[approval.id] = current
        self._events.append(ApprovalEvent(len(self._events) + 1, current, event, by, via, reason, at))
        return current

    async def create(self, approval: Approval) -> None:
        self._add(approval, "held", approval.principal, "gateway", approval.reason, approval.created_at)

    async def get(self, approval_id: str) -> Approval | None:
        return self._holds.get(approval_id)

    async def decide(
        self, approval_id: str, *, approve: bool, by: str, now: float, via: str = "api", reason: str = ""
    ) -> Approval:
        item = self._holds.get(approval_id)
        if item is None:
            raise KeyError(approval_id)
        if item.state == "pending" and item.expires_at <= now:
            item = self._add(item, "expired", "", "timeout", "expired before anyone decided", now)
        if item.state != "pending":
            raise ValueError(f"approval {approval_id} is {item.state}, not pending")
        return self._add(item, "approved" if approve else "denied", by, via, reason, now)

    async def consume(self, approval_id: str, *, now: float) -> bool:
        item = self._holds.get(approval_id)
        if item is None or item.state != "approved" or item.expires_at <= now:
            return False
        self._add(item, "used", "", "gateway", "", now)
        return True

    async def expire(self, approval_id: str, *, now: float | None = None) -> None:
        item = self._holds.get(approval_id)
        if item is not None and item.state == "pending":
            self._add(item, "expired", "", "timeout", "no decision in time", time.time() if now is None else now)

    async def pending(self, now: float) -> list[Approval]:
        return [a for a in self._holds.values() if a.state == "pending" and a.expires_at > now]

    async def unrecorded(self) -> list[ApprovalEvent]:
        last = max(self._recorded, default=0)
        return [e for e in self._events[last:] if e.event in LEDGER_EVENTS]

    async def mark_recorded(self, no: int, seq: int, record_hash: str) -> None:
        if no in self._recorded:
            raise ValueError(f"approval event {no} is already recorded")
        self._recorded[no] = (seq, record_hash)

    def recording(self) -> contextlib.AbstractAsyncContextManager[None]:
        return one_process_recording()

    def linked_mark(self, no: int) -> None:
        return None


class _Watch:
    """A latch: `set` wakes the current `wait`, or the next one if nobody waits yet."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            await self._event.wait()
        fired = self._event.is_set()
        if fired:
            self._event = anyio.Event()
        return fired


class MemoryApprovalSignals:
    """Wake-ups within one process (anyio events): a decision made here releases a call held here
    at once. A decision made in another process (the CLI without Redis) is seen by the holder's
    safety poll."""

    def __init__(self) -> None:
        self._watches: dict[str, set[_Watch]] = {}

    async def notify(self, approval_id: str) -> None:
        self.wake(approval_id)

    def wake(self, approval_id: str) -> None:
        """Wake the holders of `approval_id` in this process."""
        for watch in self._watches.get(approval_id, ()):
            watch.set()

    def wake_all(self) -> None:
        """Wake every holder (after wake-ups may have been lost): each reads its approval again."""
        for watches in self._watches.values():
            for watch in watches:
                watch.set()

    @contextlib.asynccontextmanager
    async def watch(self, approval_id: str) -> AsyncIterator[_Watch]:
        watch = _Watch()
        self._watches.setdefault(approval_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(approval_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[approval_id]

    async def aclose(self) -> None:
        self.wake_all()


class MemoryIdempotencyStore:
    def __init__(self, max_items: int = 10_000) -> None:
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._max = max_items

    async def get(self, key: str) -> Any | None:
        return self._items.get(key)

    async def put(self, key: str, value: Any) -> None:
        self._items[key] = value
        while len(self._items) > self._max:
            self._items.popitem(last=False)


def make_room(items: OrderedDict[str, Any], key: str, limit: int, now: float) -> None:
    """Before adding `key`: past `limit`, forget the expired entries, then the oldest."""
    if key in items or len(items) < limit:
        return
    for stale in [k for k, r in items.items() if r.expires_at <= now]:
        del items[stale]
    while len(items) >= limit:
        items.popitem(last=False)


class MemoryUiSessionStore:
    """`/ui` sessions and SSO logins under way of this one process; expired ones are forgotten when
    met, the oldest dropped past `limit`."""

    def __init__(self, limit: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self._by_id: OrderedDict[str, UiSessionRecord] = OrderedDict()
        self._flows: OrderedDict[str, OidcFlowRecord] = OrderedDict()
        self._limit, self._clock = limit, clock

    async def put(self, session_id: str, record: UiSessionRecord) -> None:
        make_room(self._by_id, session_id, self._limit, self._clock())
        self._by_id[session_id] = record.model_copy(deep=True)

    async def get(self, session_id: str, now: float) -> UiSessionRecord | None:
        record = self._by_id.get(session_id)
        if record is not None and record.expires_at <= now:
            del self._by_id[session_id]
            return None
        return record.model_copy(deep=True) if record is not None else None

    async def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    async def put_flow(self, flow_id: str, record: OidcFlowRecord) -> None:
        make_room(self._flows, flow_id, self._limit, self._clock())
        self._flows[flow_id] = record

    async def take_flow(self, flow_id: str, now: float) -> OidcFlowRecord | None:
        record = self._flows.pop(flow_id, None)
        return record if record is not None and record.expires_at > now else None


class SessionHistory:
    """Recent calls per session and recent call/denial counts per principal, for rules.

    Bounded: the last `depth` calls per session, none older than `max_age` seconds, and counts
    over a sliding window per principal, kept as running totals so reading them costs
    O(expired events).
    """

    def __init__(self, depth: int = 50, window: float = 3600.0, max_sessions: int = 10_000,
                 max_age: float = 86_400.0) -> None:
        self._sessions: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._karma: OrderedDict[str, _Karma] = OrderedDict()
        self._depth, self._window, self._max, self._max_age = depth, window, max_sessions, max_age

    async def read(self, session_id: str | None, principal: str, now: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
        return self.session(session_id, now), self.karma(principal, now)

    def session(self, session_id: str | None, now: float) -> list[dict[str, Any]]:
        if not session_id:
            return []
        calls = self._sessions.get(session_id)
        if not calls:
            return []
        since = now - self._max_age
        while calls and calls[0].get("at", since) < since:
            calls.popleft()
        return list(calls)

    def karma(self, principal: str, now: float) -> dict[str, int]:
        k = self._karma.get(principal)
        if k is None:
            return {"calls": 0, "denials": 0}
        k.expire(now - self._window)
        return {"calls": len(k.events), "denials": k.denials}

    async def record(self, *, session_id: str | None, principal: str, tool: str, decision: str, denied: bool,
                     now: float, time: str, detail: Mapping[str, Any] | None = None) -> None:
        if session_id:
            calls = self._sessions.setdefault(session_id, deque(maxlen=self._depth))
            calls.append({"tool": tool, "decision": decision, "time": time, **(detail or {})})
            self._sessions.move_to_end(session_id)
            while len(self._sessions) > self._max:
                self._sessions.popitem(last=False)
        k = self._karma.get(principal)
        if k is None:
            k = self._karma[principal] = _Karma()
        k.add(now, denied)
        self._karma.move_to_end(principal)
        while len(self._karma) > self._max:
            self._karma.popitem(last=False)


class _Karma:
    """A principal's recent events with a running denial count."""

    __slots__ = ("events", "denials")
    LIMIT = 10_000

    def __init__(self) -> None:
        self.events: deque[tuple[float, bool]] = deque()
        self.denials = 0

    def add(self, now: float, denied: bool) -> None:
        self.events.append((now, denied))
        self.denials += denied
        if len(self.events) > self.LIMIT:
            self.denials -= self.events.popleft()[1]

    def expire(self, before: float) -> None:
        while self.events and self.events[0][0] < before:
            self.denials -= self.events.popleft()[1]
