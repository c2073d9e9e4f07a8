"""Logging in to `/ui` and out: an API key or bearer JWT in the login form (checked by the HTTP
front's own `HttpAuth` when there is one), or single sign-on (OpenID Connect, `ui.oidc`).

Every way ends with the same session cookie; the login form carries its own CSRF cookie.
"""

from __future__ import annotations

import hmac
import secrets

import structlog
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.config import OIDC_CALLBACK
from gateway.core.call import Credentials, Principal
from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway
from gateway.transports.auth_refusals import record_refusal
from gateway.transports.http_auth import AuthResult, HttpAuth
from gateway.transports.ui.oidc import FLOW_SECONDS, OidcRefused
from gateway.transports.ui.web import (HEADERS, LOGIN_COOKIE, OIDC_COOKIE, PREFIX, UI_ROLES, Authenticate, Refused, Ui,
                                       cookie_name, landing)

log = structlog.get_logger()


def api_key_login(gateway: Gateway) -> Authenticate:
    """Login without an `HttpAuth` (a gateway built without settings): the token is an API key."""

    async def authenticate(token: str) -> AuthResult:
        credentials = Credentials(api_key=token)
        principal = gateway.principal_for(credentials)
        if principal is None:
            return AuthResult(credentials, method="api_key", status=401, error="invalid_token", message="unknown API key",
                              reason="unknown_key")
        return AuthResult(credentials, principal, "api_key")

    return authenticate


def guard_login(guard: HttpAuth) -> Authenticate:
    """Login through the HTTP front's own check: an API key, or a JWT verified against the issuer's keys."""

    async def authenticate(token: str) -> AuthResult:
        return await guard.authenticate(Headers({"authorization": f"Bearer {token}"}))

    return authenticate


def no_role(principal: Principal) -> str:
    return f"{principal.id} may not use this page: it needs role approver, auditor or admin."


def flow_cookie(request: Request) -> str:
    return f"__Host-{OIDC_COOKIE}" if request.url.scheme == "https" else OIDC_COOKIE


