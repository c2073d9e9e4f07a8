"""The gateway's Prometheus metrics: counters the hot path bumps, rendered as the text format.

Written by hand instead of with prometheus_client: a call costs a few dict increments and one
bisect per timed stage (no locks, no label objects), and rendering happens only when `/metrics`
is scraped. The event loop is the only writer of the call counters, so plain ints are exact;
the ledger writer's thread counts its own batches (`audit.stats`).

Label cardinality is bounded: a tool label is a name the catalog or an upstream defined (an
unknown or hidden name is `_unknown`, and past `MAX_TOOL_LABELS` distinct names `_other`), rule
labels are rule ids of loaded policies, the others are enums. No principal, argument or request
id is ever a label. No I/O here: the scrape handler gathers the gauges that need it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from audit.stats import AppendStats, Histogram

STAGE_BUCKETS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
)
"""Seconds a pipeline step took: from 10 µs (a cheap stage) to 30 s (a held approval, a slow backend)."""
MAX_TOOL_LABELS = 500
UNKNOWN_TOOL = "_unknown"
OTHER_TOOL = "_other"
UPSTREAM_CODES = frozenset({"backend_error", "backend_unavailable", "timeout"})
"""Error codes that say an upstream failed (counted per upstream)."""


REFUSED_LIMITS: tuple[str, ...] = ("max_connections", "max_connections_per_address")
"""What a connection refused at once hit (the `server.*` setting's name)."""
CLOSE_REASONS: tuple[str, ...] = ("header_timeout", "body_idle", "body_timeout", "keep_alive_idle")
"""Why `dharma serve` closed a connection it had accepted."""


@dataclass(slots=True)
class ConnectionStats:
    """`dharma serve`'s client connections (`gateway.transports.http_limits` counts them)."""

    max_connections: int
    max_connections_per_address: int
    open: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSED_LIMITS, 0))
    closed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))


@dataclass(slots=True)
class Metrics:
    """Everything the gateway counts in process; `render` turns it and the scrape's gauges into text."""

    calls: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    rule_matches: dict[tuple[str, str, str], int] = field(default_factory=dict)
    upstream_errors: dict[tuple[str, str], int] = field(default_factory=dict)
    stages: dict[str, Histogram] = field(default_factory=dict)
    call_seconds: Histogram = field(default_factory=lambda: Histogram(STAGE_BUCKETS))
    reloads: dict[tuple[str, str], int] = field(default_factory=dict)
    tools: set[str] = field(default_factory=set)
    auth_refusals: dict[str, int] = field(default_factory=dict)
    auth_refusals_unrecorded: int = 0
    auth_refusals_folded: int = 0
    connections: ConnectionStats | None = None

    limit_refusals: dict[tuple[str], int] = field(default_factory=dict)
    #: What `/mcp` has open, read when scraped (set by the endpoint): sessions in this process's
    #: memory (None when they live in Redis) and session processes per stdio upstream.
    mcp_open: Callable[[], tuple[int | None, Mapping[str, int]]] | None = None

    def stage(self, name: str, seconds: float) -> None:
        """One pipeline step took `seconds` (the pipeline's timer)."""
        hist = self.stages.get(name)
        if hist is None:
            hist = self.stages[name] = Histogram(STAGE_BUCKETS)
        hist.observe(seconds)

    def tool_label(self, tool: str, known: bool) -> str:
        if not known:
            return UNKNOWN_TOOL
        if tool in self.tools:
            return tool
        if len(self.tools) >= MAX_TOOL_LABELS:
            return OTHER_TOOL
        self.tools.add(tool)
        return tool

    def call(self, *, tool: str, known: bool, decision: str, status: str, error_code: str | None,
             rules: Iterable[tuple[str, str, str]], backend: str | None, seconds: float) -> None:
        """One governed call ended. `rules` are its matches as (rule id, effect, mode)."""
        label = self.tool_label(tool, known)
        key = (label, decision, status, error_code or "")
        self.calls[key] = self.calls.get(key, 0) + 1
        for rkey in rules:
            self.rule_matches[rkey] = self.rule_matches.get(rkey, 0) + 1
        if backend is not None and error_code in UPSTREAM_CODES:
            ukey = (backend, error_code)
            self.upstream_errors[ukey] = self.upstream_errors.get(ukey, 0) + 1
        self.call_seconds.observe(seconds)

    def auth_refusal(self, reason: str) -> None:
        """The HTTP auth layer refused a request for `reason` (one of `gateway.core.refusals.REASONS`)."""
        self.auth_refusals[reason] = self.auth_refusals.get(reason, 0) + 1

    def limit_refused(self, setting: str) -> None:
        """A request was refused because the limit `setting` (e.g. `mcp.max_sessions`) was reached."""
        key = (setting,)
        self.limit_refusals[key] = self.limit_refusals.get(key, 0) + 1

    def reload(self, *, ok: bool, trigger: str) -> None:
        key = ("ok" if ok else "failed", trigger)
        self.reloads[key] = self.reloads.get(key, 0) + 1


