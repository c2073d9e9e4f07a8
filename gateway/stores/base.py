"""The storage Protocols the stages depend on. Implementations are named after their technology."""

from __future__ import annotations

import builtins
import math
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from gateway.core.errors import LimitReached


class StoreUnavailable(Exception):
    """A store could not be reached; the stage decides whether that fails open or closed."""


class LimiterStore(Protocol):
    async def acquire(self, key: str, *, interval: float, burst: int, cost: int, now: float) -> float:
        """Take `cost` tokens under GCRA; return 0.0 if allowed, else seconds until it would be.

        `now` is the caller's clock; a shared store may use its own (one clock for all replicas)."""
        ...


class BreakerStore(Protocol):
    """Circuit state per backend: the stage *checks*, the forward step *admits* then *records* or
    *releases* (gateway.stages.circuit_breaker). Waits are seconds; 0.0 means go."""

    async def check(self, backend: str, *, now: float, reset_seconds: float) -> float:
        """0.0 if a call could go to the backend now, else seconds to wait. Changes nothing."""
        ...
    async def admit(self, backend: str, *, now: float, reset_seconds: float) -> float:
        """Like `check`, but claims the call's place (the one half-open probe)."""
        ...
    async def record(self, backend: str, *, ok: bool, now: float, threshold: int) -> None:
        """The backend answered an admitted call: success closes, failures open."""
        ...
    async def release(self, backend: str) -> None:
        """An admitted call ended without an answer: free the probe."""
        ...


