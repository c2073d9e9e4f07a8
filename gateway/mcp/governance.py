"""MCP-specific governance shared by the stdio and HTTP transports. Pure: no I/O.

- `tools/list`: filtered per principal with the same compiled policy that gates `tools/call`
  (`visible_tools`), order kept, `nextCursor` kept, `cacheScope: "private"` on 2026 results.
- Tool names: only an exact match of a listed name is a tool. A name that differs by case,
  Unicode compatibility form (NFKC) or look-alike characters is unknown, like any other
  unknown name (`lookalike_of` only names the tool it imitates, for the log).
- Rendering a governed outcome as the JSON-RPC answer to `tools/call`:
  refusal → `{content:[text], isError:true, _meta:{"dharma.gateway/decision": {...}}}`;
  hidden or unknown tool → exactly what the backend answers for an unknown tool (the transport
  asks the backend about a random name that cannot exist and substitutes the requested name,
  so hidden and unknown are answered by the same code path, byte for byte);
  allowed → the backend's result, with the receipt merged into `result._meta`.
- Redaction keeps `structuredContent` valid against the tool's `outputSchema`, or the result
  becomes `isError`. WITHHOLD returns the configured no-information result as configured.
"""

from __future__ import annotations

import copy
import functools
import secrets
import unicodedata
from collections.abc import Sequence
from typing import Any

import structlog

from audit.canon import digest
from gateway.core.backends import BackendResult
from gateway.core.call import BlockClass, Credentials, Decision, Effect, Finding, Outcome, Status, ToolCall, ToolInfo
from gateway.core.errors import CallError, ErrorCode
from gateway.core.gateway import CallTracer
from gateway.mcp import jsonrpc
from gateway.mcp.versions import HEADER_MISMATCH
from gateway.memo import Memo
from gateway.policy.compile import CompiledPolicy
from gateway.policy.names import collisions, fold_name
from gateway.stages.sanitizer.walk import SanitizeError, compile_schema
from gateway.crypto.receipts import RECEIPT_META_KEY

log = structlog.get_logger()

DECISION_META_KEY = "dharma.gateway/decision"
PURPOSE_META_KEY = "dharma.gateway/purpose"
PROBE_PREFIX = "dharmaGatewayNoSuchTool"