@dataclass(frozen=True, slots=True)
class Scrape:
    """The gauges read when `/metrics` is scraped (they need the stores, so the handler gathers them)."""

    policy_name: str
    policy_version: str
    policy_loaded_at: float
    reload_failing: bool
    last_reload_at: float | None
    approvals_pending: int | None
    dependencies: Mapping[str, bool]
    upstreams: Mapping[str, bool]
    ledger_size: int | None
    ledger: AppendStats | None


def render(metrics: Metrics, scrape: Scrape) -> str:
    """The Prometheus text exposition format (version 0.0.4) of `metrics` and `scrape`."""
    lines: list[str] = []
    add = lines.extend
    add(_counter("dharma_calls_total", "Governed tool calls by tool, decided effect, status and error code.",
                 ("tool", "decision", "status", "error_code"), metrics.calls))
    add(_counter("dharma_rule_matches_total", "Rule matches by rule id, effect and mode (enforce, warn, audit: a shadow rule's would-be effect).",
                 ("rule", "effect", "mode"), metrics.rule_matches))
    add(_histograms("dharma_stage_seconds", "Time each pipeline step took, per step (approval includes a held call's wait).",
                    "stage", metrics.stages))
    add(_histograms("dharma_call_seconds", "Time a governed call took, end to end inside the gateway.", None,
                    {"": metrics.call_seconds}))
    add(_counter("dharma_upstream_errors_total", "Calls an upstream failed (backend_error, backend_unavailable, timeout).",
                 ("upstream", "error_code"), metrics.upstream_errors))
    add(_gauge("dharma_upstream_up", "1 while the upstream's circuit breaker lets calls through, 0 while it is open.",
               ("upstream",), {(name,): int(up) for name, up in scrape.upstreams.items()}))
    add(_gauge("dharma_dependency_up", "1 while a dependency (ledger store, Redis) answers its health probe.",
               ("dependency",), {(name,): int(up) for name, up in scrape.dependencies.items()}))
    if scrape.approvals_pending is not None:
        add(_gauge("dharma_approvals_pending", "Held calls waiting for a human decision.", (), {(): scrape.approvals_pending}))
    add(_counter("dharma_auth_refusals_total", "Requests the HTTP auth layer refused, by reason (each one, not aggregated).",
                 ("reason",), {(reason,): n for reason, n in metrics.auth_refusals.items()}))
    add(_counter("dharma_auth_refusals_unrecorded_total",
                 "Auth-layer refusals whose aggregate ledger record could not be written (logged as auth.refusal_not_recorded).",
                 (), {(): metrics.auth_refusals_unrecorded}))
    add(_counter("dharma_auth_refusals_folded_total",
                 "Auth-layer refusals counted under the overflow key: the interval already held auth.refusals.max_keys keys.",
                 (), {(): metrics.auth_refusals_folded}))

    add(_counter("dharma_limit_refusals_total", "Requests refused because a bounded resource was full, by the setting that bounds it.",
                 ("limit",), metrics.limit_refusals))
    if metrics.mcp_open is not None:
        sessions, processes = metrics.mcp_open()
        if sessions is not None:
            add(_gauge("dharma_mcp_sessions_open", "Legacy MCP sessions open in this process.", (), {(): sessions}))
        add(_gauge("dharma_mcp_upstream_processes", "Server processes of legacy sessions running, per stdio upstream.",
                   ("upstream",), {(name,): n for name, n in processes.items()}))
    add(_counter("dharma_policy_reloads_total", "Policy reload attempts by result (ok, failed) and trigger.",
                 ("result", "trigger"), metrics.reloads))
    add(_gauge("dharma_policy_info", "The policy being served (value 1).", ("name", "version"),
               {(scrape.policy_name, scrape.policy_version): 1}))
    add(_gauge("dharma_policy_loaded_timestamp_seconds", "When the policy being served was loaded (Unix time).", (),
               {(): scrape.policy_loaded_at}))
    add(_gauge("dharma_policy_reload_failing", "1 while the last reload attempt failed (the last good policy is served).",
               (), {(): int(scrape.reload_failing)}))
    if scrape.last_reload_at is not None:
        add(_gauge("dharma_policy_last_reload_timestamp_seconds", "When the last reload was attempted (Unix time).", (),
                   {(): scrape.last_reload_at}))
    if scrape.ledger_size is not None:
        add(_gauge("dharma_ledger_records", "Records in the karma ledger as this gateway last saw its head.", (),
                   {(): scrape.ledger_size}))
    if scrape.ledger is not None:
        add(_histograms("dharma_ledger_append_lag_seconds", "Time from a ledger append to its commit, per record.", None,
                        {"": scrape.ledger.lag}))
        add(_histograms("dharma_ledger_batch_records", "Records per committed ledger batch (group commit).", None,
                        {"": scrape.ledger.batch}))
        add(_counter("dharma_ledger_failed_batches_total", "Ledger batches that could not be committed (their calls failed closed).",
                     (), {(): scrape.ledger.failed_batches}))
    if metrics.connections is not None:
        add(_connections(metrics.connections))
    lines.append("")
    return "\n".join(lines)


