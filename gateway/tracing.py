"""OpenTelemetry spans for governed calls (`tracing: {otel: true}`, the `otel` extra).

Off by default, and then this module is never imported (nor is OpenTelemetry): the gateway's
`tracer` is None and a call pays one attribute check. On, each governed call is a SERVER span
following the MCP and GenAI semantic conventions (Development status, 2026): name
`{mcp.method.name} {gen_ai.tool.name}`, attributes `mcp.method.name`, `gen_ai.tool.name`,
`gen_ai.operation.name` (`execute_tool`), `mcp.session.id`, `mcp.protocol.version`, plus the
gateway's decision (`dharma.decision`, `dharma.error_code`, `dharma.policy.version`,
`dharma.ledger.seq`). Its parent is the trace context the client sent in the request's `_meta`
(`traceparent`, `tracestate`, as the MCP conventions propagate it), and a call forwarded to an
MCP server carries the span's own context in `_meta` in turn. Spans go to whatever
TracerProvider the process configured (the OpenTelemetry SDK and its exporters are the operator's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gateway.core.call import Outcome, ToolCall
from gateway.mcp.governance import TRACE_KEYS


class OtelTracer:
    """The gateway's `CallTracer` on the OpenTelemetry API."""

    def __init__(self) -> None:
        from opentelemetry import propagate, trace

        self._trace = trace
        self._propagate = propagate
        self._tracer = trace.get_tracer("dharma-gateway")

    @contextlib.contextmanager
    def call_span(self, call: ToolCall) -> Iterator[Any]:
        """A span around one governed call, child of the trace context the call carried."""
        parent = self._propagate.extract(dict(call.trace_context)) if call.trace_context else None
        attributes: dict[str, Any] = {
            "mcp.method.name": call.method,
            "gen_ai.tool.name": call.tool,
            "gen_ai.operation.name": "execute_tool",
            "dharma.request_id": call.request_id,
        }
        if call.session_id:
            attributes["mcp.session.id"] = call.session_id
        if call.protocol_version:
            attributes["mcp.protocol.version"] = call.protocol_version
        with self._tracer.start_as_current_span(f"{call.method} {call.tool}", context=parent,
                                                kind=self._trace.SpanKind.SERVER, attributes=attributes) as span:
            yield span

    def finish(self, span: Any, outcome: Outcome, policy_version: str, ledger_seq: int | None) -> None:
        """Note the decision on the span; an error outcome sets the span's status (a refusal is not an error)."""
        span.set_attribute("dharma.decision", outcome.decision.effect.value)
        span.set_attribute("dharma.status", outcome.status.value)
        span.set_attribute("dharma.policy.version", policy_version)
        if ledger_seq is not None:
            span.set_attribute("dharma.ledger.seq", ledger_seq)
        if outcome.error_code is not None:
            span.set_attribute("dharma.error_code", outcome.error_code.value)
            span.set_attribute("error.type", outcome.error_code.value)
        if outcome.status.value == "error":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, outcome.message[:200]))

    def outgoing(self) -> dict[str, str]:
        """The current span's context as `_meta` entries for a request sent upstream."""
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier)
        return {k: v for k, v in carrier.items() if k in TRACE_KEYS}

