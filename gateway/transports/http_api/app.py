"""The HTTP front (Starlette): an app factory that mounts the routers over one Gateway.

The routers (`tools`, `approvals`, `health`, `audit`, `ops`, the `/ui` pages and `/mcp`) import
nothing from this module; what they share lives in `http_api.common` (a contract in pyproject.toml).
Here: the routers in order, authentication around them, the error handlers, and the MCP path
served straight by its endpoint (`HttpFront`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Lifespan, Receive, Scope, Send

from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway
from gateway.transports.http_api.approvals import approval_routes
from gateway.transports.http_api.audit import audit_routes
from gateway.transports.http_api.common import error_envelope
from gateway.transports.http_api.health import health_routes
from gateway.transports.http_api.ops import ops_routes
from gateway.transports.http_api.tools import tool_routes
from gateway.transports.http_auth import HttpAuth, http_auth_options, protected_resource_routes, resource_url_for, route_path
from gateway.transports.ui import UiSessions, ui_routes

log = structlog.get_logger()


def build_app(
    gateway: Gateway,
    *,
    max_body_bytes: int = 2_097_152,
    lifespan: Lifespan[Starlette] | None = None,
    mcp: Any = None,
) -> Starlette:
    """The Starlette app over one Gateway; `lifespan` lets the server close the gateway on shutdown.

    `/mcp` (MCP Streamable HTTP) is mounted when `mcp` (a `McpHttpApp`) is given, or when the
    gateway was opened from Settings that name MCP upstreams (`type: mcp_http | mcp_stdio`).
    """
    settings = getattr(gateway, "settings", None)  # set by runtime.open_gateway
    if mcp is None and settings is not None:
        from gateway.transports.mcp_http.app import build_mcp_app

        mcp = build_mcp_app(gateway, settings, max_body_bytes=max_body_bytes)
    routes: list[BaseRoute] = [
        *tool_routes(gateway, settings, max_body_bytes=max_body_bytes),
        *approval_routes(gateway, max_body_bytes=max_body_bytes),
        *health_routes(gateway),
        *audit_routes(gateway),
        *ops_routes(gateway, settings),
    ]
    path = getattr(getattr(settings, "mcp", None), "path", "/mcp")
    if mcp is not None:
        routes.append(Route(path, mcp))  # a pure ASGI app: SSE is streamed, never buffered
        routes.append(Route(path + "/{group}", mcp))  # the named tool groups (`McpHttpApp` reads the path)
        lifespan = _closing(mcp, lifespan)
    middleware: list[Middleware] = []
    direct: Any = mcp  # what serves the MCP path without Starlette's layers
    guard: HttpAuth | None = None
    if settings is not None:
        auth = settings.auth
        routes += protected_resource_routes(
            resource_url_for(auth, settings.server, settings.mcp.path), auth.authorization_servers, auth.scopes_supported
        )
        guard = HttpAuth(
            mcp,
            **http_auth_options(settings, resolve=gateway.principal_for),
            error_body=lambda code, message: error_envelope("", code, message),
            refusals=gateway.refusals,
        )
        middleware.append(Middleware(guard.around))
        direct = guard if mcp is not None else None
    routes += _ui_routes(gateway, settings, guard)
    app = HttpFront(routes=routes, middleware=middleware, exception_handlers={ClientDisconnect: _client_gone, Exception: _server_error},
                    lifespan=lifespan)
    if direct is not None:
        app.direct_path, app.direct = path, direct
    return app


def _ui_routes(gateway: Gateway, settings: Any, guard: HttpAuth | None) -> list[BaseRoute]:
    """The `/ui` pages, logging in through the front's own `guard` when there is one."""
    return ui_routes(gateway, guard,
                     allowed_origins=settings.auth.allowed_origins if settings is not None else (),
                     sessions=UiSessions(getattr(gateway, "ui_session_store", None)),  # Redis: set by open_gateway
                     oidc=settings.ui.oidc if settings is not None else None)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("http.unhandled", path=request.url.path)
    return JSONResponse(error_envelope("", ErrorCode.INTERNAL_ERROR, "internal error; the call was not forwarded"), status_code=500)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client went away mid-body (or `dharma serve` cut it off at a body deadline): nobody
    to answer and nothing wrong with the gateway, so no error line (a client could write one
    per connection)."""
    return Response(status_code=400)


class HttpFront(Starlette):
    """The Starlette app, with the MCP path served straight by its endpoint (behind the one
    authentication check): the per-request layers (error and exception middleware, routing) cost
    every `/mcp` call CPU and do nothing for a pure ASGI endpoint that answers its own errors."""

    direct_path: str | None = None
    direct: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.direct is not None and _under(route_path(scope), self.direct_path):
            scope["app"] = self
            try:
                await self.direct(scope, receive, send)
            except Exception:  # the endpoint answers its own errors; this is a bug: log it, uvicorn answers 500
                log.exception("http.unhandled", path=scope["path"])
                raise
            return
        await super().__call__(scope, receive, send)


def _under(path: str, base: str | None) -> bool:
    """Whether `path` is the MCP path or a group below it (`/mcp/{group}`)."""
    return base is not None and (path == base or (path.startswith(base) and path[len(base):len(base) + 1] == "/"))


def _closing(mcp: Any, inner: Lifespan[Starlette] | None) -> Lifespan[Starlette]:
    """Run the MCP endpoint (its upstreams' background tasks) around `inner` (if any)."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        async with mcp.running():
            if inner is None:
                yield
            else:
                async with inner(app):
                    yield

    return lifespan
