"""Dharma Gateway: policy-as-code governance for AI-agent tool calls.

    gateway = await open_gateway(policy="policies/standard.yaml", backends=[CallableBackend.from_functions("tools", [read_file])])
    outcome = await gateway.call("read_file", {"path": "README.txt"}, api_key="...")

Exports are loaded on first use, so `dharma` commands that need little start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Backend": "gateway.core.backends",
    "BackendResult": "gateway.core.backends",
    "CallError": "gateway.core.errors",
    "CallableBackend": "gateway.transports.upstreams.python",
    "ConfigError": "gateway.core.errors",
    "Decision": "gateway.core.call",
    "Effect": "gateway.core.call",
    "ErrorCode": "gateway.core.errors",
    "Gateway": "gateway.core.gateway",
    "GatewayError": "gateway.core.errors",
    "HttpBackend": "gateway.transports.upstreams.http_api",
    "Outcome": "gateway.core.call",
    "PolicyErrors": "gateway.core.errors",
    "Status": "gateway.core.call",
    "ToolSpec": "gateway.core.backends",
    "open_gateway": "gateway.runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