def _connections(stats: ConnectionStats) -> Iterator[str]:
    yield from _gauge("dharma_http_connections_open", "Client connections `dharma serve` holds open now.", (), {(): stats.open})
    yield from _gauge("dharma_http_connections_limit", "The connection caps in force (server.max_connections, "
                      "server.max_connections_per_address; 0: none).", ("limit",),
                      {("max_connections",): stats.max_connections,
                       ("max_connections_per_address",): stats.max_connections_per_address})
    yield from _counter("dharma_http_connections_refused_total", "Connections answered 503 (max_connections) or 429 "
                        "(max_connections_per_address) and closed at once.", ("limit",),
                        {(k,): v for k, v in stats.refused.items()})
    yield from _counter("dharma_http_connections_closed_total", "Connections closed by a timeout: a request head or body "
                        "too slow (408), a kept-alive connection idle.", ("reason",),
                        {(k,): v for k, v in stats.closed.items()})


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _family(name: str, help_text: str, kind: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


def _counter(name: str, help_text: str, labels: tuple[str, ...], values: Mapping[tuple[str, ...], float]) -> list[str]:
    head = _family(name, help_text, "counter")
    return head + [f"{name}{_labels(labels, key)} {_number(v)}" for key, v in sorted(values.items())]


def _gauge(name: str, help_text: str, labels: tuple[str, ...], values: Mapping[tuple[Any, ...], float]) -> list[str]:
    head = _family(name, help_text, "gauge")
    return head + [f"{name}{_labels(labels, key)} {_number(v)}" for key, v in sorted(values.items())]


def _histograms(name: str, help_text: str, label: str | None, hists: Mapping[str, Histogram]) -> Iterator[str]:
    yield from _family(name, help_text, "histogram")
    for key, hist in sorted(hists.items()):
        names, values = ((label,), (key,)) if label else ((), ())
        for le, count in hist.cumulative():
            bound = 'le="' + le + '"'
            yield f"{name}_bucket{_labels(names, values, bound)} {count}"
        yield f"{name}_sum{_labels(names, values)} {_number(hist.total)}"
        yield f"{name}_count{_labels(names, values)} {hist.count}"
