"""JSON-RPC bookkeeping for one proxied MCP connection. Pure: no pipes, no clock, no policy.

`McpSession` is fed framed messages from each side (`from_client`, `from_server`) and answers
with `Action`s for the transport to carry out. It knows:

- the protocol era and negotiated revision (from `initialize` and its answer, or from the
  `io.modelcontextprotocol/protocolVersion` `_meta` of each 2026-07-28 request), and the
  client's capabilities (from `initialize`, or per 2026 request);
- the two id spaces: ids the client chose (client → server requests) and ids the server chose
  (server → client requests) never meet; requests the gateway itself originates get string ids
  with a reserved prefix and a per-connection random nonce, so neither peer can collide with
  them, and the answers to them are swallowed (`Resolve`);
- which pending client requests are `tools/list` (their answers must be filtered) and which are
  `tools/call` (governed, never forwarded as received);
- batches: allowed only when the session negotiated a revision that has them (2025-03-26);
  each element is handled on its own and the answers are collected into one array.

It never decides policy: `tools/call` becomes `GovernCall`, a `tools/list` answer becomes
`ListAnswer`, and the transport answers both through `answer()`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import Batch, Invalid, Notification, Request, Response, RpcId
from gateway.mcp.versions import BATCH_VERSIONS, ID_PREFIX, META_CAPABILITIES, META_VERSION, MODERN_VERSIONS


# ---- actions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToServer:
    data: bytes


@dataclass(frozen=True, slots=True)
class ToClient:
    data: bytes


@dataclass(frozen=True, slots=True)
class GovernCall:
    """A client `tools/call` to decide. Answer it with `McpSession.answer(key, message)`."""

    key: object
    request: Request
    protocol_version: str | None
    capabilities: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ListAnswer:
    """The server's answer to a client `tools/list`: filter it, then `answer(key, message)`."""

    key: object
    response: dict[str, Any]
    protocol_version: str | None


@dataclass(frozen=True, slots=True)
class Resolve:
    """The answer to a request the gateway originated, or to a governed call it forwarded."""

    id: RpcId
    response: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CancelHeld:
    """The client cancelled a governed call the server has not seen: drop it, send nothing."""

    key: object


@dataclass(frozen=True, slots=True)
class Reject:
    """A message that goes no further. Record it; answer `error` via `answer(key, ...)` unless key is None."""

    key: object | None
    id: RpcId | None
    code: int
    reason: str
    method: str | None = None

    def error(self) -> dict[str, Any]:
        return jsonrpc.error(self.id, self.code, self.reason)


@dataclass(frozen=True, slots=True)
class Passed:
    """A client request for a method MCP does not define was forwarded (recorded, not blocked)."""

    id: RpcId
    method: str


Action = ToServer | ToClient | GovernCall | ListAnswer | Resolve | CancelHeld | Reject | Passed

# Methods the spec defines for client → server requests, all revisions (anything else is
# "unknown": forwarded so the backend gives its own answer, and recorded).
CLIENT_METHODS = frozenset(
    {
        "initialize", "ping", "server/discover", "subscriptions/listen",
        "tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read",
        "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get",
        "completion/complete", "logging/setLevel", "tasks/get", "tasks/result", "tasks/list",
        "tasks/cancel", "tasks/update",
    }
)


@dataclass(slots=True)
class _Pending:
    key: object
    method: str
    version: str | None
    batch: _BatchState | None = None


@dataclass(slots=True)
class _BatchState:
    slots: list[object]
    answers: dict[object, dict[str, Any]] = field(default_factory=dict)


