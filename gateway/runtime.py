"""Start-up: build a Gateway from Settings (policy, keys, ledger, approvals, backends), and the
checks and banner of `dharma serve`.

This is where files and modules named in the configuration are opened; every failure becomes
a ConfigError or PolicyErrors with a message naming what and where.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import importlib
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from audit.checkpoint import CheckpointSigner
from audit.errors import LedgerError
from audit.sqlite import SqliteLedger
from gateway.core.backends import Backend, ToolSpec
from gateway.transports.upstreams.python import CallableBackend
from gateway.config import PACKAGE_ROOT, Settings, UpstreamConfig, load_settings
from gateway.core.errors import ConfigError
from gateway.core.gateway import LEDGER_ORIGIN, Gateway
from gateway.core.refusals import RefusalLimits
from gateway.logging import ensure_logging
from gateway.policy.compile import load_policy
from gateway.crypto.receipts import KeyStore
from gateway.stores.base import ApprovalSignals, PinStore
from gateway.stores.file_pins import FilePinStore
from gateway.stores.memory import MemoryApprovalSignals
from gateway.stores.sqlite_approvals import SqliteApprovalStore

log = structlog.get_logger()

#: How long the start-up banner waits for an MCP upstream to list its tools.
MCP_COUNT_SECONDS = 20.0


def build_backend(upstream: UpstreamConfig, python_path: list[Path] | None = None) -> Backend:
    if upstream.type == "http":
        if not upstream.url:
            raise ConfigError(f"upstream {upstream.id}: type http needs `url`")
        tools = [ToolSpec(t.name, t.description, t.input_schema, t.output_schema, dict(t.annotations)) for t in upstream.tools]
        if not tools:
            raise ConfigError(f"upstream {upstream.id}: list the tools the HTTP API serves under `tools`")
        from gateway.transports.upstreams.http_api import HttpBackend  # httpx only when an HTTP upstream exists

        return HttpBackend(upstream.id, upstream.url, tools, headers=upstream.headers)
    if not upstream.target or ":" not in upstream.target:
        raise ConfigError(f"upstream {upstream.id}: type python needs `target: module:attribute`")
    module_name, _, attr = upstream.target.partition(":")
    for entry in python_path or []:
        if str(entry) not in sys.path:
            sys.path.insert(0, str(entry))
    try:
        module = importlib.import_module(module_name)
        factory: Any = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"upstream {upstream.id}: cannot load {upstream.target}: {exc}") from None
    backend = factory(upstream.id) if callable(factory) and not isinstance(factory, CallableBackend) else factory
    if isinstance(backend, dict):
        backend = CallableBackend.from_functions(upstream.id, backend)
    if not hasattr(backend, "send") or not hasattr(backend, "tools"):
        raise ConfigError(f"upstream {upstream.id}: {upstream.target} did not give a backend")
    return backend  # type: ignore[no-any-return]


async def open_ledger(settings: Settings, *, checkpoint_signer: CheckpointSigner | None = None) -> Any:
    """The karma ledger's writer: PostgreSQL when `ledger.url` is set, else the SQLite file. Either
    signs a checkpoint at least every second while it grows, and on close, with `checkpoint_signer`."""
    if settings.ledger.url is None:
        return await SqliteLedger.open(settings.ledger_path, synchronous=settings.ledger.synchronous,
                                       checkpoint_signer=checkpoint_signer, inline_max_ms=settings.ledger.inline_max_ms)
    try:
        from audit.postgres import PostgresLedger
    except ImportError as exc:
        raise ConfigError(f"ledger.url needs psycopg: pip install 'dharma-gateway[postgres]' ({exc})") from None
    return await PostgresLedger.open(settings.ledger.url, checkpoint_signer=checkpoint_signer)


async def open_approvals(settings: Settings) -> Any:
    """The approval store: with a PostgreSQL ledger (`ledger.url`), its own tables in that same
    database, shared by every replica; else `approvals.db` under the state root."""
    if settings.ledger.url is None:
        return SqliteApprovalStore(settings.approvals_path)
    try:
        from gateway.stores.postgres_approvals import PostgresApprovalStore
    except ImportError as exc:
        raise ConfigError(f"ledger.url needs psycopg: pip install 'dharma-gateway[postgres]' ({exc})") from None
    return await PostgresApprovalStore.open(settings.ledger.url)


def open_approval_signals(settings: Settings) -> ApprovalSignals:
    """Wake-ups for held calls: over Redis pub/sub when `redis.url` is set (a decision on any
    replica releases a call held on another), else within this process. Redis is imported only then."""
    if settings.redis.url is None:
        return MemoryApprovalSignals()
    from gateway.stores.redis import connect
    from gateway.stores.redis_signals import RedisApprovalSignals

    return RedisApprovalSignals(connect(settings.redis), subscribe_wait=settings.redis.operation_timeout_seconds)


def policy_loader(settings: Settings) -> Any:
    """Load, compile and check the policy the settings name (what a reload calls again)."""
    return functools.partial(load_policy, settings.policy, extra=list(settings.rules), engine=settings.cel_engine)


async def open_gateway(
    settings: Settings | None = None,
    *,
    config: str | Path | None = None,
    policy: str | Path | None = None,
    backends: Sequence[Backend] = (),
    state_root: str | Path | None = None,
    compiled: Any = None,
) -> Gateway:
    """Open a Gateway: from `settings`, or from a dharma.yaml and/or a policy path plus backends.

    Keys, the karma ledger and approvals live under the state root (default
    `$DHARMA_STATE_ROOT` or ~/.dharma). `compiled` is the policy `policy_loader(settings)()`
    already built (`dharma stdio` builds it off the event loop). Raises ConfigError/PolicyErrors
    on bad input.
    """
    ensure_logging()
    if settings is None:
        overrides: dict[str, Any] = {}
        if policy is not None:
            overrides["policy"] = str(Path(policy).resolve())
        if state_root is not None:
            overrides["state_root"] = str(state_root)
        settings = load_settings(Path(config) if config else None, os.environ, overrides)
    loader = policy_loader(settings)
    compiled = loader() if compiled is None else compiled
    keys = KeyStore.open(settings.state_dir)
    tracer = open_tracer() if settings.tracing.otel else None  # before anything needs closing
    # MCP upstreams are not catalog backends: their tools are listed live, per session, at /mcp
    # (gateway.transports.mcp_http.app); `build_app` finds them through `gateway.settings`.
    backends = [*backends, *(build_backend(u, list(settings.python_path)) for u in settings.upstreams if not u.is_mcp)]
    try:
        signer = CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, LEDGER_ORIGIN)
        ledger = await open_ledger(settings, checkpoint_signer=signer)
    except LedgerError as exc:
        raise ConfigError(str(exc)) from None
    try:  # after the ledger: on PostgreSQL its tables go into the database the ledger has just checked
        approvals = await open_approvals(settings)
    except ConfigError:
        await ledger.aclose()
        raise
    signals = open_approval_signals(settings)
    shared = shared_stores(settings)
    links = shared.pop("dependencies", [])
    try:
        gateway = Gateway(
            compiled, backends, ledger=ledger, keys=keys, approval_store=approvals, approval_signals=signals,
            approval_poll_seconds=settings.approvals.poll_seconds, policy_path=settings.policy, policy_loader=loader,
            dependencies=[ledger_probe(settings), *links], **shared,
            refusal_limits=RefusalLimits(settings.auth.refusals.interval_seconds, settings.auth.refusals.max_keys),
        )
        gateway.settings = settings  # type: ignore[attr-defined]  # read by server.build_app (MCP upstreams)
        gateway.ui_session_store = ui_session_store(links)  # type: ignore[attr-defined]  # read by build_app (/ui logins)
        gateway.tracer = tracer
        return gateway
    except ValueError as exc:
        await signals.aclose()
        await ledger.aclose()
        for link in links:
            await link.aclose()
        close_approvals = getattr(approvals, "aclose", None)
        if close_approvals is not None:
            await close_approvals()
        raise ConfigError(str(exc)) from None


def open_tracer() -> Any:
    """OpenTelemetry spans (`tracing.otel: true`); the `otel` extra must be installed."""
    try:
        from gateway.tracing import OtelTracer

        return OtelTracer()
    except ImportError as exc:
        raise ConfigError(f"tracing.otel needs OpenTelemetry: pip install 'dharma-gateway[otel]' ({exc})") from None


def shared_stores(settings: Settings) -> dict[str, Any]:
    """The Gateway's stores shared with other replicas: Redis ones when `redis.url` is set (one
    link for all, closed with the gateway), else nothing (the Gateway keeps them in memory and
    redis is not even imported)."""
    if settings.redis.url is None:
        return {}
    from gateway.stores import redis as rs

    link = rs.connect(settings.redis)
    log.info("redis.shared_state", url=link.where)
    return {
        "limiter_store": rs.RedisLimiterStore(link),
        "breaker_store": rs.RedisBreakerStore(link),
        "idempotency_store": rs.RedisIdempotencyStore(link, settings.redis.idempotency_ttl_seconds),
        "history_store": rs.RedisHistory(link),
        "pin_store": rs.RedisPinStore(link),
        "dependencies": [link],
    }


def ui_session_store(links: list[Any]) -> Any:
    """The `/ui` login sessions on the shared Redis link when there is one (so any replica serves a
    logged-in browser), else None: the page keeps them in this process."""
    if not links:
        return None
    from gateway.stores.redis import RedisUiSessionStore

    return RedisUiSessionStore(links[0])


def ledger_probe(settings: Settings) -> Any:
    """The ledger as a /healthz dependency: PostgreSQL when `ledger.url` is set, else the SQLite file."""
    from gateway.health import PostgresProbe, SqliteProbe

    return SqliteProbe(settings.ledger_path) if settings.ledger.url is None else PostgresProbe(settings.ledger.url)


def pin_store_for(gateway: Gateway, settings: Settings) -> PinStore:
    """The tool pins an MCP transport uses: the gateway's shared ones, else the file under the state root."""
    return gateway.pins if gateway.pins is not None else FilePinStore(settings.state_dir)


