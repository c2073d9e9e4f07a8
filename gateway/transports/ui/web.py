"""What every `/ui` page shares: the constants and headers, the request's session and principal,
the checks on a POST (same origin, form body, CSRF token), rendering, and the error page.

`Ui` holds the page's state over one Gateway; the route modules (`login`, `approvals`, `audit_pages`)
take it and return their routes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import jinja2
import structlog
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from audit.errors import LedgerError
from gateway.core.call import Credentials, Principal
from gateway.core.errors import ConfigError
from gateway.core.gateway import Gateway, rfc3339
from gateway.stores.base import StoreUnavailable
from gateway.transports.http_api.audit import LedgerView
from gateway.transports.http_api.common import BadRequest, read_body
from gateway.transports.http_auth import AuthResult, HttpAuth
from gateway.transports.ui.oidc import OidcLogin
from gateway.transports.ui.overview import Verifier
from gateway.transports.ui.sessions import COOKIE, UiSession, UiSessions

log = structlog.get_logger()

HERE = Path(__file__).resolve().parent
PREFIX = "/ui"
APPROVE_ROLES = frozenset({"approver", "admin"})
AUDIT_ROLES = frozenset({"auditor", "admin"})
UI_ROLES = APPROVE_ROLES | AUDIT_ROLES
LOGIN_COOKIE = "dharma_ui_login"
OIDC_COOKIE = "dharma_ui_oidc"
"""The cookie naming this browser's SSO login under way (`__Host-` over https)."""
FORM_LIMIT = 65_536
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}

Authenticate = Callable[[str], Awaitable[AuthResult]]
Endpoint = Callable[[Request], Awaitable[Response]]
Found = tuple[UiSession, Principal]


class Refused(Exception):
    """A request the page answers with an error page: `status` and a message naming why
    (`to_login`: a GET is sent to the login page instead)."""

    def __init__(self, status: int, message: str, *, to_login: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.to_login = status, message, to_login


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = lambda t: rfc3339(t) if isinstance(t, (int, float)) else (t or "")
    env.filters["pretty"] = pretty_json
    return env


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def cookie_name(request: Request) -> str:
    return f"__Host-{COOKIE}" if request.url.scheme == "https" else COOKIE


def landing(principal: Principal | None) -> Response:
    """To the login form, or to the first page this principal's roles open."""
    if principal is None:
        return RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
    roles = set(principal.roles)
    target = "approvals" if roles & APPROVE_ROLES else "overview" if roles & AUDIT_ROLES else "policy"
    return RedirectResponse(f"{PREFIX}/{target}", status_code=303, headers=HEADERS)


@dataclass
class Ui:
    """The `/ui` pages' state over one Gateway: templates, login sessions, how a token is checked,
    SSO (if configured), the ledger view, the verifier, and the origins trusted besides its own."""

    gateway: Gateway
    guard: HttpAuth | None
    env: jinja2.Environment
    sessions: UiSessions
    sso: OidcLogin | None
    authenticate: Authenticate
    view: LedgerView
    verify_now: Verifier
    trusted_origins: frozenset[str]

    async def current(self, request: Request) -> Found | None:
        session = await self.sessions.get(request.cookies.get(cookie_name(request)))
        if session is None:
            return None
        principal = self.gateway.principal_for(session.credentials)
        if principal is None:  # the key or principal left the policy: the session is over
            await self.sessions.end(session.id)
            return None
        return session, principal

    async def require(self, request: Request, roles: frozenset[str], what: str) -> Found:
        found = await self.current(request)
        if found is None:
            raise Refused(401, "log in first", to_login=True)
        if not roles & set(found[1].roles):
            raise Refused(403, f"{what} needs a principal with role {' or '.join(sorted(roles))}; "
                               f"{found[1].id} has {', '.join(found[1].roles) or 'no roles'}")
        return found

    def same_origin(self, request: Request) -> None:
        """A POST must come from this page: its Origin (or, without one, Sec-Fetch-Site) says so."""
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is None:
            if request.headers.get("sec-fetch-site") == "same-origin":
                return
            raise Refused(403, "the request has no Origin header; submit the form from the page")
        if origin != own and origin not in self.trusted_origins:
            raise Refused(403, f"the Origin {origin[:100]!r} may not post to this page")

    async def form(self, request: Request) -> dict[str, str]:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
            raise Refused(415, "send the form as application/x-www-form-urlencoded")
        try:
            raw = await read_body(request, FORM_LIMIT)
        except BadRequest as exc:
            raise Refused(413, exc.message) from None
        try:
            fields = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(raw), max_num_fields=20)
        except (UnicodeDecodeError, ValueError) as exc:
            raise Refused(400, f"the form is not valid: {exc}") from None
        out: dict[str, str] = {}
        for name, value in fields:
            if name in out:
                raise Refused(400, f"the form field `{name}` is given more than once")
            out[name] = value
        return out

    def checked_post(self, found: Found, request: Request, fields: dict[str, str]) -> None:
        self.same_origin(request)
        if not found[0].csrf_ok(fields.get("csrf")):
            log.warning("ui.csrf_refused", principal=found[1].id, path=request.url.path)
            raise Refused(403, "the form's CSRF token is missing or wrong; reload the page and try again")

    async def page(self, request: Request, name: str, found: Found | None, status: int = 200, **values: Any) -> HTMLResponse:
        session, principal = found if found is not None else (None, None)
        roles = set(principal.roles) if principal is not None else set()
        flash = await self.sessions.take_flash(session) if session is not None and status == 200 else None
        body = self.env.get_template(name).render(
            prefix=PREFIX, principal=principal, csrf=session.csrf if session else "", flash=flash,
            can_approve=bool(roles & APPROVE_ROLES), can_audit=bool(roles & AUDIT_ROLES),
            policy_version=self.gateway.policy.version, path=request.url.path, **values)
        return HTMLResponse(body, status_code=status, headers=HEADERS)

    def guarded(self, endpoint: Endpoint) -> Endpoint:
        """Answer a Refused with an error page (401: to the login page, for a GET)."""

        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Refused as exc:
                if exc.to_login and request.method == "GET" and not request.url.path.endswith("/events"):
                    return RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
                log.info("ui.refused", path=request.url.path, status=exc.status, reason=exc.message)
                return await self.page(request, "error.html", await self.current(request), status=exc.status, message=exc.message)
            except (LedgerError, ConfigError) as exc:
                log.error("ui.ledger_failed", path=request.url.path, error=str(exc))
                return await self.page(request, "error.html", await self.current(request), status=500,
                                       message=f"the ledger cannot answer: {exc}")
            except StoreUnavailable as exc:  # the session store: nobody is logged in until it answers
                log.error("ui.sessions_unavailable", path=request.url.path, error=str(exc))
                return await self.page(request, "error.html", None, status=503, message=f"the login sessions cannot be read: {exc}")

        return answer

    async def start_session(self, request: Request, response: Response, credentials: Credentials, principal: Principal,
                            method: str) -> None:
        """The session cookie every way of logging in ends with."""
        session = await self.sessions.create(credentials)
        log.info("ui.login", principal=principal.id, method=method)
        response.set_cookie(cookie_name(request), session.id, max_age=int(session.expires_at - time.time()), path="/",
                            httponly=True, samesite="strict", secure=request.url.scheme == "https")
