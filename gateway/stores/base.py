"""The storage Protocols the stages depend on. Implementations are named after their technology."""

from __future__ import annotations

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


class IdempotencyStore(Protocol):
    async def get(self, key: str) -> Any | None: ...
    async def put(self, key: str, value: Any) -> None: ...
