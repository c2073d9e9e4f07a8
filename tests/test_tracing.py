"""OpenTelemetry spans: with `tracing.otel` on, a governed call is a span named and attributed per
the MCP/GenAI semantic conventions, a child of the `traceparent` the client sent in `_meta`, and the
context sent upstream is the span's own. Off, nothing of OpenTelemetry is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.config import Settings
from gateway.core.call import Credentials, ToolCall
from gateway.mcp.governance import tool_call
from gateway.runtime import open_gateway
from tests.conftest import KEYS, REPO, write_policy
from tests.helpers import Recorder
from tests.mcp_http.conftest import client, serve_gateway, toy_server, upstream

EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(PROVIDER)  # once per process: the API refuses a second provider
PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{PARENT_TRACE}-b7ad6b7169203331-01"


async def test_a_governed_call_is_a_span_child_of_the_clients_traceparent(tmp_path: Path) -> None:
    EXPORTER.clear()
    seen: dict[str, Any] = {}
    recorder = Recorder()
    policy = write_policy(tmp_path / "policy")
    settings = Settings(policy=policy, state_root=tmp_path / "state", tracing={"otel": True})
    gateway = await open_gateway(settings, backends=[recorder.backend({
        "read_file": lambda path: seen.update(upstream=gateway.tracer.outgoing()) or {"read": path}})])
    try:
        meta = {"traceparent": TRACEPARENT, "progressToken": 1}
        call = tool_call_for("read_file", {"path": "a"}, meta)
        assert call.trace_context == {"traceparent": TRACEPARENT}
        governed = await gateway.govern(call)
        assert governed.outcome.status.value == "ok"
        denied = await gateway.govern(tool_call_for("read_file", {"path": "../x"}, {}))
        assert denied.outcome.error_code.value == "policy_blocked"
    finally:
        await gateway.aclose()
    spans = EXPORTER.get_finished_spans()
    assert [s.name for s in spans] == ["tools/call read_file", "tools/call read_file"]
    ok, refused = spans
    assert ok.kind is trace.SpanKind.SERVER
    assert format(ok.context.trace_id, "032x") == PARENT_TRACE and ok.parent is not None
    attrs = dict(ok.attributes or {})
    assert attrs["mcp.method.name"] == "tools/call" and attrs["gen_ai.tool.name"] == "read_file"
    assert attrs["gen_ai.operation.name"] == "execute_tool" and attrs["mcp.session.id"] == "sess-1"
    assert attrs["dharma.decision"] == "allow" and attrs["dharma.ledger.seq"] == governed.outcome.ledger_seq
    assert attrs["dharma.policy.version"] == gateway.policy.version
    # what the gateway sends upstream names its own span, in the client's trace
    assert seen["upstream"]["traceparent"].split("-")[1:3] == [PARENT_TRACE, format(ok.context.span_id, "016x")]
    assert refused.parent is None and dict(refused.attributes or {})["dharma.error_code"] == "policy_blocked"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_call_forwarded_over_mcp_http_carries_the_gateways_span_upstream(tmp_path: Path, mode: str) -> None:
    """End to end on `/mcp`: the official SDK client (traced itself) sends its span's context in
    `_meta`; the gateway's span is that span's child, and the real upstream receives a traceparent
    in the client's trace whose parent is the gateway's span (not the client's, passed through)."""
    EXPORTER.clear()
    with toy_server(tmp_path) as (toy_url, _):
        async with serve_gateway(tmp_path, [upstream(toy_url)], config={"tracing": {"otel": True}}) as gw:
            async with client(gw.url, "alice-key", mode=mode) as c:
                with trace.get_tracer("agent").start_as_current_span("agent turn") as agent:
                    answer = await c.call_tool("read_meta", {})
    assert not answer.is_error, answer
    received = json.loads(answer.content[0].text)
    client_trace = format(agent.get_span_context().trace_id, "032x")
    spans = EXPORTER.get_finished_spans()
    gateway_spans = [s for s in spans if s.instrumentation_scope.name == "dharma-gateway"]
    assert [s.name for s in gateway_spans] == ["tools/call read_meta"], [s.name for s in spans]
    span = gateway_spans[0]
    assert span.kind is trace.SpanKind.SERVER and format(span.context.trace_id, "032x") == client_trace
    client_span = next(s for s in spans if span.parent is not None and s.context.span_id == span.parent.span_id)
    assert client_span.kind is trace.SpanKind.CLIENT and client_span.parent.span_id == agent.get_span_context().span_id
    version, trace_id, parent_id, _flags = received["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", client_trace, format(span.context.span_id, "016x"))


def tool_call_for(name: str, arguments: Any, meta: dict[str, Any]) -> ToolCall:
    """The call as the MCP flow builds it from a `tools/call` (its `_meta` read as on the wire)."""
    return tool_call(name, arguments, meta, request_id="req_t", credentials=Credentials(api_key=KEYS["reader"]),
                     method="tools/call", protocol_version="2025-11-25", session_id="sess-1")


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """Free when off: a gateway opened and a call governed without `tracing.otel` loads no OpenTelemetry module."""
    policy = write_policy(tmp_path / "policy")
    script = f"""
import asyncio, sys
from gateway.runtime import open_gateway
import gateway.transports.http_api.app, gateway.transports.mcp_stdio.proxy
from tests.helpers import Recorder
from tests.mcp_http.conftest import client, serve_gateway, toy_server, upstream
async def main():
    gw = await open_gateway(policy={str(policy)!r}, state_root={str(tmp_path / 'state')!r},
                            backends=[Recorder().backend({{"read_file": lambda path: {{"read": path}}}})])
    out = await gw.call("read_file", {{"path": "a"}}, api_key={KEYS['reader']!r})
    await gw.aclose()
    assert out.status.value == "ok", out
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
    assert not loaded and gw.tracer is None, loaded
asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