# Characters that render like Latin letters (the common Cyrillic and Greek confusables).
_CONFUSABLES = str.maketrans(
    {
        "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s",
        "ԁ": "d", "ɡ": "g", "һ": "h", "ⅼ": "l", "ո": "n", "ս": "u", "ԝ": "w", "ᴠ": "v",
        "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T",
        "Х": "X", "У": "Y", "І": "I", "Ј": "J", "Ѕ": "S",
        "α": "a", "ο": "o", "ρ": "p", "ν": "v", "ι": "i", "κ": "k", "τ": "t", "υ": "u",
        "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
        "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    }
)


def skeleton(name: str) -> str:
    """A comparison key under which look-alike names collide (NFKC, confusables, case, and the
    separator styles tool globs treat as one: `policy.names.fold_name`)."""
    return fold_name(unicodedata.normalize("NFKC", name).translate(_CONFUSABLES))


@functools.lru_cache(maxsize=64)
def colliding_names(catalog: frozenset[str]) -> dict[str, str]:
    """The catalog's tools that fold to one name with another of its tools (`get_sum` beside
    `get-sum`): a glob could not tell them apart while pins, approvals and the ledger do, so neither
    is listed or callable (refused, and said once per catalog in the log)."""
    found = collisions(sorted(catalog))
    if found:
        log.error("mcp.tool_name_collision", tools=sorted(found),
                  message="tools whose names differ only in case or separators are refused; rename one upstream's tool or give it a prefix")
    return found


def lookalike_of(name: str, names: list[str] | set[str] | frozenset[str] | dict[str, Any]) -> str | None:
    """The listed tool `name` imitates (same skeleton, different spelling), or None."""
    if name in names:
        return None
    key = skeleton(name)
    for other in names:
        if skeleton(other) == key:
            return other
    return None


def probe_name() -> str:
    """A tool name no backend has: asked in place of a hidden or unknown name."""
    return PROBE_PREFIX + secrets.token_hex(8)


# ---- tool definitions -------------------------------------------------------------------


def definition_digest(tool: dict[str, Any]) -> str:
    """Digest of what a model is shown about a tool: pinned, and recorded in the ledger."""
    return digest(
        {
            "name": tool.get("name"),
            "title": tool.get("title"),
            "description": tool.get("description"),
            "inputSchema": tool.get("inputSchema"),
            "outputSchema": tool.get("outputSchema"),
            "annotations": tool.get("annotations"),
        }
    )


_FINDINGS: Memo[tuple[str, frozenset[str]], tuple[Finding, ...]] = Memo(4096)


def definition_findings(tool: dict[str, Any], digest: str, names: frozenset[str] = frozenset()) -> tuple[Finding, ...]:
    """The definition scan's findings (`tool.findings`), taken once per definition digest and set of
    other tool names (`names`: the tools the same upstream lists, for `tool_reference`)."""
    key = (digest, names)
    hit = _FINDINGS.get(key)
    if hit is None:
        from gateway.stages.sanitizer.instructions import scan_definition  # compiled on first use, not at start-up

        hit = _FINDINGS.remember(key, scan_definition(tool, names))
    return hit


def tool_info(tool: dict[str, Any], backend: str, *, changed: bool = False, digest: str | None = None,
              accepted: bool = False, names: frozenset[str] | None = None) -> ToolInfo:
    """The gateway's view of an MCP tool definition; `digest` is its `definition_digest` if already taken.

    With `names` (the other tools of its upstream) the definition is scanned (`findings`, cached
    per digest); `accepted` says an operator accepted exactly this definition."""
    annotations = tool.get("annotations")
    schema = tool.get("inputSchema")
    output = tool.get("outputSchema")
    description = tool.get("description")
    taken = definition_digest(tool) if digest is None else digest
    return ToolInfo(
        name=tool["name"],
        backend=backend,
        description=description if isinstance(description, str) else "",
        annotations=dict(annotations) if isinstance(annotations, dict) else {},
        input_schema=schema if isinstance(schema, dict) else None,
        output_schema=output if isinstance(output, dict) else None,
        digest=taken,
        changed=changed,
        findings=definition_findings(tool, taken, names) if names is not None else (),
        accepted=accepted,
    )


def filter_list_result(result: dict[str, Any], visible: set[str], *, modern: bool) -> dict[str, Any]:
    """The `tools/list` result with only `visible` tools, order and every other field kept."""
    tools = result.get("tools")
    out = dict(result)
    if isinstance(tools, list):
        out["tools"] = [t for t in tools if isinstance(t, dict) and t.get("name") in visible]
    if modern:
        out["cacheScope"] = "private"
    return out


# ---- answers to tools/call ---------------------------------------------------------------


def decision_meta(outcome: Outcome) -> dict[str, Any]:
    d = outcome.decision
    meta: dict[str, Any] = {
        "error_code": outcome.error_code.value if outcome.error_code else None,
        "retryable": outcome.retryable,
        "status": outcome.status.value,
        "request_id": outcome.request_id,
    }
    if d.block_class is not None:
        meta["block_class"] = d.block_class.value
    if d.rule_ids:
        meta["rules"] = list(d.rule_ids)
    if d.retry_after is not None:
        meta["retry_after"] = d.retry_after
    if outcome.approval_id:
        meta["approval_id"] = outcome.approval_id
    return meta


_ADVICE = {
    ErrorCode.POLICY_BLOCKED: "Do not retry this call as is; change the request or ask the user.",
    ErrorCode.FORBIDDEN: "This caller may not use this tool this way; do not retry.",
    ErrorCode.PURPOSE_REQUIRED: "Retry with a purpose in params._meta[\"dharma.gateway/purpose\"].",
    ErrorCode.RATE_LIMITED: "Wait before retrying.",
    ErrorCode.INVALID_PARAMS: "Fix the arguments and call again.",
    ErrorCode.APPROVAL_REQUIRED: "A human must approve this call; tell the user and retry once approved.",
    ErrorCode.APPROVAL_DENIED: "A human declined this call; do not retry it.",
    ErrorCode.APPROVAL_TIMEOUT: "Nobody approved this call in time; ask the user before retrying.",
    ErrorCode.BACKEND_UNAVAILABLE: "The tool server is unavailable; retry later.",
    ErrorCode.TIMEOUT: "The tool server did not answer in time; retry later.",
    ErrorCode.BACKEND_ERROR: "The tool server failed; retry later or try another approach.",
}


def refusal_result(outcome: Outcome, *, modern: bool, note: str = "") -> dict[str, Any]:
    """A refused (or failed) call as a normal tool result the model can read and act on; `note`
    (e.g. who decides a held call, and where) goes between the message and the advice."""
    code = outcome.error_code or ErrorCode.INTERNAL_ERROR
    message = outcome.message or code.value.replace("_", " ")
    advice = _ADVICE.get(code, "")
    verb = "Blocked by Dharma Gateway policy" if outcome.status is not Status.ERROR else "Dharma Gateway could not complete the call"
    text = f"{verb} ({code.value}): {message}"
    if note:
        text = f"{text.rstrip('.')}. {note}"
    text += f" {advice}" if advice else ""
    body: dict[str, Any] = {
        "content": [{"type": "text", "text": text}],
        "isError": True,
        "_meta": {DECISION_META_KEY: decision_meta(outcome)},
    }
    if modern:
        body["resultType"] = "complete"
    return body


def unknown_tool_answer(template: dict[str, Any] | None, probe: str, name: str) -> dict[str, Any]:
    """The backend's answer about `probe` with `name` in its place (or -32602 "Unknown tool")."""
    if template is None or ("result" not in template and "error" not in template):
        return {"error": {"code": jsonrpc.INVALID_PARAMS, "message": f"Unknown tool: {name}"}}
    body = {k: template[k] for k in ("result", "error") if k in template}
    return _substitute(body, probe, name)  # type: ignore[no-any-return]


def _substitute(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {_substitute(k, old, new): _substitute(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, old, new) for v in value]
    return value


def with_receipt(result: dict[str, Any], token: str | None) -> dict[str, Any]:
    """The result with the receipt merged into `_meta` (other keys kept)."""
    if token is None:
        return result
    meta = result.get("_meta")
    merged = dict(meta) if isinstance(meta, dict) else {}
    merged[RECEIPT_META_KEY] = token
    return {**result, "_meta": merged}


def as_call_result(value: Any, *, modern: bool) -> dict[str, Any]:
    """A configured value (e.g. a no-information response) made into a CallToolResult if it is not one."""
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        out = value
    else:
        text = value if isinstance(value, str) else jsonrpc.dumps(value).decode()
        out = {"content": [{"type": "text", "text": text}]}
    if modern and "resultType" not in out:
        out = {**out, "resultType": "complete"}
    return out


def mirror_structured(result: dict[str, Any], original: Any) -> dict[str, Any]:
    """After redaction: rewrite a text block that mirrored the original structuredContent as JSON."""
    if not isinstance(original, dict) or "structuredContent" not in result:
        return result
    before = original.get("structuredContent")
    after = result["structuredContent"]
    content = result.get("content")
    if before == after or not isinstance(content, list):
        return result
    blocks = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            try:
                mirrored = jsonrpc.loads(block["text"]) == before
            except ValueError:
                mirrored = False
            if mirrored:
                block = {**block, "text": jsonrpc.dumps(after).decode()}
        blocks.append(block)
    return {**result, "content": blocks}


def check_structured(result: dict[str, Any], tool: ToolInfo | None, *, modern: bool) -> dict[str, Any]:
    """After redaction: keep a result whose structuredContent still fits outputSchema, else isError."""
    if tool is None or tool.output_schema is None or result.get("isError"):
        return result
    if "structuredContent" in result:
        try:
            compile_schema(tool.output_schema).validate(result["structuredContent"])
            return result
        except SanitizeError as exc:
            problem = exc.message
        except Exception as exc:  # an unusable schema: do not claim the result is valid
            problem = f"outputSchema unusable: {exc}"

    else:
        problem = "structuredContent was removed"
    body: dict[str, Any] = {
        "content": [{"type": "text", "text": (
            "Dharma Gateway redacted part of this tool's result, and the redacted result no longer "
            f"matches the tool's output schema ({problem}). The result is withheld; ask the user "
            "for another way to get what you need.")}],
        "isError": True,
        "_meta": {DECISION_META_KEY: {"error_code": None, "retryable": False, "status": "redacted"}},
    }
    if modern:
        body["resultType"] = "complete"
    return body


def copy_result(value: Any) -> Any:
    return copy.deepcopy(value)


def render_outcome(
    outcome: Outcome,
    *,
    raw_result: Any,
    raw_error: dict[str, Any] | None,
    tool: ToolInfo | None,
    modern: bool,
    unknown_template: dict[str, Any] | None,
    probe: str,
    no_information: Sequence[Any],
    note: str = "",
) -> tuple[str, dict[str, Any]]:
    """Render a governed `tools/call` outcome as the client's answer (receipt not yet added).

    Returns ("result", CallToolResult) or ("error", {"error": ...}). A hidden or unknown tool gets
    the backend's own unknown-tool answer (`unknown_template`, its reply about `probe`); an
    allowed result the pipeline rewrote keeps its mirrored text and `outputSchema` consistent;
    the backend's own JSON-RPC error passes on as it came.

    Args:
        raw_result: the backend's result before the pipeline (to tell a rewritten one apart).
        raw_error: the backend's JSON-RPC error object, if it answered with one.
        no_information: the no-information responses of the tool's disclosure rules (WITHHOLD).
        note: added to a refusal's text (`refusal_result`).
    """
    if outcome.error_code is ErrorCode.TOOL_NOT_FOUND:
        answer = unknown_tool_answer(unknown_template, probe, outcome.tool)
        if "error" in answer:
            return "error", {"error": answer["error"]}
        return "result", answer["result"]
    if outcome.status is Status.OK:
        result = outcome.result
        if result is not raw_result:
            if any(result == v for v in no_information):
                return "result", as_call_result(result, modern=modern)
            if isinstance(result, dict):
                return "result", check_structured(mirror_structured(result, raw_result), tool, modern=modern)
        if isinstance(result, dict):
            return "result", result
        return "result", as_call_result(result, modern=modern)
    if outcome.status is Status.ERROR and raw_error is not None:
        return "error", {"error": raw_error}
    return "result", refusal_result(outcome, modern=modern, note=note)


class BackendRpcError(CallError):
    """The backend answered a call with a JSON-RPC error; `error` is that object, to pass on as it came."""

    def __init__(self, error: dict[str, Any]) -> None:
        code = error.get("code")
        mapped = ErrorCode.INVALID_PARAMS if code in _CLIENT_FAULTS else ErrorCode.BACKEND_ERROR
        super().__init__(mapped, f"the MCP server answered error {code}: {error.get('message')}")
        self.error = error


#: Backend error codes that mean the call itself was wrong (not that the backend failed).
_CLIENT_FAULTS = frozenset({jsonrpc.INVALID_REQUEST, jsonrpc.METHOD_NOT_FOUND, jsonrpc.INVALID_PARAMS, HEADER_MISMATCH})


def backend_result(response: dict[str, Any]) -> BackendResult:
    """The backend's JSON-RPC answer to a forwarded call as a `BackendResult`.

    Raises:
        BackendRpcError: the answer is a JSON-RPC error.
    """
    if "error" in response:
        error = response["error"]
        raise BackendRpcError(error if isinstance(error, dict) else {"code": jsonrpc.INTERNAL_ERROR, "message": str(error)})
    result = response.get("result")
    return BackendResult(result, is_error=isinstance(result, dict) and bool(result.get("isError")))


class AnswerRecorder:
    """The part of a transport's Backend adapter that both transports share: it keeps the backend's
    raw answer (`raw_result` / `raw_error`) so `render_outcome` can tell what the pipeline changed."""

    def __init__(self) -> None:
        self.raw_result: Any = None
        self.raw_error: dict[str, Any] | None = None

    def tools(self) -> list[ToolInfo]:
        return []

    def record(self, response: dict[str, Any]) -> BackendResult:
        """Keep and convert the backend's answer (`backend_result`), remembering an error object too."""
        try:
            answer = backend_result(response)
        except BackendRpcError as exc:
            self.raw_error = exc.error
            raise
        self.raw_result = answer.result
        return answer

    async def aclose(self) -> None:
        return None


def runs_as_task(params: Any, *, modern: bool) -> bool:
    """Whether a legacy (2025-11-25) `tools/call` asks to run as a task (`params.task`)."""
    return not modern and isinstance(params, dict) and params.get("task") is not None


def task_conflicts(policy: CompiledPolicy, tool: str) -> bool:
    """Whether the policy may redact or withhold `tool`'s result (so it must not run as a task).

    A task's result comes later, from `tasks/result`, past the point where the gateway governs a
    call's answer (notes §3, the v1 advice). Holds are caught when they happen: a task-augmented
    call the pipeline holds for approval is refused instead, since a task cannot wait for a human.
    """
    if policy.disclosure_rules_for(tool):
        return True
    return any(rule.effect is Effect.REDACT for rule in policy.rules_for(tool))


def task_refusal(tool: str) -> Decision:
    """The block for a task-augmented call to a tool the policy may hold or redact."""
    return Decision.block(
        ErrorCode.POLICY_BLOCKED,
        f"Dharma Gateway does not run '{tool}' as a task: the policy may hold this tool for a human's "
        "approval or redact its result, and a task's result would bypass that. Call the tool again "
        "without `task` (a normal call waits for the answer).",
        BlockClass.APPROVAL,
        stage="mcp_tasks",
    )


TRACE_KEYS = ("traceparent", "tracestate")
"""The W3C trace-context keys an MCP request carries in `params._meta` (read when tracing is on)."""


def with_trace_context(message: dict[str, Any], tracer: CallTracer | None) -> dict[str, Any]:
    """`message` (a request forwarded upstream) with the current span's trace context in its
    `params._meta`, so the MCP server's span is a child of the gateway's; unchanged when tracing is off."""
    if tracer is None:
        return message
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    return {**message, "params": {**params, "_meta": {**meta, **tracer.outgoing()}}}


def tool_call(name: str, arguments: Any, meta: Any, *, request_id: str, credentials: Credentials, method: str,
              protocol_version: str | None, session_id: str | None, group: str | None = None) -> ToolCall:
    """The `ToolCall` an MCP `tools/call` (or a refused message, `method`) is governed as.

    The purpose comes from `_meta["dharma.gateway/purpose"]` when the client gave a string.
    """
    purpose = meta.get(PURPOSE_META_KEY) if isinstance(meta, dict) else None
    traced = {k: meta[k] for k in TRACE_KEYS if isinstance(meta.get(k), str)} if isinstance(meta, dict) else None
    return ToolCall(
        tool=name,
        arguments=arguments,
        request_id=request_id,
        credentials=credentials,
        purpose=purpose if isinstance(purpose, str) else None,
        method=method,
        protocol_version=protocol_version,
        session_id=session_id,
        trace_context=traced or None,
        group=group,
    )
