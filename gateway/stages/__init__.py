"""The pipeline's stages, one module each.

A stage is an object with a `name` and `async __call__(ctx, policy) -> Decision | None`:
`None` means "go on", a Decision ends the chain. Setup happens in `__init__`; the logic is a
plain function in the same module, tested without an event loop.
"""

from __future__ import annotations

from typing import Protocol

from gateway.core.call import CallContext, Decision
from gateway.policy.compile import CompiledPolicy


class Stage(Protocol):
    name: str

    async def __call__(self, ctx: CallContext, policy: CompiledPolicy) -> Decision | None: ...
