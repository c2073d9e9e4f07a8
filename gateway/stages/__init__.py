"""The pipeline's steps, one module each; `gateway.core.pipeline` declares their order.

Every step is an object with a `name` and `async __call__(ctx, policy)`, built with the
dependencies it needs (stores, ledger, keys, clock) and nothing else. Two kinds:

* a `Stage` decides before the backend: it returns `None` ("go on") or a Decision, which
  ends the decision chain;
* a `Step` runs from the backend on (forward, disclosure, record, receipt): it fills in the
  call's status, result, ledger record and response on the context and returns nothing.

The logic of each is a plain function in the same module, tested without an event loop.
"""

from __future__ import annotations

from typing import Protocol

from gateway.core.call import CallContext, Decision
from gateway.core.errors import ErrorCode
from gateway.policy.compile import CompiledPolicy
from gateway.stores.base import StoreUnavailable

#: How soon a caller refused because a shared store is down may retry.
STORE_DOWN_RETRY_SECONDS = 1.0
#: The stage name of a refusal because the session history could not be read (Gateway.govern).
HISTORY = "history"


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None: ...


class Step(Protocol):
    name: str

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None: ...


def store_down(exc: StoreUnavailable, stage: str) -> Decision:
    """The refusal when a shared store (e.g. Redis) cannot be reached: fail closed, say what is down.

    `backend_unavailable`, not `internal_error`: the gateway is working, a dependency it needs to
    decide is not, and the caller should retry shortly (the code is retryable and carries
    `retry_after`); not `rate_limited` either, which would blame the caller's own rate.
    """
    return Decision.block(
        ErrorCode.BACKEND_UNAVAILABLE,
        f"{exc}; the call was refused and not forwarded (the gateway fails closed until it is back)",
        None,
        stage=stage,
        retry_after=STORE_DOWN_RETRY_SECONDS,
    )
