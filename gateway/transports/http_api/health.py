"""The open routes of the HTTP front: `GET /healthz` (dependencies and policy state) and
`GET /.well-known/jwks.json` (the keys that verify receipts and checkpoints)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.core.gateway import Gateway


def health_routes(gateway: Gateway) -> list[Route]:
    """`/healthz` and the JWKS over `gateway`."""

    async def jwks(request: Request) -> Response:
        return JSONResponse(gateway.keys.jwks(), headers={"cache-control": "public, max-age=300"})

    async def healthz(request: Request) -> Response:
        """200 when every dependency answers, else 503 naming what is down (`dependencies`). A failed
        policy reload is "degraded" with 200: the last good policy still serves (`policy_status`)."""
        deps = await gateway.health()
        down = {name: why for name, why in deps.items() if why is not None}
        policy = gateway.policy_status()
        body = {
            "status": "degraded" if down or policy.state != "ok" else "ok",
            "policy": policy.name,
            "policy_version": policy.version,
            "policy_status": policy.model_dump(),
            "dependencies": {name: {"status": "down", "error": why} if why else {"status": "up"} for name, why in deps.items()},
        }
        problems = [*down.values(), *([f"policy reload failed, serving the last good policy: {policy.last_reload.error}"]
                                      if policy.state != "ok" and policy.last_reload else [])]
        if problems:
            body["message"] = "; ".join(problems)
        return JSONResponse(body, status_code=503 if down else 200)

    return [
        Route("/.well-known/jwks.json", jwks, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
