"""The storage Protocols the stages depend on. Implementations are named after their technology."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol


class StoreUnavailable(Exception):
    """A store could not be reached; the stage decides whether that fails open or closed."""


class LimiterStore(Protocol):
    async def acquire(self, key: str, *, interval: float, burst: int, cost: int, now: float) -> float:
        """Take `cost` tokens under GCRA; return 0.0 if allowed, else seconds until it would be."""
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
    async def get(self, key: str) -> Any | None: ...
    async def put(self, key: str, value: Any) -> None: ...
