"""Dharma Gateway: policy-as-code governance for AI-agent tool calls.

    gateway = await open_gateway(policy="policies/standard.yaml", backends=[CallableBackend.from_functions("tools", [read_file])])
    outcome = await gateway.call("read_file", {"path": "README.txt"}, api_key="...")
"""

from gateway.backends import Backend, BackendResult, CallableBackend, HttpBackend, ToolSpec
from gateway.call import Decision, Effect, Outcome, Status
from gateway.errors import CallError, ConfigError, ErrorCode, GatewayError, PolicyErrors
from gateway.gateway import Gateway
from gateway.runtime import open_gateway

__all__ = [
    "Backend",
    "BackendResult",
    "CallError",
    "CallableBackend",
    "ConfigError",
    "Decision",
    "Effect",
    "ErrorCode",
    "Gateway",
    "GatewayError",
    "HttpBackend",
    "Outcome",
    "PolicyErrors",
    "Status",
    "ToolSpec",
    "open_gateway",
]