def login_routes(ui: Ui) -> list[Route]:
    """`/ui` (to the landing page), the login form, logout."""
    gateway, guard = ui.gateway, ui.guard

    async def home(request: Request) -> Response:
        found = await ui.current(request)
        return landing(found[1] if found is not None else None)

    async def login_form(request: Request, message: str = "", status: int = 200) -> Response:
        token = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)
        response = await ui.page(request, "login.html", None, status=status, login_csrf=token, message=message,
                                 sso=ui.sso is not None)
        response.set_cookie(LOGIN_COOKIE, token, max_age=900, path=f"{PREFIX}/login", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def login(request: Request) -> Response:
        if request.method == "GET":
            if await ui.current(request) is not None:
                return await home(request)
            return await login_form(request)
        ui.same_origin(request)
        fields = await ui.form(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(fields.get("csrf", "").encode(), expected.encode()):
            raise Refused(403, "the login form's CSRF token is missing or wrong; reload the login page")
        token = fields.get("token", "").strip()
        if not token:
            return await login_form(request, "Enter an API key or a bearer token.", 400)
        result = await ui.authenticate(token)
        if not result.ok or result.principal is None:
            log.info("ui.login_refused", status=result.status, reason=result.message)
            await record_refusal(gateway.refusals, request.scope, None, reason=result.reason or "unknown_key", status=401,
                                 error_code=ErrorCode.UNAUTHENTICATED.value, authorization=[f"Bearer {token}"], api_keys=[],
                                 jwt=guard is not None and guard.verifier is not None, verified=result.credentials.jwt)
            return await login_form(request, f"Not logged in: {result.message or 'unknown credentials'}.", 401)
        if not UI_ROLES & set(result.principal.roles):
            log.info("ui.login_refused", principal=result.principal.id, reason="no role")
            return await login_form(request, no_role(result.principal), 403)
        response = landing(result.principal)
        await ui.start_session(request, response, result.credentials, result.principal, result.method or "api_key")
        response.delete_cookie(LOGIN_COOKIE, path=f"{PREFIX}/login")
        return response

    async def logout(request: Request) -> Response:
        found = await ui.current(request)
        if found is not None:
            ui.checked_post(found, request, await ui.form(request))
            await ui.sessions.end(found[0].id)
            log.info("ui.logout", principal=found[1].id)
        response = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
        response.delete_cookie(cookie_name(request), path="/", httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")
        return response

    return [
        Route(PREFIX, ui.guarded(home), methods=["GET"]),
        Route(f"{PREFIX}/", ui.guarded(home), methods=["GET"]),
        Route(f"{PREFIX}/login", ui.guarded(login), methods=["GET", "POST"]),
        Route(f"{PREFIX}/logout", ui.guarded(logout), methods=["POST"]),
    ]


def sso_routes(ui: Ui) -> list[Route]:
    """Single sign-on (OpenID Connect code flow): begin at the provider, finish at its redirect back."""
    gateway, sso = ui.gateway, ui.sso

    async def sso_login(request: Request) -> Response:
        """Begin the code flow: remember it under a cookie of this browser, send the browser to the provider."""
        if sso is None:
            raise Refused(404, "single sign-on is not configured (ui.oidc in dharma.yaml)")
        try:
            flow_id, url = await sso.begin()
        except OidcRefused as exc:
            log.warning("ui.oidc_refused", step="begin", status=exc.status, reason=exc.message)
            raise Refused(exc.status, f"Single sign-on is unavailable: {exc.message}") from None
        response = RedirectResponse(url, status_code=303, headers=HEADERS)
        # Lax, not Strict: the provider's redirect back is a cross-site navigation, and must carry it.
        response.set_cookie(flow_cookie(request), flow_id, max_age=int(FLOW_SECONDS), path="/", httponly=True,
                            samesite="lax", secure=request.url.scheme == "https")
        return response

    async def sso_callback(request: Request) -> Response:
        """The provider's redirect back: complete the flow, then the same session as an API-key login."""
        if sso is None:
            raise Refused(404, "single sign-on is not configured (ui.oidc in dharma.yaml)")
        params = {k: v for k, v in request.query_params.items() if k in ("code", "state", "iss", "error", "error_description")}
        try:
            verified = await sso.finish(request.cookies.get(flow_cookie(request)), params)
        except OidcRefused as exc:
            log.warning("ui.oidc_refused", step="callback", status=exc.status, reason=exc.message)
            raise Refused(exc.status, f"Not logged in: {exc.message}") from None
        credentials = Credentials(jwt=verified)
        principal = gateway.principal_for(credentials)
        if principal is None:
            log.warning("ui.oidc_refused", step="principal", status=403, subject=verified.subject)
            raise Refused(403, f"Not logged in: {verified.subject!r} is not a principal of this gateway's policy")
        if not UI_ROLES & set(principal.roles):
            log.warning("ui.oidc_refused", step="role", status=403, principal=principal.id)
            raise Refused(403, f"Not logged in: {no_role(principal)}")
        target = landing(principal).headers["location"]
        # A page, not a redirect: the browser's next request is then same-site and carries the Strict cookie.
        response = HTMLResponse(ui.env.get_template("signed_in.html").render(
            prefix=PREFIX, target=target, who=principal.id, policy_version=gateway.policy.version),
                                headers=HEADERS)
        await ui.start_session(request, response, credentials, principal, "oidc")
        response.delete_cookie(flow_cookie(request), path="/", httponly=True, samesite="lax", secure=request.url.scheme == "https")
        return response

    return [
        Route(f"{PREFIX}/oidc/login", ui.guarded(sso_login), methods=["GET"]),
        Route(OIDC_CALLBACK, ui.guarded(sso_callback), methods=["GET"]),
    ]
