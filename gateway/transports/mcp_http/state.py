"""The values `/mcp` keeps per legacy session and per request, and the `Upstream` it talks to.

Data only: no handlers and no I/O (the handlers are in `mcp_http`, `mcp_http_sessions` and
`mcp_http_tools`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from gateway.core.call import Credentials, Principal
from gateway.mcp import jsonrpc
from gateway.mcp.versions import ID_PREFIX, at_least
from gateway.transports.mcp_http.events import EventStore
from gateway.transports.upstreams.mcp_http import UpstreamReply


class Upstream(Protocol):
    """An upstream MCP server as `/mcp` uses it (`upstream_http.McpHttpUpstream`, `upstream_stdio.McpStdioUpstream`)."""

    id: str
    prefix: str
    forward_host: bool

    def post(self, body: bytes, headers: dict[str, str], *, expect_id: jsonrpc.RpcId | None = None) -> Any: ...
    def get(self, headers: dict[str, str]) -> Any: ...
    async def delete(self, headers: dict[str, str]) -> UpstreamReply: ...
    async def aclose(self) -> None: ...


# ---- per-session and per-request state ---------------------------------------------------


class Waiter:
    def __init__(self) -> None:
        self.event = anyio.Event()
        self.value: dict[str, Any] | None = None


@dataclass(slots=True)
class Catalog:
    """Tool definitions seen, by the name the client sees: (upstream, definition as the upstream sent it)."""

    tools: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)


@dataclass(slots=True)
class HttpSession:
    """A legacy session as the gateway keeps it: never leaves this process (see module docstring)."""

    id: str
    principal: str
    nonce: str = field(default_factory=lambda: secrets.token_hex(6))
    version: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    upstream_sids: dict[str, str | None] = field(default_factory=dict)
    upstream_versions: dict[str, str] = field(default_factory=dict)
    catalog: Catalog = field(default_factory=Catalog)
    waiters: dict[str, Waiter] = field(default_factory=dict)
    holds: dict[Any, anyio.CancelScope] = field(default_factory=dict)
    events: EventStore = field(default_factory=EventStore)
    last_used: float = field(default_factory=time.monotonic)
    counter: int = 0

    def originate(self) -> str:
        self.counter += 1
        return f"{ID_PREFIX}{self.nonce}/{self.counter}"


@dataclass(slots=True)
class Ctx:
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    credentials: Credentials
    principal: Principal
    modern: bool
    version: str | None
    session: HttpSession | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def resumable_version(version: str | None) -> bool:
    """Whether a legacy client at `version` can resume a stream (it parses priming events): 2025-11-25 on."""
    return at_least(version, "2025-11-25")


def obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}
