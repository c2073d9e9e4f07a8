"""Protocol revisions, envelope keys and the gateway's reserved id prefix: the constants both MCP
transports (stdio and HTTP) and the pure session share. No I/O, no logic beyond a comparison.
"""

from __future__ import annotations

#: Handshake ("legacy") revisions: `initialize`, sessions, server→client requests on the wire.
LEGACY_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
#: Stateless revisions: every request carries the `_meta` envelope below.
MODERN_VERSIONS = frozenset({"2026-07-28"})
#: Revisions whose transports carry JSON-RPC batches (arrays).
BATCH_VERSIONS = frozenset({"2025-03-26"})
#: Ids of requests the gateway originates start with this, so they never collide with a peer's.
ID_PREFIX = "dharma.gateway/"

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"

HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022


def at_least(version: str | None, floor: str) -> bool:
    """Whether a legacy `version` is `floor` or later (revisions are dates, so they sort as text)."""
    return version is not None and version in LEGACY_VERSIONS and version >= floor
