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
from gateway.stores.base import EventStore, SessionFacts
from gateway.transports.groups import Group
from gateway.transports.upstreams.replies import UpstreamReply


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
    """Tool definitions seen, by the name the client sees: (upstream, definition as the upstream sent it),
    and each definition's `definition_digest` once a call took it (dropped when the name is recorded again)."""

    tools: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    loaded: set[str] = field(default_factory=set)
    digests: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Local:
    """What one replica keeps of a session between requests, never shared: the catalog (rebuilt
    lazily through the shared upstream session), the waiters and holds of requests it serves (other
    replicas reach them with signals), its counter of originated ids, and how many of its requests
    (`open`; of them GET streams: `streams`) this replica is serving now."""

    catalog: Catalog = field(default_factory=Catalog)
    waiters: dict[str, Waiter] = field(default_factory=dict)
    holds: dict[Any, anyio.CancelScope] = field(default_factory=dict)
    counter: int = 0
    used: float = field(default_factory=time.monotonic)
    open: int = 0
    streams: int = 0

    def busy(self) -> bool:
        """Whether a request of the session is in flight here (the session is not idle then)."""
        return bool(self.open or self.waiters or self.holds)


@dataclass(slots=True)
class HttpSession:
    """A legacy session as one request sees it: the shared facts (`SessionFacts`, from the session
    store), this replica's `Local` part and the session's event store."""

    id: str
    principal: str
    events: EventStore
    replica: str = ""
    nonce: str = field(default_factory=lambda: secrets.token_hex(6))
    version: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    upstream_sids: dict[str, str | None] = field(default_factory=dict)
    upstream_versions: dict[str, str] = field(default_factory=dict)
    local: Local = field(default_factory=Local)

    @classmethod
    def of(cls, facts: SessionFacts, local: Local, events: EventStore, replica: str) -> HttpSession:
        return cls(id=facts.id, principal=facts.principal, events=events, replica=replica, nonce=facts.nonce,
                   version=facts.version, capabilities=facts.capabilities, upstream_sids=facts.upstream_sids,
                   upstream_versions=facts.upstream_versions, local=local)

    def facts(self) -> SessionFacts:
        return SessionFacts(id=self.id, principal=self.principal, nonce=self.nonce, version=self.version,
                            capabilities=self.capabilities, upstream_sids=self.upstream_sids,
                            upstream_versions=self.upstream_versions)

    @property
    def catalog(self) -> Catalog:
        return self.local.catalog

    @property
    def waiters(self) -> dict[str, Waiter]:
        return self.local.waiters

    @property
    def holds(self) -> dict[Any, anyio.CancelScope]:
        return self.local.holds

    def originate(self) -> str:
        """An id for a request the gateway sends on this session, unique across replicas (the
        replica's token) without a round trip to a shared counter."""
        self.local.counter += 1
        return f"{ID_PREFIX}{self.nonce}/{self.replica}.{self.local.counter}"

    def originated(self, rpc_id: str) -> bool:
        """Whether `rpc_id` is an id some replica originated on this session."""
        return rpc_id.startswith(f"{ID_PREFIX}{self.nonce}/")


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
    group: Group | None = None  # the named group the request came to (`/mcp/{group}`), None at `/mcp`


def resumable_version(version: str | None) -> bool:
    """Whether a legacy client at `version` can resume a stream (it parses priming events): 2025-11-25 on."""
    return at_least(version, "2025-11-25")


def obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}
