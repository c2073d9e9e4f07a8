"""The logger a per-call path calls: the one structlog settled on, and whether it drops debug events.

A module's `structlog.get_logger()` is a lazy proxy that looks the configured logger up on every
call, and a debug line's fields are built before the filter drops them: together about 1.4 µs hot,
and several µs a line on a path whose caches a disk sync has just emptied (a ledger commit, the
receipt after it). When structlog caches loggers on first use (the gateway's configuration), the
proxy settles on one logger for good; `settle` returns that logger and whether it drops debug
events, so a debug line costs nothing while debug is off. With caching off (tests reconfigure
logging at will), it returns the proxy itself and never says "drops": every event goes through
exactly as before. Shared by both packages (the gateway may import `audit`, not the reverse). No I/O.
"""

from __future__ import annotations

import logging
from typing import Any


def settle(proxy: Any) -> tuple[Any, bool]:
    """`(logger, drops_debug)` for `proxy`: the logger structlog settled on and whether it filters
    out debug events, or `(proxy, False)` when structlog builds a logger per call (then nothing
    may be assumed about the next call's logger)."""
    bound = proxy.bind()
    if proxy.bind() is not bound:  # not cached on first use: each call resolves the configuration anew
        return proxy, False
    enabled = getattr(bound, "is_enabled_for", None)
    return bound, enabled is not None and not enabled(logging.DEBUG)
