"""The one `tools/call` flow, shared by every MCP transport (stdio and Streamable HTTP).

    validate → requestState (2026 approval answer) → look the tool up → pin check → visible?
      no  → probe the upstream with a name no server has (a hidden tool answers like an unknown one)
    → govern (`Gateway.govern`: the pipeline, the forward, the ledger, the receipt)
    → held for a human? task-augmented → refused (a task cannot wait); where the profile lets the
      caller's tier answer for itself (`approval.allow_elicitation`, off by default) and the client
      can elicit: 2026 → `input_required` with a sealed requestState, legacy → `elicitation/create`;
      otherwise hold with progress (naming who decides, and where) until an approver decides,
      then govern again with the approval
    → the JSON-RPC answer (and the HTTP status it mirrors)

The flow decides; the transport does the I/O through a small `CallPort` (ask the upstream,
forward, notify or elicit the client, session facts), as the official SDK's shared session does.
Bad input, methods MCP does not define and requests a limit refused are recorded here too
(`record_refusal`, `record_passthrough`, `record_limit_refusal`), so both transports write the
same ledger records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import structlog

from gateway.core.backends import Backend
from gateway.core.call import (
    BlockClass,
    Credentials,
    Decision,
    Outcome,
    Status,
    ToolCall,
    ToolInfo,
)
from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway, new_request_id, rfc3339
from gateway.mcp import approval as ap
from gateway.mcp import governance as gov
from gateway.mcp import holding, jsonrpc
from gateway.mcp.jsonrpc import Request
from gateway.mcp.pins import DISTRUSTED, PinState, PinStore, observe_or_distrust
from gateway.policy.compile import CompiledPolicy
from gateway.stages.tier_gate import is_visible, unserved, visible_tools

log = structlog.get_logger()

#: The ledger `stage` of a message refused before the pipeline (malformed input), on every transport.
REFUSAL_STAGE = "mcp"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A transport-level refusal of a `tools/call` (JSON-RPC error), recorded like any decision."""

    code: int
    reason: str
    status: int = 400
    data: Any = None


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """A tool as the upstream listed it: `definition` carries the upstream's own name, `name` is
    the one the client sees (a prefix may differ), `backend` the upstream's id."""

    name: str
    definition: dict[str, Any]
    backend: str
    digest: str | None = None  # `definition_digest(definition)` when the catalog already took it
    #: The catalog's own definition when the gateway itself serves the tool (a python or http
    #: backend): governed as on /v1, with no pin to observe (the operator configured it).
    info: ToolInfo | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """The JSON-RPC answer to the client's `tools/call`, and the HTTP status it mirrors."""

    message: dict[str, Any]
    status: int = 200


@dataclass(slots=True)
class CallSite:
    """Session facts of one `tools/call`: who asks, in which protocol era, what the client can do."""

    credentials: Credentials
    principal: str
    protocol_version: str | None
    modern: bool
    session_id: str | None
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: A gateway-originated request can reach the client and its answer come back (legacy elicitation).
    can_ask_client: bool = True
    #: The named tool group the call came through (`/mcp/{group}`), put on its ledger record.
    group: str | None = None


class Forwarder(Backend, Protocol):
    """The Backend an allowed call goes through; it keeps the upstream's raw answer for rendering."""

    raw_result: Any
    raw_error: dict[str, Any] | None
    status: int


