"""The operator's routes of the HTTP front: `POST /v1/admin/reload` and `GET /metrics`.

Reload answers principals with role `admin` only. `/metrics` answers principals with role
`metrics` or `admin` (a Prometheus scraper sends its API key as a bearer token), or anyone when
`metrics.public` is set (for a bind only the scraper can reach); `metrics.enabled: false` drops it.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway
from gateway.metrics import Scrape, render
from gateway.stores.base import StoreUnavailable
from gateway.transports.http_api.common import credentials_from, error_envelope

log = structlog.get_logger()
RELOAD_ROLES = frozenset({"admin"})
METRICS_ROLES = frozenset({"metrics", "admin"})
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


def ops_routes(gateway: Gateway, settings: Any = None) -> list[Route]:
    """The reload and metrics routes over `gateway` (`settings`: its dharma.yaml, when opened from one)."""
    metrics_settings = getattr(settings, "metrics", None)
    public = bool(getattr(metrics_settings, "public", False))
    mcp_upstreams = [u.id for u in getattr(settings, "upstreams", ()) if u.is_mcp]

    def refusal(request: Request, roles: frozenset[str], what: str) -> Response | None:
        principal = gateway.principal_for(credentials_from(request))
        if principal is None:
            return JSONResponse(error_envelope("", ErrorCode.UNAUTHENTICATED, "no valid credentials"), status_code=401)
        if not roles & set(principal.roles):
            return JSONResponse(error_envelope("", ErrorCode.FORBIDDEN, f"{what} needs a principal with role {' or '.join(sorted(roles))}"),
                                status_code=403)
        return None

    async def reload(request: Request) -> Response:
        """Reload the policy now; 200 with the attempt when the new policy serves, 422 naming the
        problems (file:line) when it did not load and the last good one still serves."""
        refused = refusal(request, RELOAD_ROLES, "reloading the policy")
        if refused is not None:
            return refused
        principal = gateway.principal_for(credentials_from(request))
        attempt = await gateway.reload(trigger="http", by=principal.id if principal else None)
        body = {"reload": attempt.model_dump(), "policy": gateway.policy_status().model_dump()}
        return JSONResponse(body, status_code=200 if attempt.ok else 422)

    async def metrics(request: Request) -> Response:
        if not public:
            refused = refusal(request, METRICS_ROLES, "/metrics")
            if refused is not None:
                return refused
        return PlainTextResponse(render(gateway.metrics, await scrape()), media_type=EXPOSITION)

    async def scrape() -> Scrape:
        try:
            pending: int | None = len(await gateway.approvals.pending(time.time()))
        except StoreUnavailable as exc:
            log.warning("metrics.approvals_unavailable", error=str(exc))
            pending = None
        status = gateway.policy_status()
        last = gateway.last_reload
        ledger = gateway.ledger
        size = getattr(ledger, "size", None)
        return Scrape(
            policy_name=status.name,
            policy_version=status.version,
            policy_loaded_at=gateway.policy_loaded_at,
            reload_failing=status.state == "degraded",
            last_reload_at=_unix(last.at) if last is not None else None,
            approvals_pending=pending,
            dependencies={name: why is None for name, why in (await gateway.health()).items()},
            upstreams=await gateway.upstreams_up(mcp_upstreams),
            ledger_size=size if isinstance(size, int) else None,
            ledger=getattr(ledger, "stats", None),
        )

    routes = [Route("/v1/admin/reload", reload, methods=["POST"])]
    if getattr(metrics_settings, "enabled", True):
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    return routes


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
