"""Refusals by the HTTP auth layer on the karma ledger, without letting a flood fill it.

A request the auth layer refuses (no or an unknown credential, a bad token, a foreign `Origin`,
disagreeing credential headers) never becomes a call, so the pipeline records nothing of it. The
`RefusalRecorder` records it instead, aggregated per (source address, reason) per interval:

- the first refusal of a key in an interval is written at once, as a record of count 1, so an
  attempt is on the record within milliseconds (and survives a crash a second later);
- the rest of that key's refusals in the interval are counted in memory and written as one more
  record when the interval ends (or the gateway shuts down), carrying their count and what the first
  of *them* was; each record describes only its own requests, and the counts sum to the refusals.

So a key writes at most two records an interval. At most `max_keys` keys are held per interval;
a refusal with a new key past that is folded into one overflow key (source and reason `*`, its
per-reason counts in `reasons`), so neither memory nor records grow with the number of sources (an
IPv6 client has a great many). The writes happen in a task of their own: a refusal never waits for
the ledger, and a ledger that cannot take the record leaves the refusal as it was (the request is
refused anyway), logs `auth.refusal_not_recorded` at error level and counts the refusals it held in
`dharma_auth_refusals_unrecorded_total`. Each replica aggregates and records its own refusals.

The record (`kind: "refusal"`, `audit.records.KIND_REFUSAL`) never holds a credential, nor a hash
of one: `credential` names its kind, and for a JWT `token` holds its `iss` and `sub` (truncated),
with `verified` saying whether the signature was checked. No I/O here but the `Ledger` interface.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from audit.records import KIND_REFUSAL
from gateway.core.call import BlockClass, Effect, Status
from gateway.metrics import Metrics
from gateway.stages.record import Ledger, rfc3339

log = structlog.get_logger()

REASONS = (
    "no_credential",          # 401: neither Authorization: Bearer nor X-API-Key
    "unknown_key",            # 401: an API key no principal holds
    "invalid_token",          # 401: a JWT that does not verify (signature, iss, aud, exp, ...) or names no principal claim
    "unknown_principal",      # 403: a valid JWT whose subject is no principal of the policy
    "insufficient_scope",     # 403: a valid JWT without a required scope
    "foreign_origin",         # 403: an Origin the gateway does not trust
    "credential_conflict",    # 400: Authorization and X-API-Key disagree
    "credential_repeated",    # 400: a credential header sent twice
    "jwks_unavailable",       # 503: the issuer's keys could not be fetched, the token was not checked
)
"""Why the auth layer refused a request: the `reason` of a refusal record and the label of
`dharma_auth_refusals_total`."""
OVERFLOW = ("*", "*")
"""The key refusals are folded into once an interval holds `max_keys` keys."""
STAGE = "http_auth"
MAX_TEXT = 200
"""Longest text a record keeps of what a client sent (a path, a tool or method name, a token's claim)."""


@dataclass(frozen=True, slots=True)
class RefusalLimits:
    """How refusals are aggregated: one record per key per `interval_seconds` (plus the first at
    once), at most `max_keys` keys per interval."""

    interval_seconds: float = 60.0
    max_keys: int = 256


@dataclass(slots=True)
class Seen:
    """What a record says of the first request it counts (never the credential)."""

    request: str
    """HTTP method and path, e.g. "POST /mcp"."""
    http_status: int
    error_code: str
    credential: str
    """none, api_key, jwt, other (an Authorization scheme other than Bearer) or several."""
    token: dict[str, Any] | None = None
    method: str | None = None
    """The JSON-RPC method, or "http/tools.call" for the tool API."""
    tool: str | None = None
    body_sha256: str | None = None
    body_bytes: int | None = None


@dataclass(slots=True, eq=False)
class Span:
    """The refusals of one key one record counts: the first of an interval (`prompt`), or the rest."""

    key: tuple[str, str]
    start: float
    prompt: bool
    last: float = 0.0
    count: int = 1
    seen: Seen | None = None
    reasons: dict[str, int] | None = None
    """Per-reason counts, on the overflow key only."""
    described: bool = False
    closed: bool = False
    queued: bool = False


_ABSENT: Any = object()


@dataclass(slots=True)
class RefusalTable:
    """The keys of one interval: present once their first refusal was taken, with the span counting
    the rest (None until there is one). Pure: the recorder decides when to write and roll."""

    max_keys: int
    slots: dict[tuple[str, str], Span | None] = field(default_factory=dict)

    def note(self, source: str, reason: str, now: float) -> tuple[Span | None, bool]:
        """Count one refusal: (a span that starts with it and wants describing, or None; folded?)."""
        key = (source, reason)
        rest = self.slots.get(key, _ABSENT)
        folded = False
        if rest is _ABSENT and len(self.slots) >= self.max_keys:
            key, folded = OVERFLOW, True
            rest = self.slots.get(key, _ABSENT)
        if rest is None or rest is _ABSENT:
            span = Span(key, now, prompt=rest is _ABSENT, last=now, reasons={reason: 1} if folded else None)
            self.slots[key] = None if rest is _ABSENT else span
            return span, folded
        rest.count += 1
        rest.last = now
        if rest.reasons is not None:
            rest.reasons[reason] = rest.reasons.get(reason, 0) + 1
        return None, folded

    def roll(self) -> list[Span]:
        """End the interval: the spans of the rest, to be written; every key starts over."""
        spans = [span for span in self.slots.values() if span is not None]
        self.slots.clear()
        return spans


def refusal_entry(span: Span, *, interval_seconds: float, policy_version: str) -> dict[str, Any]:
    """The ledger record of a span (contract: keep every field and its meaning; see
    `audit.records.KIND_REFUSAL` and docs/ledger-and-receipts.md)."""
    seen = span.seen or Seen(request="", http_status=0, error_code="", credential="")
    source, reason = span.key
    entry: dict[str, Any] = {
        "kind": KIND_REFUSAL,
        "time": rfc3339(span.start),
        "until": rfc3339(span.last),
        "count": span.count,
        "interval_seconds": interval_seconds,
        "source": source,
        "reason": reason,
        "request": seen.request or None,
        "method": seen.method,
        "tool": seen.tool,
        "body_sha256": seen.body_sha256,
        "body_bytes": seen.body_bytes,
        "credential": seen.credential or None,
        "token": seen.token,
        "http_status": seen.http_status or None,
        "error_code": seen.error_code or None,
        # the fields every refused call's record has, so queries by decision, status or error code find these too
        "principal": None,
        "request_id": None,
        "decision": Effect.DENY.value,
        "enforced": True,
        "status": Status.BLOCKED.value,
        "block_class": BlockClass.SAFETY_TIER_GATE.value,
        "stage": STAGE,
        "matched_rules": [],
        "policy_version": policy_version,
    }
    if span.reasons is not None:
        entry["reasons"] = dict(sorted(span.reasons.items()))
    return entry


class RefusalRecorder:
    """Aggregates the auth layer's refusals and writes them to the ledger (see the module docstring).

    `note` is all a refusal costs: a clock read, a dict lookup, counters. The caller describes a
    span `note` returns (`span.seen`) and hands it back with `ready`; the recorder writes it then
    (a first span) or when its interval ends (the rest)."""

    def __init__(self, ledger: Ledger, metrics: Metrics, limits: RefusalLimits | None = None, *,
                 policy_version: Callable[[], str], clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.limits = limits or RefusalLimits()
        self.table = RefusalTable(self.limits.max_keys)
        self.policy_version = policy_version
        self.clock = clock
        self._queue: deque[Span] = deque()
        self._max_queue = 4 * (self.limits.max_keys + 1)  # two intervals' worth of records
        self._timer: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    def count(self, reason: str) -> None:
        """A refusal another part records (a deferred path's endpoint): counted in /metrics only."""
        self.metrics.auth_refusal(reason)

    def note(self, source: str, reason: str) -> Span | None:
        """Count one refusal; a span it starts comes back to be described, then handed to `ready`."""
        self.metrics.auth_refusal(reason)
        if self._closed:
            self.metrics.auth_refusals_unrecorded += 1
            return None
        span, folded = self.table.note(source, reason, self.clock())
        if folded:
            self.metrics.auth_refusals_folded += 1
        if self._timer is None:  # the interval starts with its first refusal
            self._timer = asyncio.get_running_loop().call_later(self.limits.interval_seconds, self._roll)
        return span

    def ready(self, span: Span) -> None:
        """`span` is described: a first one is written now, the rest once its interval has ended."""
        span.described = True
        if span.prompt or span.closed:
            self._enqueue(span)

    def _roll(self, *, closing: bool = False) -> None:
        self._timer = None
        for span in self.table.roll():
            span.closed = True
            if span.described or closing:  # else `ready` enqueues it (its body is still being read)
                self._enqueue(span)

    def _enqueue(self, span: Span) -> None:
        if span.queued:  # a span closed at shutdown before its body was read: written once, as it was
            return
        span.queued = True
        if len(self._queue) >= self._max_queue:
            self._unrecorded(span, f"{len(self._queue)} refusal records are waiting: the ledger is not keeping up")
            return
        self._queue.append(span)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._queue:
            span = self._queue.popleft()
            entry = refusal_entry(span, interval_seconds=self.limits.interval_seconds, policy_version=self.policy_version())
            try:
                await self.ledger.append(entry)
            except Exception as exc:  # the ledger's fault, whatever it is: the refusal stands, the loss is told
                self._unrecorded(span, str(exc))

    def settled(self) -> bool:
        """Whether every record handed to the writer has been written or given up on (tests and
        shutdown read it; a refusal still being described is not counted)."""
        return not self._queue and (self._writer is None or self._writer.done())

    def _unrecorded(self, span: Span, why: str) -> None:
        self.metrics.auth_refusals_unrecorded += span.count
        log.error("auth.refusal_not_recorded", source=span.key[0], reason=span.key[1], count=span.count, error=why)

    async def aclose(self) -> None:
        """Write every count still held (the gateway is closing, the ledger still open); later refusals
        are counted in /metrics as unrecorded."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._roll(closing=True)
        while self._writer is not None and not self._writer.done():
            await self._writer
