"""The gateway's name for the one strict JSON decoder, `audit.strict_json` (see there).

The decoder lives in `audit`, which imports nothing from `gateway`, so the ledger's own readers
(export bundles) and the gateway's (JSON-RPC, HTTP bodies, JWT and receipt segments, JWKS and the
CLI's input files) decode with the same code. This module only re-exports it.
"""

from __future__ import annotations

from audit.strict_json import MAX_DEPTH, StrictJSONError, check_depth, has_surrogate, loads

__all__ = ["MAX_DEPTH", "StrictJSONError", "check_depth", "has_surrogate", "loads"]