class McpSession:
    """Per-connection state of a proxied MCP session (see module docstring)."""

    def __init__(self, *, nonce: str | None = None) -> None:
        self.nonce = nonce or secrets.token_hex(6)
        self.protocol_version: str | None = None  # negotiated (legacy) or last seen (2026)
        self.requested_version: str | None = None
        self.capabilities: dict[str, Any] = {}
        self.initialize_request: dict[str, Any] | None = None
        self.initialized_notification: dict[str, Any] | None = None
        self.tools: dict[str, dict[str, Any]] = {}
        self.tools_stale = False
        self._tool_digests: dict[str, str] = {}  # of the definitions in `tools`, dropped when one is replaced
        self._counter = 0
        self._client_pending: dict[RpcId, _Pending] = {}  # client-chosen ids awaiting the server
        self._governed: dict[RpcId, _Pending] = {}  # client tools/call ids being governed
        self._forwarded_calls: set[RpcId] = set()  # governed calls now at the server
        self._originated: dict[str, str] = {}  # gateway id -> "server" | "client"
        self._keys: dict[object, _Pending] = {}

    # ---- era ---------------------------------------------------------------------------

    @property
    def modern(self) -> bool:
        return self.protocol_version in MODERN_VERSIONS

    @property
    def batches_allowed(self) -> bool:
        return self.protocol_version in BATCH_VERSIONS

    def client_can_elicit(self, capabilities: dict[str, Any] | None = None) -> bool:
        caps = self.capabilities if capabilities is None else capabilities
        return isinstance(caps.get("elicitation"), dict)

    # ---- gateway-originated requests ---------------------------------------------------

    def originate(self, to: str, method: str, params: Any = None) -> tuple[str, bytes]:
        """A request from the gateway itself (`to` = "server" or "client"): its id and bytes."""
        self._counter += 1
        rpc_id = f"{ID_PREFIX}{self.nonce}/{self._counter}"
        self._originated[rpc_id] = to
        return rpc_id, jsonrpc.dumps(jsonrpc.request(rpc_id, method, params))

    def forget(self, rpc_id: str) -> None:
        self._originated.pop(rpc_id, None)

    def forward_call(self, key: object, message: dict[str, Any]) -> bytes:
        """Bytes of a governed call going to the server; its answer comes back as `Resolve`."""
        pending = self._keys.get(key)
        if pending is not None:
            self._forwarded_calls.add(message["id"])
        return jsonrpc.dumps(message)

    def is_forwarded(self, key: object) -> bool:
        pending = self._keys.get(key)
        return pending is not None and isinstance(key, tuple) and key[1] in self._forwarded_calls

    # ---- from the client ---------------------------------------------------------------

    def from_client(self, line: bytes) -> list[Action]:
        parsed = jsonrpc.parse(line)
        if isinstance(parsed, Batch):
            if not self.batches_allowed:
                key = object()
                revision = self.protocol_version or "none negotiated yet"
                return [Reject(key, None, jsonrpc.INVALID_REQUEST,
                               f"Invalid Request: JSON-RPC batches are not allowed on protocol revision {revision} "
                               "(only 2025-03-26 has them)", "batch")]
            batch = _BatchState(slots=[])
            actions: list[Action] = []
            for item in parsed.items:
                actions.extend(self._client_single(item, None, batch))
            if not batch.slots:
                return actions
            return actions
        return self._client_single(parsed, line, None)

    def oversized(self, rpc_id: RpcId | None, size: int, limit: int) -> Reject:
        return Reject(object(), rpc_id, jsonrpc.INVALID_REQUEST,
                      f"Invalid Request: message of {size} bytes exceeds the gateway's limit of {limit} bytes")

    def _slot(self, rpc_id: RpcId | None, method: str, version: str | None, batch: _BatchState | None) -> object:
        key: object = ("c", rpc_id) if rpc_id is not None else object()
        if key in self._keys:  # an id the client is still waiting on: keep both apart
            key = ("c", rpc_id, object())
        pending = _Pending(key, method, version, batch)
        self._keys[key] = pending
        if batch is not None:
            batch.slots.append(key)
        return key

    def _client_single(self, item: Any, raw: bytes | None, batch: _BatchState | None) -> list[Action]:
        if isinstance(item, Invalid):
            key = self._slot(item.id, item.method or "", None, batch)
            return [Reject(key, item.id, item.code, item.reason, item.method)]
        if isinstance(item, Response):
            if isinstance(item.id, str) and self._originated.get(item.id) == "client":
                self._originated.pop(item.id, None)
                return [Resolve(item.id, item.message)]
            return [ToServer(raw if raw is not None else jsonrpc.dumps(item.message))]
        if isinstance(item, Notification):
            return self._client_notification(item, raw)
        return self._client_request(item, raw, batch)

    def _client_notification(self, item: Notification, raw: bytes | None) -> list[Action]:
        data = raw if raw is not None else jsonrpc.dumps(item.message)
        if item.method == "tools/call":
            return [Reject(None, None, jsonrpc.INVALID_REQUEST,
                           "Invalid Request: tools/call must be a request with an id, not a notification", item.method)]
        if item.method == "notifications/initialized":
            self.initialized_notification = item.message
        if item.method == "notifications/cancelled" and isinstance(item.params, dict):
            target = item.params.get("requestId")
            pending = self._governed.get(target) if jsonrpc.valid_id(target) else None
            if pending is not None and target not in self._forwarded_calls:
                return [CancelHeld(pending.key)]
        return [ToServer(data)]

    def _client_request(self, item: Request, raw: bytes | None, batch: _BatchState | None) -> list[Action]:
        params = item.params if isinstance(item.params, dict) else {}
        version = self._note_version(params)
        if item.method == "initialize":
            self.initialize_request = item.message
            self.capabilities = dict(params.get("capabilities") or {}) if isinstance(params.get("capabilities"), dict) else {}
            requested = params.get("protocolVersion")
            self.requested_version = requested if isinstance(requested, str) else None
        key = self._slot(item.id, item.method, version, batch)
        pending = self._keys[key]
        if item.method == "tools/call":
            self._governed[item.id] = pending
            caps = self.capabilities
            meta = params.get("_meta")
            if isinstance(meta, dict) and isinstance(meta.get(META_CAPABILITIES), dict):
                caps = meta[META_CAPABILITIES]
            return [GovernCall(key, item, version or self.protocol_version, caps)]
        self._client_pending[item.id] = pending
        actions: list[Action] = [ToServer(raw if raw is not None else jsonrpc.dumps(item.message))]
        if item.method not in CLIENT_METHODS:
            actions.append(Passed(item.id, item.method))
        return actions

    def _note_version(self, params: dict[str, Any]) -> str | None:
        meta = params.get("_meta")
        if isinstance(meta, dict):
            version = meta.get(META_VERSION)
            if isinstance(version, str):
                self.protocol_version = version
                return version
        return None

    # ---- from the server ---------------------------------------------------------------

    def from_server(self, line: bytes) -> list[Action]:
        parsed = jsonrpc.parse(line)
        if isinstance(parsed, Batch):  # split: each element on its own
            actions: list[Action] = []
            for item in parsed.items:
                if not isinstance(item, Invalid):
                    actions.extend(self._server_single(item, None))
            return actions
        if isinstance(parsed, Invalid):
            return self._refused_answer(line, parsed)
        return self._server_single(parsed, line)

    def _refused_answer(self, line: bytes, invalid: Invalid) -> list[Action]:
        """A server answer the strict parser refused (a duplicate key, a lone surrogate): the
        request it answers gets an error instead of waiting forever. Anything else that is not
        JSON-RPC (a server writing junk on stdout) gives no action; the transport logs it."""
        rid = jsonrpc.refused_answer_id(line)
        known = rid is not None and (
            rid in self._client_pending or rid in self._forwarded_calls
            or (isinstance(rid, str) and self._originated.get(rid) == "server")
        )
        if not known:
            return []
        message = jsonrpc.error(rid, jsonrpc.BACKEND_FAILED, f"the server's answer was refused: {invalid.reason}")
        return self._server_single(Response(rid, message), None)

    def _server_single(self, item: Request | Notification | Response, raw: bytes | None) -> list[Action]:
        data = raw if raw is not None else jsonrpc.dumps(item.message)
        if isinstance(item, Response):
            rid = item.id
            if isinstance(rid, str) and self._originated.get(rid) == "server":
                self._originated.pop(rid, None)
                return [Resolve(rid, item.message)]
            if rid in self._forwarded_calls:
                self._forwarded_calls.discard(rid)
                return [Resolve(rid, item.message)]
            pending = self._client_pending.pop(rid, None) if rid is not None else None
            if pending is None:
                return [ToClient(data)]  # late or unknown: the client decides
            if pending.method == "initialize":
                result = item.message.get("result")
                if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                    self.protocol_version = result["protocolVersion"]
            if pending.method == "tools/list" and "result" in item.message:
                return [ListAnswer(pending.key, item.message, pending.version or self.protocol_version)]
            if pending.batch is not None:
                return self.answer(pending.key, item.message)
            self._keys.pop(pending.key, None)
            return [ToClient(data)]
        if isinstance(item, Notification) and item.method == "notifications/tools/list_changed":
            self.tools_stale = True
        return [ToClient(data)]

    # ---- answers -----------------------------------------------------------------------

    def answer(self, key: object | None, message: dict[str, Any]) -> list[Action]:
        """Send the answer to a client request (governed, filtered or rejected); batches are collected."""
        pending = self._keys.pop(key, None) if key is not None else None
        if pending is not None and pending.method == "tools/call":
            rid = key[1] if isinstance(key, tuple) else None
            if rid is not None and self._governed.get(rid) is pending:
                del self._governed[rid]
            self._forwarded_calls.discard(rid)
        if pending is None or pending.batch is None:
            return [ToClient(jsonrpc.dumps(message))]
        batch = pending.batch
        batch.answers[key] = message
        if len(batch.answers) < len(batch.slots):
            return []
        return [ToClient(jsonrpc.dumps([batch.answers[k] for k in batch.slots]))]

    def drop(self, key: object) -> list[Action]:
        """Forget a request that gets no answer (a cancelled hold); a batch still completes."""
        pending = self._keys.get(key)
        if pending is None:
            return []
        if pending.batch is not None:
            return self.answer(key, jsonrpc.error(key[1] if isinstance(key, tuple) else None,
                                                   jsonrpc.REQUEST_CANCELLED, "Request cancelled"))
        self.answer(key, {})
        return []

    def server_gone(self) -> list[tuple[object, RpcId, str]]:
        """The server exited: the client requests it will never answer (key, id, method)."""
        lost = [(p.key, rid, p.method) for rid, p in self._client_pending.items()]
        self._client_pending.clear()
        for rid in list(self._originated):
            if self._originated[rid] == "server":
                del self._originated[rid]
        return lost

    # ---- catalog -----------------------------------------------------------------------

    def record_tools(self, tools: list[dict[str, Any]], *, first_page: bool) -> None:
        if first_page:
            self.tools = {}
            self._tool_digests = {}
            self.tools_stale = False
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self.tools[tool["name"]] = tool
                self._tool_digests.pop(tool["name"], None)

    def tool_digest(self, name: str, digest_of: Callable[[dict[str, Any]], str]) -> str:
        """`digest_of` the recorded definition of `name`, taken once per definition: a call on the
        same tool reuses it, and recording a definition again (a new `tools/list`) drops it."""
        digest = self._tool_digests.get(name)
        if digest is None:
            digest = self._tool_digests[name] = digest_of(self.tools[name])
        return digest