class HistoryStore(Protocol):
    """Recent calls per session and recent call/denial counts per principal, read by rules as
    `session` and `principal.karma`."""

    async def read(self, session_id: str | None, principal: str, now: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The session's recent calls (oldest first) and the principal's {calls, denials} in the window."""
        ...
    async def record(self, *, session_id: str | None, principal: str, tool: str, decision: str, denied: bool,
                     now: float, time: str, detail: Mapping[str, Any] | None = None) -> None:
        """Note one call: in its session (bounded in length and age) `{tool, decision, time}` plus
        `detail` (classes, paths, finding kinds, `at`, `ran`: gateway.stages.classify.history_detail),
        and in the principal's counts."""
        ...


@dataclass(frozen=True, slots=True)
class SeenTool:
    """A tool definition as a backend listed it, with its digest (gateway.mcp.governance)."""

    name: str
    digest: str
    definition: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PinState:
    """What the pins say about one definition seen now: it differs from the pinned one
    (`changed`), and an operator accepted exactly this definition, findings and all (`accepted`)."""

    changed: bool
    accepted: bool = False


class PinStore(Protocol):
    """Tool pins (rug-pull defence): the first definition seen of each tool, per backend, and the
    last different definition seen since, until an operator accepts it."""

    async def observe(self, backend: str, seen: list[SeenTool], now: str) -> dict[str, PinState]:
        """Pin what is new (atomically: the first pin wins); return {name: PinState} for each."""
        ...
    async def list(self, backend: str | None = None) -> list[dict[str, Any]]:
        """Every pin (optionally of one backend), sorted by backend and tool."""
        ...
    async def accept(self, backend: str, tool: str | None, now: str) -> builtins.list[str]:
        """Pin the last seen definition of `tool` (or of every changed tool); KeyError if unknown.

        Naming one `tool` also records that the operator accepts that definition as it is (its
        findings included: `tool.accepted`), whether or not it changed."""
        ...


@dataclass(frozen=True, slots=True)
class Approval:
    """A held call awaiting a human, bound to exactly one call."""

    id: str
    principal: str
    tool: str
    argument_digest: str
    policy_version: str
    request_id: str
    reason: str
    created_at: float
    expires_at: float
    state: str = "pending"  # pending | approved | denied | expired | used
    decided_by: str = ""
    arguments_preview: str = ""

    def binds(self, principal: str, tool: str, argument_digest: str, policy_version: str) -> bool:
        return (self.principal, self.tool, self.argument_digest, self.policy_version) == (
            principal,
            tool,
            argument_digest,
            policy_version,
        )


#: The approval events the karma ledger records (`used` stays in the approval store: the call's
#: own decision record names its approval id).
LEDGER_EVENTS = frozenset({"held", "approved", "denied", "expired"})


@dataclass(frozen=True, slots=True)
class ApprovalEvent:
    """One event of an approval's life, as the append-only approval store keeps it.

    `by` is a principal id (the caller for `held`, the approver for `approved`/`denied`, empty
    for `expired`); `via` says through what (gateway, http, cli, elicitation, api, timeout).
    """

    no: int
    approval: Approval
    event: str
    by: str
    via: str
    reason: str
    at: float


class ApprovalStore(Protocol):
    """Approvals as an append-only event log; an approval's state is its latest event."""

    async def create(self, approval: Approval) -> None: ...
    async def get(self, approval_id: str) -> Approval | None: ...
    async def decide(
        self, approval_id: str, *, approve: bool, by: str, now: float, via: str = "api", reason: str = ""
    ) -> Approval: ...
    async def consume(self, approval_id: str, *, now: float) -> bool:
        """Mark an approved approval used; False if it was not approved or already used (single use)."""
        ...
    async def expire(self, approval_id: str, *, now: float | None = None) -> None: ...
    async def pending(self, now: float) -> list[Approval]: ...
    async def unrecorded(self) -> list[ApprovalEvent]:
        """The events of LEDGER_EVENTS not yet marked recorded in the karma ledger, oldest first."""
        ...
    async def mark_recorded(self, no: int, seq: int, record_hash: str) -> None:
        """Note that event `no` is ledger record `seq` (insert-only: a second mark is refused)."""
        ...
    def recording(self) -> AbstractAsyncContextManager[None]:
        """Hold the claim to copy events into the ledger: one copier at a time across every process
        sharing the store (a no-op where only one process can write the ledger)."""
        ...
    def linked_mark(self, no: int) -> Any | None:
        """The row marking event `no` recorded, for the ledger to write in the same transaction as
        the record (`audit.postgres.LinkedRow`), or None when the store lives elsewhere than the ledger."""
        ...


class ApprovalWatch(Protocol):
    """One held call's interest in its approval, registered before the call reads the state."""

    async def wait(self, timeout: float) -> bool:
        """True once a wake-up came since the last `wait` (at once if one already did), else False after `timeout`."""
        ...


class ApprovalSignals(Protocol):
    """Wake-ups for held calls: whoever decides an approval `notify`s; the call holding it `watch`es.

    A wake-up is only a hint to read the approval store again: the decision itself is in the
    store, so a lost or forged wake-up can delay a release (until the holder's safety poll),
    never release or refuse a call by itself.
    """

    async def notify(self, approval_id: str) -> None:
        """Wake every holder of `approval_id` (never raises: a lost wake-up only delays)."""
        ...
    def watch(self, approval_id: str) -> AbstractAsyncContextManager[ApprovalWatch]: ...
    async def aclose(self) -> None: ...


class IdempotencyStore(Protocol):
    """Answers stored for replay under an idempotency key; values are JSON-able dicts."""

    async def get(self, key: str) -> Any | None: ...
    async def put(self, key: str, value: Any) -> None: ...


# ---- MCP Streamable HTTP sessions (issue 8: any replica serves any request) ------------------


class SessionFacts(BaseModel):
    """What any replica needs to continue a legacy `/mcp` session (JSON in a shared store, never pickle).

    The session id is a bearer secret bound to `principal`: a store hands the facts back only for
    the exact id, and the transport refuses them to any other principal.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    principal: str
    nonce: str
    version: str | None = None
    capabilities: dict[str, Any] = Field(default_factory=dict)
    upstream_sids: dict[str, str | None] = Field(default_factory=dict)
    upstream_versions: dict[str, str] = Field(default_factory=dict)


class SessionSignal(BaseModel):
    """A message for whichever replica holds some state of a session: a client's `answer` to a
    gateway-originated request (`key` is its id), a `cancel` of a held call (`key` is the
    client's request id), a `stale` tool catalog (`key` is the upstream id), or the session's `end`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["answer", "cancel", "stale", "end"]
    session: str
    key: str | int | None = None
    message: dict[str, Any] | None = None
    origin: str = ""


@dataclass(slots=True, eq=False)
class StreamLog:
    """One event stream the gateway opened on a session: its unguessable token and the last
    sequence number it gave (one writer per stream: the replica serving its request)."""

    standalone: bool = False
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    seq: int = 0


class EventStore(Protocol):
    """The events one session's streams carried, after governance, for `Last-Event-ID` resumes.

    Ids are `<stream token>.<seq>`, looked up only in this session's store; bounded by count and
    bytes, oldest first; an empty `data` is a priming event (an id only, never replayed).
    """

    def open(self, *, standalone: bool = False) -> StreamLog: ...
    async def append(self, stream: StreamLog, data: bytes) -> str: ...
    async def finish(self, stream: StreamLog) -> None: ...
    async def find(self, event_id: str) -> tuple[StreamLog, int] | None: ...
    def follow(self, stream: StreamLog, after: int, *, wait: bool = True) -> AsyncIterator[tuple[str, bytes]]:
        """Every event of `stream` after position `after`, then (with `wait`) each new one until it is done."""
        ...


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """How many legacy sessions may be open at once: per principal and in total (`mcp.max_sessions_per_principal`,
    `mcp.max_sessions`; a store refuses `create` beyond either with `LimitReached` naming the setting),
    and how many GET streams one session may hold open on a replica (`mcp.max_streams_per_session`).
    The defaults are `dharma.yaml`'s."""

    per_principal: int = 16
    total: int = 256
    streams_per_session: int = 4


def session_limit(setting: str, open_now: int, principal: str | None, retry_after: float) -> LimitReached:
    """The refusal of one session too many, worded the same by every store."""
    whose = f" for principal {principal!r}" if principal is not None else " on this gateway"
    return LimitReached(setting, f"session limit reached: {open_now} open sessions{whose} ({setting}); end one "
                                 f"(DELETE) or retry after {max(1, math.ceil(retry_after))} s, when an idle one expires",
                        retry_after=max(1.0, retry_after))


PER_PRINCIPAL = "mcp.max_sessions_per_principal"
TOTAL = "mcp.max_sessions"


class SessionStore(Protocol):
    """Legacy `/mcp` sessions: their facts (expiring after `idle_seconds` unused), their event
    stores, and the signals that reach the replica holding a session's waiters and holds.

    Open sessions are bounded (`limits`): `create` counts the sessions that have not expired, per
    principal and in total, and refuses one too many with `LimitReached`; `end` frees its slot at
    once, expiry when it happens (a shared store counts across replicas)."""

    idle_seconds: float
    replica: str
    limits: SessionLimits

    async def create(self, facts: SessionFacts) -> None:
        """Store a new session, or raise `LimitReached` when its principal or the gateway has as
        many open as `limits` allow (nothing is stored then)."""
        ...
    async def load(self, session_id: str) -> SessionFacts | None:
        """The facts of `session_id` (None if unknown or expired); using a session keeps it alive."""
        ...
    async def save(self, facts: SessionFacts) -> None: ...
    async def end(self, session_id: str) -> None:
        """Forget the session and its events everywhere, free its slot, and tell every replica (`end` signal)."""
        ...
    async def touch(self, session_ids: Iterable[str]) -> None:
        """Keep these sessions alive as a request would (they have requests in flight on this replica)."""
        ...
    async def reap(self) -> list[SessionFacts]:
        """Sessions that expired since the last call, for the caller to end their upstream sessions
        (stop their server processes). A store whose expiry needs no help (Redis TTLs) returns []."""
        ...
    def events(self, session_id: str) -> EventStore: ...
    async def publish(self, signal: SessionSignal) -> None:
        """Send `signal` to every other replica (nothing to do with one process)."""
        ...
    def signals(self) -> AsyncIterator[SessionSignal]:
        """The signals other replicas publish, for as long as the endpoint runs."""
        ...


# ---- /ui login sessions (any replica serves any page) ----------------------------------------


class UiSessionRecord(BaseModel):
    """A `/ui` login session as a store keeps it (JSON, shared by replicas): who logged in, by a
    reference the policy resolves again on every request (an API key's SHA-256, or the verified
    token's subject, claims and tier), never the credential itself; the CSRF token; the end."""

    model_config = ConfigDict(extra="forbid", strict=True)

    csrf: str
    expires_at: float
    api_key_sha256: str | None = None
    jwt_subject: str | None = None
    jwt_claims: dict[str, Any] = Field(default_factory=dict)
    jwt_tier: str | None = None
    flash: str | None = None
    """A one-time notice for the next page (what the last decision did)."""


class OidcFlowRecord(BaseModel):
    """An SSO login under way as a store keeps it (JSON, shared by replicas): the single-use secrets its
    callback must match or present (`state`, `nonce`, the PKCE verifier) and when it lapses."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    state: str
    nonce: str
    verifier: str
    expires_at: float


class UiSessionStore(Protocol):
    """`/ui` sessions and SSO logins under way, by their ids (bearer secrets: stores keep only their
    digest where others can read)."""

    async def put(self, session_id: str, record: UiSessionRecord) -> None:
        """Keep `record` until its `expires_at` (replacing what `session_id` had)."""
        ...
    async def get(self, session_id: str, now: float) -> UiSessionRecord | None:
        """The session, or None if unknown or expired at `now`."""
        ...
    async def end(self, session_id: str) -> None: ...
    async def put_flow(self, flow_id: str, record: OidcFlowRecord) -> None:
        """Keep an SSO login under way until its `expires_at`."""
        ...
    async def take_flow(self, flow_id: str, now: float) -> OidcFlowRecord | None:
        """The login under way, removed in the same step (so only one callback, on any replica, gets
        it), or None if unknown, already taken or expired at `now`."""
        ...
