"""The approvals and audit page at `/ui`: server-rendered HTML for approvers, auditors and admins.

- Log in with an API key or a bearer JWT (checked by the same `HttpAuth` as `/mcp` and `/v1/`),
  or with SSO where `ui.oidc` is configured (`gateway.transports.ui.oidc`: OpenID Connect code
  flow with PKCE, `state` and `nonce`) → a session cookie (HttpOnly, SameSite=Strict, Secure over https). Every POST carries the
  session's CSRF token and a same-origin `Origin`; every route checks the principal's roles again.
- `/ui/approvals` (approver, admin): the pending held calls, newest first, kept current over
  server-sent events by reading the approval store (shared by replicas and the CLI); approve or
  deny goes through `Gateway.decide`, the one approval path the CLI and `/v1/approvals` use.
- `/ui/overview` (auditor, admin; an auditor's landing page): calls, refusals, holds and latency over a
  time range as server-rendered SVG, the rules that fired and who and what was refused most, the
  ledger's size and last verification, "Verify now" (`gateway.transports.ui.overview`).
- `/ui/ledger` (auditor, admin): `dharma audit query`'s filters, a record with its inclusion proof
  checked against the checkpoint key, the current checkpoint (`LedgerView`, shared with `/v1/audit/`).
- `/ui/policy` (all three): the loaded policy's tiers, principals, rules with their `file:line`.

Nothing secret is rendered: arguments are the approval's redacted preview, records are the
ledger's redacted bytes, principals are shown without their keys.
"""

from __future__ import annotations

import base64
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
import jinja2
import structlog
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from audit.errors import LedgerError
from audit.proofs import check_inclusion
from gateway.config import OIDC_CALLBACK, OidcSettings
from gateway.core.call import Credentials, Effect, Principal
from gateway.core.errors import ConfigError, ErrorCode
from gateway.core.gateway import Gateway, rfc3339
from gateway.ledger_access import query_choices
from gateway.policy.compile import CompiledPolicy, glob_match
from gateway.stages.approval import ApprovalRefused
from gateway.stores.base import Approval, StoreUnavailable
from gateway.transports.http_api.app import BadRequest, read_body
from gateway.transports.http_api.audit import BadQuery, LedgerView, RecordsQuery, parse_query
from gateway.transports.auth_refusals import record_refusal
from gateway.transports.http_auth import AuthResult, HttpAuth
from gateway.transports.ui.oidc import FLOW_SECONDS, OidcLogin, OidcRefused
from gateway.transports.ui.overview import (DEFAULT_RANGE, RANGES, Verifier, VerifyBusy, aggregate, bucket_text, charts,
                                            fmt_ms, last_verification, settings_of, utc_text)
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
POLL_SECONDS = 1.0
"""How often an open approvals page's event stream reads the approval store."""
STREAM_SECONDS = 60.0
"""An event stream ends after this long and the browser reconnects (so a stopping server never waits on one)."""
KEEPALIVE_SECONDS = 15.0
LEDGER_PAGE = 50
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}

Authenticate = Callable[[str], Awaitable[AuthResult]]


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


def arguments_text(preview: str) -> tuple[str, bool]:
    """The approval's stored, redacted arguments, indented when whole; True when the store cut them short."""
    try:
        return pretty_json(json.loads(preview)), False
    except ValueError:
        return preview, bool(preview)


def holding_rules(policy: CompiledPolicy, a: Approval, message: str) -> list[str]:
    """The rules of the loaded policy that hold `a`'s tool with exactly this message, as `id (file:line)`.

    The approval store keeps the held call's messages, not its rule ids, so they are found again
    here, and only under the policy version the call was held by (else none is named)."""
    if policy.version != a.policy_version:
        return []
    return [f"{r.id} ({r.file}:{r.line})" for r in policy.rules
            if r.effect is Effect.REQUIRE_APPROVAL and r.message == message and any(glob_match(a.tool, g) for g in r.tools)]