@contextlib.asynccontextmanager
async def open_pin_store(settings: Settings) -> AsyncIterator[PinStore]:
    """The pins `dharma tools` reads and accepts: Redis when `redis.url` is set, else the file."""
    if settings.redis.url is None:
        yield FilePinStore(settings.state_dir)
        return
    from gateway.stores import redis as rs

    link = rs.connect(settings.redis)
    try:
        yield rs.RedisPinStore(link)
    finally:
        await link.aclose()


# ---- dharma serve ------------------------------------------------------------------------


def require_policy(settings: Settings) -> None:
    """Refuse to serve on the default profile: a network server must be told which policy, and
    so which callers, it serves (the shipped profiles hold no API keys)."""
    if not settings.policy_named:
        raise ConfigError(
            "no policy named, so `dharma serve` refuses to start (it never serves a default). Name one with "
            "--policy FILE, `policy:` in dharma.yaml (--config FILE) or DHARMA_POLICY. The shipped profiles in "
            f"{PACKAGE_ROOT / 'policies'} hold no API keys: give your callers theirs in a profile that `extends` "
            "one (docs/policy.md); the demo's is examples/policies/demo.yaml"
        )


async def serve_announced(server: Any, gateway: Gateway) -> None:
    """Run a `uvicorn.Server` and, once it listens, log the start-up banner (once)."""
    announcer = asyncio.create_task(_announce(server, gateway))
    try:
        await server.serve()
    finally:
        announcer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await announcer