class CallPort(Protocol):
    """What a transport gives the one `tools/call` flow: the I/O, never a decision."""

    def precheck(self, request: Request) -> Refusal | None:
        """Transport rules checked before anything goes upstream (e.g. the 2026 HTTP envelope)."""
        ...

    async def lookup(self, name: str) -> ToolEntry | None:
        """The tool the client calls `name`, refreshing the catalog from the upstream when needed."""
        ...

    def known_names(self) -> Iterable[str]:
        """Every tool name the client has been shown (for the look-alike warning)."""
        ...

    def check(self, request: Request, entry: ToolEntry | None) -> Refusal | None:
        """Transport rules that need the tool's definition (e.g. 2026 HTTP `Mcp-Param` headers)."""
        ...

    async def probe(self, request: Request, params: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        """Send a gateway-originated `tools/call` with `params` upstream (where `request` would
        go): its answer (None when none came) and the HTTP status it came with."""
        ...

    def forwarder(self, request: Request, entry: ToolEntry) -> Forwarder:
        """The Backend that forwards this allowed call upstream, with the client's own id."""
        ...

    async def notify(self, message: dict[str, Any]) -> None:
        """Send a notification to the client on this call's stream."""
        ...

    async def ask_client(self, method: str, params: dict[str, Any], *, timeout: float) -> tuple[jsonrpc.RpcId, dict[str, Any] | None]:
        """Send a gateway-originated request to the client: its id and the answer (None if none in time)."""
        ...

    def holding(self, scope: anyio.CancelScope) -> contextlib.AbstractContextManager[None]:
        """Register `scope` while the call is held, so the client cancelling the call ends the hold."""
        ...


def tool_call(site: CallSite, name: str, arguments: Any, meta: Any, *, method: str = "tools/call") -> ToolCall:
    """The `ToolCall` an MCP message is governed as."""
    return gov.tool_call(name, arguments, meta, request_id=new_request_id(), credentials=site.credentials,
                         method=method, protocol_version=site.protocol_version, session_id=site.session_id, group=site.group)


async def record_refusal(gateway: Gateway, call: ToolCall, error: dict[str, Any]) -> None:
    """Record a message refused before the pipeline (malformed input): a decision like any other."""
    refusal = Decision.block(ErrorCode.INVALID_PARAMS, str(error.get("message")), BlockClass.SAFETY_CONTENT, stage=REFUSAL_STAGE)
    try:
        await gateway.govern(call, render=lambda _o: {"error": error}, refusal=refusal, request={"jsonrpc_error": error})
    except Exception:
        log.exception("mcp.refusal_not_recorded")


async def record_passthrough(gateway: Gateway, site: CallSite, backend: str, method: str) -> None:
    """A request for a method MCP does not define went upstream as is: record that it did."""
    principal = gateway.principal_for(site.credentials)
    entry = _method_entry(gateway, site, principal.id if principal else None, backend, method)
    await _append(gateway, {**entry, "decision": "allow", "status": "forwarded", "stage": "mcp_passthrough"}, method)


async def record_limit_refusal(gateway: Gateway, site: CallSite, method: str, limit: str, *, count: int = 1,
                               since: str | None = None) -> None:
    """Requests refused because a bounded resource was full (open sessions, server processes,
    streams; `limit` names the setting): one record of `count` refusals of `site.principal` (the
    first of them `since` then, when more than one), written directly as a passed-through method's
    is (no pipeline and no receipt: nothing was decided about a tool). `gateway.mcp.refusals`
    decides how many one record stands for."""
    entry = _method_entry(gateway, site, site.principal, None, method)
    extra = {"count": count, "since": since} if count != 1 or since is not None else {}
    await _append(gateway, {**entry, "decision": "deny", "status": "blocked", "stage": REFUSAL_STAGE, "error_code": "rate_limited",
                            "block_class": BlockClass.RATE_LIMIT.value, "limit": limit, **extra}, method)


def _method_entry(gateway: Gateway, site: CallSite, principal: str | None, backend: str | None, method: str) -> dict[str, Any]:
    """The fields every record of a method that is no tool call shares."""
    return {
        "time": rfc3339(time.time()),
        "request_id": new_request_id(),
        "principal": principal,
        "backend": backend,
        "tool": None,
        "method": method,
        "session_id": site.session_id,
        "enforced": True,
        "policy_version": gateway.policy.version,
    }


async def _append(gateway: Gateway, entry: dict[str, Any], method: str) -> None:
    try:
        await gateway.ledger.append(entry)
    except Exception as exc:
        log.error("ledger.append_failed", method=method, error=str(exc))


@dataclass(slots=True)
class _Probe:
    name: str = ""
    template: dict[str, Any] | None = None
    status: int | None = None


#: The outcomes of a held call that nobody decided: their answer says who decides it, and where.
_UNDECIDED = frozenset({ErrorCode.APPROVAL_TIMEOUT, ErrorCode.APPROVAL_REQUIRED})



class ToolsCall:
    """The `tools/call` flow of one MCP endpoint (see the module docstring)."""

    def __init__(self, gateway: Gateway, pins: PinStore, sealer: ap.StateSealer, *, hold_seconds: float,
                 progress_interval: float, over_http: bool) -> None:
        self.gateway = gateway
        self.pins = pins
        self.sealer = sealer
        self.hold_seconds = hold_seconds
        self.progress_interval = progress_interval
        self.over_http = over_http  # where a held call can be decided, as the client is told (`ap.deciders`)

    async def refuse(self, site: CallSite, req: Request, name: str, refusal: Refusal) -> Answer:
        error = jsonrpc.error(req.id, refusal.code, refusal.reason, refusal.data)
        await record_refusal(self.gateway, tool_call(site, name, None, None), error["error"])
        return Answer(error, refusal.status)

    async def __call__(self, port: CallPort, site: CallSite, req: Request) -> Answer | None:
        """Govern one `tools/call`; None when the client cancelled it while it was held."""
        params = req.params if isinstance(req.params, dict) else None
        name = params.get("name") if params is not None else None
        if params is None or not isinstance(name, str) or not name:
            return await self.refuse(site, req, "", Refusal(jsonrpc.INVALID_PARAMS, "Invalid params: tools/call needs `name`, a non-empty string"))
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return await self.refuse(site, req, name, Refusal(
                jsonrpc.INVALID_PARAMS, f"Invalid params: `arguments` must be an object, not {jsonrpc.kind(arguments)}"))
        refused = port.precheck(req)
        if refused is not None:
            return await self.refuse(site, req, name, refused)
        entry = await port.lookup(name)
        refused = port.check(req, entry)
        if refused is not None:
            return await self.refuse(site, req, name, refused)
        approval_id: str | None = None
        policy = self.gateway.policy
        principal = self.gateway.principal_for(site.credentials)
        tier = principal.tier if principal is not None else None
        state = params.get("requestState")
        if isinstance(state, str) and state.startswith(ap.STATE_PREFIX):
            opened = await holding.apply_state(self.gateway, self.sealer, params, principal=site.principal, tier=tier,
                                               tool=name, arguments=arguments, now=time.time())
            if isinstance(opened, tuple):
                return await self.refuse(site, req, name, Refusal(jsonrpc.INVALID_PARAMS, opened[0]))
            approval_id = opened
            params = ap.strip_state(params)
            req = Request(req.id, req.method, params, {**req.message, "params": params})
        info: ToolInfo | None = None
        catalog = frozenset(port.known_names())
        if entry is not None and name in gov.colliding_names(catalog):
            entry = None  # two tools fold to this name: neither is callable (policy.names)
        if entry is not None and entry.info is not None:
            info = entry.info
        elif entry is not None:
            known = None if entry.digest is None else [entry.digest]
            pin = (await observe_or_distrust(self.pins, entry.backend, [entry.definition], known)).get(entry.definition["name"], DISTRUSTED)
            info = self._tool_info(entry, name, pin, catalog)
        visible = info is not None and principal is not None and is_visible(policy, principal, info)
        probe = _Probe()
        if not visible and principal is not None:
            alike = gov.lookalike_of(name, catalog)
            if alike is not None:
                log.warning("mcp.lookalike_tool_name", name=name, imitates=alike)
            probe.name = gov.probe_name()
            probe.template, probe.status = await port.probe(req, _probe_params(params, probe.name))
        call = tool_call(site, name, arguments, params.get("_meta"))
        if approval_id is not None:
            call = dataclasses.replace(call, approval_id=approval_id)
        task = visible and gov.runs_as_task(params, modern=site.modern)
        refusal = gov.task_refusal(name) if task and gov.task_conflicts(policy, name) else None
        if entry is None and self.gateway.served(name) is not None:
            refusal = unserved(name)  # the catalog has it, this endpoint (a group) does not serve it: unknown
        elicit = ap.can_elicit(site.capabilities) and policy.elicitation_allowed(tier)  # else only an approver decides
        mrtr = site.modern and elicit
        forward = port.forwarder(req, entry) if entry is not None and info is not None else None
        outcome, answer = await self._govern(site, req, call, info, forward, probe, refusal, mrtr=mrtr, policy=policy)
        if outcome.status is not Status.PENDING_APPROVAL or not outcome.approval_id or mrtr:
            return answer
        if task:
            await self.gateway.approvals.expire(outcome.approval_id)  # a task cannot wait for a human
            call = dataclasses.replace(call, request_id=new_request_id())
            return (await self._govern(site, req, call, info, forward, probe, gov.task_refusal(name), policy=policy))[1]
        if not await self._wait_for_approval(port, site, req, outcome, name, arguments, elicit=elicit, tier=tier):
            return None
        call = dataclasses.replace(call, approval_id=outcome.approval_id, request_id=new_request_id())
        forward = port.forwarder(req, entry) if entry is not None and info is not None else None
        note = "" if elicit and not site.modern and site.can_ask_client else self._held_note(outcome.approval_id)
        return (await self._govern(site, req, call, info, forward, probe, policy=policy, note=note))[1]  # the policy that held it

    def _held_note(self, approval_id: str) -> str:
        """What the answer to a call that waited for an approver adds: how long, who decides, where."""
        return f"It was held {self.hold_seconds:g}s for a human. {ap.deciders(approval_id, over_http=self.over_http)}"

    def _tool_info(self, entry: ToolEntry, name: str, pin: PinState, names: frozenset[str]) -> ToolInfo:
        """`gov.tool_info` of the definition the client calls `name` (a prefixed name's renamed
        definition has its own digest)."""
        same_name = entry.definition["name"] == name
        return gov.tool_info({**entry.definition, "name": name}, entry.backend, changed=pin.changed,
                             digest=entry.digest if same_name else None, accepted=pin.accepted, names=names)

    async def _govern(self, site: CallSite, req: Request, call: ToolCall, info: ToolInfo | None, forward: Forwarder | None,
                      probe: _Probe, refusal: Decision | None = None, *, mrtr: bool = False,
                      policy: CompiledPolicy | None = None, note: str = "") -> tuple[Outcome, Answer]:
        """Govern the call once. With `mrtr` (a 2026 client that can elicit) a hold becomes an
        `input_required` result carrying the gateway's sealed `requestState`, and nothing waits.
        `note` is added to the text of a refusal that names an approval (who decides it, where)."""
        rendered: dict[str, Any] = {}

        def render(outcome: Outcome) -> dict[str, Any]:
            if mrtr and outcome.status is Status.PENDING_APPROVAL and outcome.approval_id:
                body = self.sealer.input_required(
                    outcome, principal=site.principal, tool=call.tool, arguments=call.arguments,
                    expires=time.time() + self.hold_seconds * 6,
                    decision_meta={gov.DECISION_META_KEY: gov.decision_meta(outcome)})
                rendered.update(kind="result", body=body, status=200)
                return body
            kind, body = gov.render_outcome(
                outcome, raw_result=forward.raw_result if forward else None, raw_error=forward.raw_error if forward else None,
                tool=info, modern=site.modern, unknown_template=probe.template, probe=probe.name,
                no_information=[r.no_information_response for r in self.gateway.policy.disclosure_rules_for(call.tool)],
                note=note if outcome.error_code in _UNDECIDED else "")
            rendered.update(kind=kind, body=body, status=_status(outcome, kind, forward, probe, site.modern))
            return body

        params = req.params if isinstance(req.params, dict) else {}
        governed = await self.gateway.govern(call, render=render, request={"method": "tools/call", "params": params},
                                             refusal=refusal, tool=info, backend=forward, policy=policy)
        outcome = governed.outcome
        if rendered.get("kind") == "error":
            return outcome, Answer({"jsonrpc": "2.0", "id": req.id, "error": rendered["body"]["error"]}, rendered["status"])
        if "body" not in rendered:  # nothing was rendered: answer with the outcome as a refusal
            return outcome, Answer(jsonrpc.result(req.id, gov.refusal_result(outcome, modern=site.modern)))
        return outcome, Answer(jsonrpc.result(req.id, gov.with_receipt(rendered["body"], outcome.receipt)), rendered["status"])

    async def _wait_for_approval(self, port: CallPort, site: CallSite, req: Request, outcome: Outcome, name: str,
                                 arguments: Any, *, elicit: bool, tier: str | None) -> bool:
        """Wait for a human: the client's elicitation answer (legacy, where the policy lets the
        caller's tier answer for itself: `elicit`) or an approver (UI, CLI, HTTP) with progress
        notifications naming who decides and where meanwhile. False when the client cancelled the call."""
        approval_id = outcome.approval_id
        assert approval_id is not None
        log.warning("approval.pending", approval_id=approval_id, tool=name, reason=outcome.message,
                    hint=f"dharma approvals approve {approval_id}")
        meta = (req.params if isinstance(req.params, dict) else {}).get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        scope = anyio.CancelScope()
        with port.holding(scope), scope:
            if not site.modern and site.can_ask_client and elicit:
                form = ap.approval_form(outcome, name, arguments, version=site.protocol_version)
                rid, response = await port.ask_client("elicitation/create", form, timeout=self.hold_seconds)
                if response is None:
                    await port.notify(jsonrpc.notification(
                        "notifications/cancelled", {"requestId": rid, "reason": "approval timed out"}))
                verdict = ap.accepted(response.get("result")) if response is not None else None
                await holding.settle(self.gateway, approval_id, verdict, by=site.principal, tier=tier)
            else:
                await holding.hold(self.gateway, approval_id, token, port.notify, seconds=self.hold_seconds,
                                   interval=self.progress_interval, where=ap.deciders(approval_id, over_http=self.over_http))
        if scope.cancelled_caught:
            log.info("approval.hold_dropped", approval_id=approval_id, reason="client cancelled")
            with anyio.CancelScope(shield=True):
                await self.gateway.approvals.expire(approval_id)
            return False
        return True


def _probe_params(params: dict[str, Any], probe: str) -> dict[str, Any]:
    """The call's params asking about `probe` instead: no arguments, no approval state, no progress token."""
    out = {k: v for k, v in params.items() if k not in ("requestState", "inputResponses")}
    out["name"] = probe
    out["arguments"] = {}
    meta = out.get("_meta")
    if isinstance(meta, dict):
        out["_meta"] = {k: v for k, v in meta.items() if k != "progressToken"}
    return out


def _status(outcome: Outcome, kind: str, forward: Forwarder | None, probe: _Probe, modern: bool) -> int:
    """The HTTP status a rendered answer mirrors: the upstream's, for its own errors and unknown tools."""
    default = 400 if modern else 200
    if outcome.error_code is ErrorCode.TOOL_NOT_FOUND:
        if probe.status is not None and (kind == "result" or probe.template is not None):
            return probe.status
        return default
    if kind == "error" and forward is not None and forward.status >= 400:
        return forward.status
    return 200


@contextlib.contextmanager
def registered(holds: dict[Any, anyio.CancelScope], key: Any, scope: anyio.CancelScope) -> Iterator[None]:
    """Keep `scope` in `holds` under `key` for the duration (a transport's `CallPort.holding`)."""
    holds[key] = scope
    try:
        yield
    finally:
        if holds.get(key) is scope:
            del holds[key]


# ---- tools/list: the same decision that gates calls filters listings ------------------------


async def visible_names(gateway: Gateway, pins: PinStore, credentials: Credentials, backend: str,
                  named: list[tuple[str, dict[str, Any]]], names: Iterable[str] | None = None) -> set[str]:
    """The client names among `named` (client name, definition as the upstream sent it) that the
    caller may see; observing the definitions against their pins on the way (a changed one is
    `tool.changed` to the rules that decide) and scanning them (`tool.findings`; `names` are the
    tools the client may be shown, as the call flow's `CallPort.known_names`)."""
    principal = gateway.principal_for(credentials)
    if principal is None:
        return set()
    pins_now = await observe_or_distrust(pins, backend, [t for _, t in named])
    known = frozenset(names if names is not None else (c for c, _ in named))
    infos = []
    for cname, t in named:
        pin = pins_now.get(t["name"], DISTRUSTED)
        infos.append(gov.tool_info({**t, "name": cname}, backend, changed=pin.changed, accepted=pin.accepted, names=known))
    refused = gov.colliding_names(frozenset(c for c, _ in named) | known)
    return {t.name for t in visible_tools(gateway.policy, principal, infos) if t.name not in refused}


async def refresh_catalog(ask_page: Callable[[dict[str, Any] | None], Awaitable[dict[str, Any] | None]],
                          record: Callable[[list[dict[str, Any]], bool], None], pins: PinStore, backend: str,
                          meta: dict[str, Any] | None) -> None:
    """Load every page of an upstream's `tools/list` (gateway-originated) into a catalog.

    `ask_page(params)` returns a page's result (None when the upstream did not answer);
    `record(tools, first_page)` keeps them; `meta` (2026) carries the client's protocol keys.
    """
    params: dict[str, Any] = {}
    if meta is not None:
        params["_meta"] = {k: v for k, v in meta.items() if k.startswith("io.modelcontextprotocol/")}
    cursor: str | None = None
    first = True
    for _ in range(100):
        page = dict(params)
        if cursor:
            page["cursor"] = cursor
        result = await ask_page(page or None)
        if not isinstance(result, dict):
            return
        tools = listed_tools(result)
        record(tools, first)
        await observe_or_distrust(pins, backend, tools)
        first = False
        cursor = result.get("nextCursor") if isinstance(result.get("nextCursor"), str) else None
        if not cursor:
            return


def listed_tools(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The well-formed tool definitions of a `tools/list` result."""
    return [t for t in result.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