def approval_view(a: Approval, now: float, policy: CompiledPolicy) -> dict[str, Any]:
    """What the page shows of one held call."""
    args, cut = arguments_text(a.arguments_preview)
    messages = [part for part in a.reason.split("; ") if part] or ["(no message)"]
    return {
        "id": a.id, "principal": a.principal, "tool": a.tool, "arguments": args, "cut": cut,
        "reasons": [(message, holding_rules(policy, a, message)) for message in messages],
        "policy_version": a.policy_version, "request_id": a.request_id, "created": rfc3339(a.created_at),
        "expires_at": a.expires_at, "expires": rfc3339(a.expires_at), "left": max(0, int(a.expires_at - now)),
    }


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


def ui_routes(gateway: Gateway, guard: HttpAuth | None = None, *, allowed_origins: list[str] | tuple[str, ...] = (),
              sessions: UiSessions | None = None, oidc: OidcSettings | None = None) -> list[BaseRoute]:
    """The `/ui` routes over `gateway`; `guard` (the HTTP front's `HttpAuth`) checks logins when given,
    `oidc` adds `Log in with SSO`."""
    env = templates()
    sessions = sessions or UiSessions()
    sso = OidcLogin(oidc, sessions.store) if oidc is not None else None
    authenticate = guard_login(guard) if guard is not None else api_key_login(gateway)
    view = LedgerView(gateway)
    verify_now = Verifier(view)
    trusted_origins = frozenset(allowed_origins)

    # ---- the request's session and principal ---------------------------------------------

    def cookie_name(request: Request) -> str:
        return f"__Host-{COOKIE}" if request.url.scheme == "https" else COOKIE

    async def current(request: Request) -> tuple[UiSession, Principal] | None:
        session = await sessions.get(request.cookies.get(cookie_name(request)))
        if session is None:
            return None
        principal = gateway.principal_for(session.credentials)
        if principal is None:  # the key or principal left the policy: the session is over
            await sessions.end(session.id)
            return None
        return session, principal

    async def require(request: Request, roles: frozenset[str], what: str) -> tuple[UiSession, Principal]:
        found = await current(request)
        if found is None:
            raise Refused(401, "log in first", to_login=True)
        if not roles & set(found[1].roles):
            raise Refused(403, f"{what} needs a principal with role {' or '.join(sorted(roles))}; "
                               f"{found[1].id} has {', '.join(found[1].roles) or 'no roles'}")
        return found

    def same_origin(request: Request) -> None:
        """A POST must come from this page: its Origin (or, without one, Sec-Fetch-Site) says so."""
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is None:
            if request.headers.get("sec-fetch-site") == "same-origin":
                return
            raise Refused(403, "the request has no Origin header; submit the form from the page")
        if origin != own and origin not in trusted_origins:
            raise Refused(403, f"the Origin {origin[:100]!r} may not post to this page")

    async def form(request: Request) -> dict[str, str]:
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

    def checked_post(found: tuple[UiSession, Principal], request: Request, fields: dict[str, str]) -> None:
        same_origin(request)
        if not found[0].csrf_ok(fields.get("csrf")):
            log.warning("ui.csrf_refused", principal=found[1].id, path=request.url.path)
            raise Refused(403, "the form's CSRF token is missing or wrong; reload the page and try again")

    # ---- rendering -------------------------------------------------------------------------

    async def page(request: Request, name: str, found: tuple[UiSession, Principal] | None, status: int = 200,
                   **values: Any) -> HTMLResponse:
        session, principal = found if found is not None else (None, None)
        roles = set(principal.roles) if principal is not None else set()
        flash = await sessions.take_flash(session) if session is not None and status == 200 else None
        body = env.get_template(name).render(
            prefix=PREFIX, principal=principal, csrf=session.csrf if session else "", flash=flash,
            can_approve=bool(roles & APPROVE_ROLES), can_audit=bool(roles & AUDIT_ROLES),
            policy_version=gateway.policy.version, path=request.url.path, **values)
        return HTMLResponse(body, status_code=status, headers=HEADERS)

    def guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Answer a Refused with an error page (401: to the login page, for a GET)."""

        async def answer(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Refused as exc:
                if exc.to_login and request.method == "GET" and not request.url.path.endswith("/events"):
                    return RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
                log.info("ui.refused", path=request.url.path, status=exc.status, reason=exc.message)
                return await page(request, "error.html", await current(request), status=exc.status, message=exc.message)
            except (LedgerError, ConfigError) as exc:
                log.error("ui.ledger_failed", path=request.url.path, error=str(exc))
                return await page(request, "error.html", await current(request), status=500,
                                  message=f"the ledger cannot answer: {exc}")
            except StoreUnavailable as exc:  # the session store: nobody is logged in until it answers
                log.error("ui.sessions_unavailable", path=request.url.path, error=str(exc))
                return await page(request, "error.html", None, status=503, message=f"the login sessions cannot be read: {exc}")

        return answer

    # ---- login ------------------------------------------------------------------------------

    def landing(principal: Principal | None) -> Response:
        """To the login form, or to the first page this principal's roles open."""
        if principal is None:
            return RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
        roles = set(principal.roles)
        target = "approvals" if roles & APPROVE_ROLES else "overview" if roles & AUDIT_ROLES else "policy"
        return RedirectResponse(f"{PREFIX}/{target}", status_code=303, headers=HEADERS)

    async def home(request: Request) -> Response:
        found = await current(request)
        return landing(found[1] if found is not None else None)

    async def login_form(request: Request, message: str = "", status: int = 200) -> Response:
        token = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(24)
        response = await page(request, "login.html", None, status=status, login_csrf=token, message=message,
                              sso=sso is not None)
        response.set_cookie(LOGIN_COOKIE, token, max_age=900, path=f"{PREFIX}/login", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def login(request: Request) -> Response:
        if request.method == "GET":
            if await current(request) is not None:
                return await home(request)
            return await login_form(request)
        same_origin(request)
        fields = await form(request)
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(fields.get("csrf", "").encode(), expected.encode()):
            raise Refused(403, "the login form's CSRF token is missing or wrong; reload the login page")
        token = fields.get("token", "").strip()
        if not token:
            return await login_form(request, "Enter an API key or a bearer token.", 400)
        result = await authenticate(token)
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
        await start_session(request, response, result.credentials, result.principal, result.method or "api_key")
        response.delete_cookie(LOGIN_COOKIE, path=f"{PREFIX}/login")
        return response

    def no_role(principal: Principal) -> str:
        return f"{principal.id} may not use this page: it needs role approver, auditor or admin."

    async def start_session(request: Request, response: Response, credentials: Credentials, principal: Principal,
                            method: str) -> None:
        """The session cookie every way of logging in ends with."""
        session = await sessions.create(credentials)
        log.info("ui.login", principal=principal.id, method=method)
        response.set_cookie(cookie_name(request), session.id, max_age=int(session.expires_at - time.time()), path="/",
                            httponly=True, samesite="strict", secure=request.url.scheme == "https")

    # ---- single sign-on (OpenID Connect) ---------------------------------------------------------

    def flow_cookie(request: Request) -> str:
        return f"__Host-{OIDC_COOKIE}" if request.url.scheme == "https" else OIDC_COOKIE

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
        response = HTMLResponse(env.get_template("signed_in.html").render(
            prefix=PREFIX, target=target, who=principal.id, policy_version=gateway.policy.version),
                                headers=HEADERS)
        await start_session(request, response, credentials, principal, "oidc")
        response.delete_cookie(flow_cookie(request), path="/", httponly=True, samesite="lax", secure=request.url.scheme == "https")
        return response

    async def logout(request: Request) -> Response:
        found = await current(request)
        if found is not None:
            checked_post(found, request, await form(request))
            await sessions.end(found[0].id)
            log.info("ui.logout", principal=found[1].id)
        response = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
        response.delete_cookie(cookie_name(request), path="/", httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")
        return response

    # ---- approvals --------------------------------------------------------------------------

    async def pending() -> list[Approval]:
        items = await gateway.approvals.pending(time.time())
        return sorted(items, key=lambda a: (a.created_at, a.id), reverse=True)

    async def approvals(request: Request) -> Response:
        found = await require(request, APPROVE_ROLES, "the approvals page")
        now = time.time()
        return await page(request, "approvals.html", found, items=[approval_view(a, now, gateway.policy) for a in await pending()])

    async def events(request: Request) -> Response:
        found = await require(request, APPROVE_ROLES, "the approvals stream")
        session_id = found[0].id
        item = env.get_template("_approval.html")

        async def stream() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            started = last_sent = anyio.current_time()
            shown: tuple[str, ...] | None = None
            while anyio.current_time() - started < STREAM_SECONDS:
                again = await current(request)
                if again is None or again[0].id != session_id or not APPROVE_ROLES & set(again[1].roles):
                    yield b"event: logout\ndata: {}\n\n"
                    return
                items = await pending()
                ids = tuple(a.id for a in items)
                if ids != shown:
                    now = time.time()
                    data = {"items": [{"id": a.id, "html": item.render(a=approval_view(a, now, gateway.policy), csrf=again[0].csrf, prefix=PREFIX)}
                                      for a in items]}
                    yield b"event: pending\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
                    shown, last_sent = ids, anyio.current_time()
                elif anyio.current_time() - last_sent > KEEPALIVE_SECONDS:
                    yield b": keep-alive\n\n"
                    last_sent = anyio.current_time()
                await anyio.sleep(POLL_SECONDS)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={**HEADERS, "x-accel-buffering": "no"})

    async def decide(request: Request) -> Response:
        found = await require(request, APPROVE_ROLES, "approving or denying")
        fields = await form(request)
        checked_post(found, request, fields)
        approval_id, action = request.path_params["id"], fields.get("action")
        if action not in ("approve", "deny"):
            raise Refused(400, "the form's `action` must be approve or deny")
        reason = fields.get("reason", "").strip()
        try:
            decided = await gateway.decide(approval_id, approve=action == "approve", by=found[1].id, via="ui", reason=reason)
        except KeyError:
            raise Refused(404, f"there is no approval {approval_id}") from None
        except ApprovalRefused as exc:
            raise Refused(403, str(exc)) from None
        except ValueError as exc:
            raise Refused(409, str(exc)) from None
        log.info("approval.decided", approval_id=approval_id, state=decided.state, by=found[1].id, via="ui")
        await sessions.set_flash(found[0], f"{approval_id} ({decided.tool} for {decided.principal}): {decided.state}")
        return RedirectResponse(f"{PREFIX}/approvals", status_code=303, headers=HEADERS)

    # ---- the ledger ---------------------------------------------------------------------------

    async def ledger(request: Request) -> Response:
        found = await require(request, AUDIT_ROLES, "the ledger")
        values = {k: v for k, v in request.query_params.items() if v}
        error, rows, cursor = None, [], None
        try:
            query: RecordsQuery = parse_query(RecordsQuery, request, drop_empty=True)
            if "limit" not in values:
                query = query.model_copy(update={"limit": LEDGER_PAGE})
            rows, cursor = await view.page(query)
        except BadQuery as exc:
            error = str(exc)
        checkpoint = await view.checkpoint()
        more = None
        if cursor is not None:
            more = f"{PREFIX}/ledger?" + urlencode({**values, "cursor": str(cursor)})
        return await page(request, "ledger.html", found, status=400 if error else 200, error=error, rows=rows, values=values,
                    choices=query_choices(), checkpoint=checkpoint, more=more)

    async def record(request: Request) -> Response:
        found = await require(request, AUDIT_ROLES, "the ledger")
        seq = request.path_params["seq"]
        doc = await view.record(seq)
        if doc is None:
            raise Refused(404, f"there is no record {seq} in the ledger")
        keys = gateway.keys
        try:
            verified, ok = check_inclusion(base64.b64decode(doc["record"]), doc["inclusion"], doc["inclusion"]["checkpoint"],
                                           keys.checkpoint_key.public_key(), keys.checkpoint_key_name), True
        except (LedgerError, KeyError, ValueError) as exc:
            verified, ok = str(exc), False
        return await page(request, "record.html", found, doc=doc, entry=doc["entry"], proof=doc["inclusion"], verified=verified, ok=ok)

    # ---- the overview --------------------------------------------------------------------------

    def chosen_range(value: str | None) -> str:
        if value is None or value == "":
            return DEFAULT_RANGE
        if value not in RANGES:
            raise Refused(400, f"range {value[:20]!r} is not one of: {', '.join(RANGES)}")
        return value

    async def overview(request: Request) -> Response:
        found = await require(request, AUDIT_ROLES, "the overview")
        key = chosen_range(request.query_params.get("range"))
        got = await aggregate(view, RANGES[key])
        ov = got.overview
        verified = await anyio.to_thread.run_sync(last_verification, view)
        return await page(request, "overview.html", found, ov=ov, size=got.size, charts=charts(ov), ranges=list(RANGES),
                          since=utc_text(ov.since), until=utc_text(ov.until), per=bucket_text(ov.step),
                          read_since=utc_text(ov.read_since) if ov.read_since else "",
                          range=key, verified=verified, p50=fmt_ms(ov.latency(50)), p99=fmt_ms(ov.latency(99)),
                          fmt_ms=fmt_ms, max_records=settings_of(view).overview_max_records)

    async def verify(request: Request) -> Response:
        found = await require(request, AUDIT_ROLES, "verifying the ledger")
        fields = await form(request)
        checked_post(found, request, fields)
        key = chosen_range(fields.get("range"))
        try:
            result = await verify_now(found[1].id)
        except VerifyBusy as exc:
            raise Refused(409, str(exc)) from None
        except ValueError as exc:
            raise Refused(413, str(exc)) from None
        said = (f"Verified: {result.size} records intact" if result.ok else
                f"Verification FAILED at record {result.first_bad_seq}: {result.problem}")
        await sessions.set_flash(found[0], said)
        return RedirectResponse(f"{PREFIX}/overview?range={key}", status_code=303, headers=HEADERS)

    # ---- the policy ---------------------------------------------------------------------------

    async def policy(request: Request) -> Response:
        found = await require(request, UI_ROLES, "the policy page")
        return await page(request, "policy.html", found, policy=gateway.policy, policy_status=gateway.policy_status())

    routes: list[BaseRoute] = [
        Route(PREFIX, guarded(home), methods=["GET"]),
        Route(f"{PREFIX}/", guarded(home), methods=["GET"]),
        Route(f"{PREFIX}/login", guarded(login), methods=["GET", "POST"]),
        Route(f"{PREFIX}/logout", guarded(logout), methods=["POST"]),
        Route(f"{PREFIX}/oidc/login", guarded(sso_login), methods=["GET"]),
        Route(OIDC_CALLBACK, guarded(sso_callback), methods=["GET"]),
        Route(f"{PREFIX}/approvals", guarded(approvals), methods=["GET"]),
        Route(f"{PREFIX}/approvals/events", guarded(events), methods=["GET"]),
        Route(PREFIX + "/approvals/{id}/decide", guarded(decide), methods=["POST"]),
        Route(f"{PREFIX}/overview", guarded(overview), methods=["GET"]),
        Route(f"{PREFIX}/overview/verify", guarded(verify), methods=["POST"]),
        Route(f"{PREFIX}/ledger", guarded(ledger), methods=["GET"]),
        Route(PREFIX + "/ledger/{seq:int}", guarded(record), methods=["GET"]),
        Route(f"{PREFIX}/policy", guarded(policy), methods=["GET"]),
        Mount(f"{PREFIX}/static", app=StaticFiles(directory=HERE / "static"), name="ui-static"),
    ]
    return routes
