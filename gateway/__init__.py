"""Dharma Gateway: policy-as-code governance for AI-agent tool calls.

    gateway = await open_gateway(policy="policies/standard.yaml", backends=[CallableBackend.from_functions("tools", [read_file])])
    outcome = await gateway.call("read_file", {"path": "README.txt"}, api_key="...")

Exports are loaded on first use, so `dharma` commands that need little start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Backend": "gateway.backends",
    "BackendResult": "gateway.backends",
    "CallError": "gateway.errors",
    "CallableBackend": "gateway.backends",
    "ConfigError": "gateway.errors",
    "Decision": "gateway.call",
    "Effect": "gateway.call",
    "ErrorCode": "gateway.errors",
    "Gateway": "gateway.gateway",
    "GatewayError": "gateway.errors",
    "HttpBackend": "gateway.backends",
    "Outcome": "gateway.call",
    "PolicyErrors": "gateway.errors",
    "Status": "gateway.call",
    "ToolSpec": "gateway.backends",
    "open_gateway": "gateway.runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
