"""`dharma serve`: the HTTP front (MCP at /mcp, the tool API, approvals, audit, JWKS).

Only the command line lives here; what is served is `gateway.runtime` and
`gateway.transports.http_api.app`.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

from gateway.cli.common import COMMANDS, EXIT_OK, add_command, loop_factory, settings_of


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib

    import uvicorn

    from gateway.logging import configure_logging
    from gateway.runtime import open_gateway, require_policy, serve_announced
    from gateway.core.errors import ConfigError
    from gateway.transports.http_api.app import build_app
    from gateway.transports.http_limits import ConnectionGuard, ConnectionLimits, fit_to_descriptors
    from gateway.watch import live_reload

    settings = settings_of(args)
    require_policy(settings)
    configure_logging(settings.log_level, settings.log_format)
    host = args.host or settings.server.host
    port = args.port if args.port is not None else settings.server.port

    limits = fit_to_descriptors(ConnectionLimits.of(settings.server))

    async def main() -> None:
        gateway = await open_gateway(settings)
        guard = ConnectionGuard(limits)
        gateway.metrics.connections = guard.stats

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            try:
                async with live_reload(gateway, settings):  # SIGHUP and file changes reload the policy
                    yield
            finally:
                # Runs in uvicorn's shutdown, before it re-raises a captured SIGTERM (which would
                # otherwise kill the process before the ledger writer and backends are closed).
                await gateway.aclose()

        app = build_app(gateway, max_body_bytes=settings.server.max_body_bytes, lifespan=lifespan)
        # No WebSocket (the gateway serves none; an upgrade would leave the guard's accounting);
        # uvicorn's keep-alive timer closes idle connections, the guard's sweep the rest.
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                               http=http_protocol(guard), ws="none",
                                               timeout_keep_alive=limits.keep_alive))  # type: ignore[arg-type]
        try:
            await serve_announced(server, gateway)
        except SystemExit:  # uvicorn exits 1 when it cannot listen; that is a configuration error
            raise ConfigError(f"cannot serve on {host}:{port} (the address is in use or not available)") from None
        finally:
            guard.close()
            await gateway.aclose()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())
    return EXIT_OK


def http_protocol(guard: Any = None) -> Any:
    """uvicorn's HTTP/1.1 parser: httptools (llhttp, C) when installed, in the protocol that writes a
    fixed-length response in one write (`gateway.transports.http_protocol`), under `guard`'s
    connection limits when given (`gateway.transports.http_limits`); else h11 (pure Python), where
    only uvicorn's keep-alive timeout applies (httptools is a dependency: said loudly)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        if guard is not None:
            import structlog

            structlog.get_logger().warning("http.connection_limits_off", reason="httptools is not installed: no caps or "
                                           "header/body timeouts on connections (pip install httptools)")
        return "h11"
    from gateway.transports.http_protocol import OneWriteHttpToolsProtocol

    if guard is None:
        return OneWriteHttpToolsProtocol
    from gateway.transports.http_limits import guarded_protocol

    return guarded_protocol(guard)


def add_parsers(sub: Any) -> None:
    """Add `dharma serve` to the `dharma` subparsers."""
    p = add_command(sub, "serve", COMMANDS["serve"])
    p.add_argument("--host", help="address to listen on (default: server.host of dharma.yaml, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: server.port of dharma.yaml)")
    p.add_argument("--policy", help="policy profile file to load (default: the one dharma.yaml names; serve refuses to start without one)")
    p.set_defaults(func=cmd_serve)
