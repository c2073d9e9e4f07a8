"""The approvals and audit page at `/ui`: server-rendered HTML for approvers, auditors and admins.

`ui_routes` builds the page's state (`web.Ui`) and mounts the routes of `login`, `approvals` and
`audit_pages`; what they share (session, CSRF and origin checks, rendering) is in `web`.

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

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from gateway.config import OidcSettings
from gateway.core.gateway import Gateway
from gateway.transports.http_api.audit import LedgerView
from gateway.transports.http_auth import HttpAuth
from gateway.transports.ui.approvals import approval_routes
from gateway.transports.ui.audit_pages import ledger_routes, overview_routes, policy_routes
from gateway.transports.ui.login import api_key_login, guard_login, login_routes, sso_routes
from gateway.transports.ui.oidc import OidcLogin
from gateway.transports.ui.overview import Verifier
from gateway.transports.ui.sessions import UiSessions
from gateway.transports.ui.web import HERE, PREFIX, Ui, templates


def ui_routes(gateway: Gateway, guard: HttpAuth | None = None, *, allowed_origins: list[str] | tuple[str, ...] = (),
              sessions: UiSessions | None = None, oidc: OidcSettings | None = None) -> list[BaseRoute]:
    """The `/ui` routes over `gateway`; `guard` (the HTTP front's `HttpAuth`) checks logins when given,
    `oidc` adds `Log in with SSO`."""
    sessions = sessions or UiSessions()
    view = LedgerView(gateway)
    ui = Ui(gateway=gateway, guard=guard, env=templates(), sessions=sessions,
            sso=OidcLogin(oidc, sessions.store) if oidc is not None else None,
            authenticate=guard_login(guard) if guard is not None else api_key_login(gateway),
            view=view, verify_now=Verifier(view), trusted_origins=frozenset(allowed_origins))
    return [
        *login_routes(ui),
        *sso_routes(ui),
        *approval_routes(ui),
        *overview_routes(ui),
        *ledger_routes(ui),
        *policy_routes(ui),
        Mount(f"{PREFIX}/static", app=StaticFiles(directory=HERE / "static"), name="ui-static"),
    ]
