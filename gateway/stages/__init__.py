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
from gateway.policy.compile import CompiledPolicy


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None: ...


class Step(Protocol):
    name: str

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> None: ...