async def _announce(server: Any, gateway: Gateway) -> None:
    while not server.started:  # uvicorn sets the flag once its sockets listen; it offers nothing to await
        await asyncio.sleep(0.05)
    settle_collector()
    listening = [f"http://{_host_port(sock.getsockname())}" for s in getattr(server, "servers", []) for sock in s.sockets]
    settings: Settings = gateway.settings  # type: ignore[attr-defined]  # set by open_gateway
    counts = await count_mcp_tools([u for u in settings.upstreams if u.is_mcp])
    log.info("dharma.serving", **banner(gateway, settings, listening or [f"http://{server.config.host}:{server.config.port}"], counts))


GC_YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) between two collections of the youngest generation; Python's default is 700."""


def settle_collector() -> None:
    """Tune the cyclic garbage collector for serving, once start-up is done.

    A `/mcp` call allocates many container objects, nearly all freed by reference counting; with
    Python's default young threshold (700) a young collection ran every ~6 calls and promoted the
    objects of the calls in flight, which then triggered full collections of the whole heap (~80 ms
    of CPU for the ~145k objects start-up leaves, every ~1,100 calls at 8 clients). A young
    threshold of 10,000 runs one every ~140 calls, promotes far less, and cut the collector's CPU
    from about 70 to about 30 µs a call (issue 26, docs/performance-history.md). What start-up built (the
    compiled policy, the app, imported modules) is frozen out of the collector's reach first: it lives
    as long as the process, so a full collection no longer scans it. Nothing is disabled.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _host_port(name: Any) -> str:
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def banner(gateway: Gateway, settings: Settings, listening: list[str], mcp_counts: dict[str, int | str]) -> dict[str, Any]:
    """What `dharma serve` says once it listens: where, which policy, each upstream and its tools.

    Python and HTTP upstreams are served on the tool API (`/v1`), MCP upstreams only at `/mcp`.
    """
    served = collections.Counter(info.backend for info in gateway.catalog())
    return {
        "listen": listening,
        "policy": gateway.policy.name,
        "policy_version": gateway.policy.version,
        "policy_file": str(gateway.policy_path) if gateway.policy_path else None,
        "upstreams": [
            {"id": u.id, "type": u.type, "tools": mcp_counts.get(u.id, "unknown") if u.is_mcp else served[u.id],
             "served_at": settings.mcp.path if u.is_mcp else "/v1/tools"}
            for u in settings.upstreams
        ],
    }


async def count_mcp_tools(upstreams: Sequence[UpstreamConfig]) -> dict[str, int | str]:
    """How many tools each MCP upstream lists, asked concurrently with the official SDK client;
    an upstream that does not answer within MCP_COUNT_SECONDS is reported, not waited for."""
    counts: dict[str, int | str] = {}

    async def one(upstream: UpstreamConfig) -> None:
        try:
            with anyio.fail_after(MCP_COUNT_SECONDS):
                counts[upstream.id] = await _list_tool_count(upstream)
        except TimeoutError:
            counts[upstream.id] = f"unknown: no tools/list answer within {MCP_COUNT_SECONDS:g} s"
        except Exception as exc:  # the banner reports; the endpoint itself retries per session
            while isinstance(exc, ExceptionGroup) and exc.exceptions:  # the SDK's task groups wrap the cause
                exc = exc.exceptions[0]
            counts[upstream.id] = f"unknown: {type(exc).__name__}: {exc}"[:200]

    async with anyio.create_task_group() as tg:
        for upstream in upstreams:
            tg.start_soon(one, upstream)
    return counts


async def _list_tool_count(upstream: UpstreamConfig) -> int:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async with contextlib.AsyncExitStack() as stack:
        if upstream.type == "mcp_stdio":
            quiet = stack.enter_context(open(os.devnull, "w"))  # the upstream's stderr is not the gateway's log
            params = StdioServerParameters(command=upstream.command or "", args=upstream.args, env={**os.environ, **upstream.env})
            transport: Any = stdio_client(params, errlog=quiet)
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            http = await stack.enter_async_context(httpx2.AsyncClient(headers=upstream.headers))
            transport = streamable_http_client(upstream.url or "", http_client=http)
        client = await stack.enter_async_context(Client(transport))
        count, cursor = 0, None
        while True:
            page = await client.list_tools(cursor=cursor)
            count += len(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return count
