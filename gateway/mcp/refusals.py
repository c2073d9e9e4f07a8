"""Refusals by a limit (open sessions, server processes, streams) on the record without letting a
flood of them fill the ledger or slow everyone's calls.

Per principal and limit, the first refusal is recorded at once (an auditor sees it as it
happens); the ones that follow within `window` seconds are only counted, and the count goes in
the ledger as one record (`count`, `since`: when the first of them came) once the window is over:
at the next refusal of that principal and limit, or when `flush` runs (the endpoint's lifespan
calls it periodically and on shutdown). So a principal that floods costs the ledger at most two
records per window, and each refused request costs a dict lookup. `/metrics` counts every refusal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.core.gateway import Gateway, rfc3339
from gateway.mcp.calls import CallSite, record_limit_refusal

#: How long a principal's refusals by one limit are counted before their count is recorded.
WINDOW_SECONDS = 10.0
#: Principals (and limits) counted at once at most; past it every count is recorded at once.
MAX_COUNTING = 10_000


@dataclass(slots=True)
class _Count:
    opened: float  # monotonic time the window began (its first refusal, recorded at once)
    site: CallSite
    method: str
    count: int = 0  # refusals since, not yet recorded
    first: str = ""  # when the first of those came (RFC 3339)


class LimitRefusals:
    """The ledger side of limit refusals (see the module docstring)."""

    def __init__(self, gateway: Gateway, *, window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.gateway = gateway
        self.window = window
        self._clock = clock
        self._counting: dict[tuple[str, str], _Count] = {}

    async def refused(self, site: CallSite, method: str, limit: str) -> None:
        """Put one refusal of `site.principal` by `limit` on the record (at once, or counted)."""
        key = (site.principal, limit)
        now = self._clock()
        counting = self._counting.get(key)
        if counting is not None and now - counting.opened < self.window:
            if not counting.count:
                counting.first = rfc3339(time.time())
            counting.count += 1
            return
        if counting is not None:
            await self._record(key, counting)
        if len(self._counting) >= MAX_COUNTING:
            await self.flush(everything=True)
        self._counting[key] = _Count(opened=now, site=site, method=method)
        await record_limit_refusal(self.gateway, site, method, limit)

    async def flush(self, *, everything: bool = False) -> None:
        """Record the counts of windows that are over (`everything`: of every window, on shutdown)."""
        now = self._clock()
        for key, counting in list(self._counting.items()):
            if everything or now - counting.opened >= self.window:
                await self._record(key, counting)

    async def _record(self, key: tuple[str, str], counting: _Count) -> None:
        self._counting.pop(key, None)
        if counting.count:
            await record_limit_refusal(self.gateway, counting.site, counting.method, key[1], count=counting.count,
                                       since=counting.first)
