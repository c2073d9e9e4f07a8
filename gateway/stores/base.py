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


class ApprovalStore(Protocol):
    async def create(self, approval: Approval) -> None: ...
    async def get(self, approval_id: str) -> Approval | None: ...
    async def decide(self, approval_id: str, *, approve: bool, by: str, now: float) -> Approval: ...
    async def consume(self, approval_id: str, *, now: float) -> bool:
        """Mark an approved approval used; False if it was not approved or already used (single use)."""
        ...
    async def expire(self, approval_id: str) -> None: ...
    async def pending(self, now: float) -> list[Approval]: ...


class IdempotencyStore(Protocol):
    async def get(self, key: str) -> Any | None: ...
    async def put(self, key: str, value: Any) -> None: ...
