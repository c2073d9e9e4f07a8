"""`Log in with SSO` for /ui: the OpenID Connect authorization-code flow with PKCE (S256), `state` and `nonce`.

- Discovery: `{issuer}/.well-known/openid-configuration`, read on the first login (a provider that is
  down does not stop the gateway) and kept for an hour; its `issuer` must be the configured one.
- `begin`: a fresh `state`, `nonce` and PKCE verifier, kept in the `/ui` session store (this process,
  or Redis shared by every replica) under a random flow id that the browser holds in a short-lived
  cookie (so a callback only completes the login this browser began, on whichever replica it reaches).
- `finish`: the flow is taken out of the store in one step (one use only, on any replica), `state` compared in constant time, the code sent
  once to the token endpoint with the verifier (httpx), and the ID token checked by the gateway's
  `JwtVerifier` (signature against the provider's JWKS, `iss`, `aud` = client_id, `exp`), then
  `nonce` and `azp`; its claims are mapped to a principal exactly as bearer JWTs are.

Every refusal is an `OidcRefused` naming why; no code, token, verifier or secret is put in it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.config import OidcSettings
from gateway.core.call import VerifiedJwt
from gateway.core.errors import ConfigError
from gateway.crypto.jwt import Jwks, JwksUnavailable, JwtVerifier, TokenInvalid, is_loopback
from gateway.stores.base import OidcFlowRecord, UiSessionStore
from gateway.stores.memory import MemoryUiSessionStore
from gateway.transports.http_auth import verified_jwt

log = structlog.get_logger()

FLOW_SECONDS = 600.0
"""How long a begun login may take at the provider before its callback is refused."""
DISCOVERY_SECONDS = 3600.0
HTTP_TIMEOUT = 10.0
MAX_RESPONSE_BYTES = 1_048_576


class OidcRefused(Exception):
    """The login cannot complete: `status` and a message for the page and the log (never a secret)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ProviderMetadata(BaseModel):
    """The parts of the provider's discovery document the flow uses (OpenID Connect Discovery 1.0 §3)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    id_token_signing_alg_values_supported: list[str]
    code_challenge_methods_supported: list[str] | None = None
    token_endpoint_auth_methods_supported: list[str] = ["client_secret_basic"]
    authorization_response_iss_parameter_supported: bool = False


class TokenResponse(BaseModel):
    """The token endpoint's answer (RFC 6749 §5.1 with OpenID Connect's `id_token`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id_token: str
    token_type: str


def s256(verifier: str) -> str:
    """The PKCE S256 code challenge of `verifier` (RFC 7636 §4.2)."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()


def endpoint_url(value: str, what: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise OidcRefused(502, f"the provider's {what} {value[:200]!r} is not an absolute URL")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise OidcRefused(502, f"the provider's {what} {value[:200]!r} is plain http on a non-loopback host")
    return value


def read_secret(settings: OidcSettings) -> str | None:
    """The client secret: from the environment (via settings) or `client_secret_file`; None for a public client."""
    if settings.client_secret is not None:
        return settings.client_secret.get_secret_value()
    if settings.client_secret_file is None:
        return None
    path = settings.client_secret_file.expanduser()
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"ui.oidc.client_secret_file {path}: cannot read it: {exc}") from None
    if not secret:
        raise ConfigError(f"ui.oidc.client_secret_file {path}: the file is empty")
    return secret


def id_token_verifier(settings: OidcSettings, jwks: Jwks, algorithms: list[str]) -> JwtVerifier:
    """The gateway's JWT verifier, set for this client's ID tokens: the issuer, `aud` = client_id."""
    return JwtVerifier(jwks, issuer=settings.issuer, audience=settings.client_id, algorithms=algorithms,
                       leeway=settings.leeway_seconds)


class OidcLogin:
    """The OpenID Connect client of the approvals page (see the module docstring)."""

    def __init__(self, settings: OidcSettings, flows: UiSessionStore | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        """`flows`: where logins under way are kept (the `/ui` session store; this process's memory unless given)."""
        self.settings = settings
        self.secret = read_secret(settings)
        self.clock = clock
        self.flows: UiSessionStore = flows if flows is not None else MemoryUiSessionStore(clock=clock)
        self._metadata: ProviderMetadata | None = None
        self._verifier: JwtVerifier | None = None
        self._fetched_at = float("-inf")

    # ---- discovery ---------------------------------------------------------------------------

    async def _json(self, response: httpx.Response, what: str) -> Any:
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise OidcRefused(502, f"the provider's {what} is over {MAX_RESPONSE_BYTES} bytes")
        try:
            return response.json()
        except ValueError:
            raise OidcRefused(502, f"the provider's {what} is not JSON (HTTP {response.status_code})") from None

    async def metadata(self) -> tuple[ProviderMetadata, JwtVerifier]:
        """The discovery document and an ID-token verifier over its JWKS (fetched again after an hour)."""
        if self._metadata is not None and self._verifier is not None and self.clock() - self._fetched_at < DISCOVERY_SECONDS:
            return self._metadata, self._verifier
        url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT, follow_redirects=False) as client:
                response = await client.get(url, headers={"accept": "application/json"})
        except httpx.HTTPError as exc:
            raise OidcRefused(502, f"the identity provider's discovery document {url} cannot be read: {exc}") from None
        if response.status_code != 200:
            raise OidcRefused(502, f"the identity provider's discovery document {url} answered HTTP {response.status_code}")
        try:
            doc = ProviderMetadata.model_validate(await self._json(response, "discovery document"))
        except ValidationError as exc:
            raise OidcRefused(502, f"the identity provider's discovery document {url} is incomplete: "
                                   f"{'; '.join(str(e['loc'][0]) + ': ' + e['msg'] for e in exc.errors()[:3])}") from None
        if doc.issuer != self.settings.issuer:
            raise OidcRefused(502, f"the discovery document names issuer {doc.issuer[:200]!r}, not the configured {self.settings.issuer!r}")
        if doc.code_challenge_methods_supported is not None and "S256" not in doc.code_challenge_methods_supported:
            raise OidcRefused(502, "the identity provider does not support PKCE S256")
        for what in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            endpoint_url(getattr(doc, what), what)
        algorithms = [a for a in self.settings.algorithms if a in doc.id_token_signing_alg_values_supported]
        if not algorithms:
            raise OidcRefused(502, f"the provider signs ID tokens with {doc.id_token_signing_alg_values_supported}, "
                                   f"none of ui.oidc.algorithms {self.settings.algorithms}")
        self._verifier = id_token_verifier(self.settings, Jwks(doc.jwks_uri), algorithms)
        self._metadata, self._fetched_at = doc, self.clock()
        log.info("ui.oidc_discovered", issuer=self.settings.issuer, algorithms=algorithms)
        return doc, self._verifier

    # ---- the flow ----------------------------------------------------------------------------

    async def begin(self) -> tuple[str, str]:
        """(flow id for the browser's cookie, the provider's authorization URL to send it to)."""
        doc, _ = await self.metadata()
        flow = OidcFlowRecord(state=secrets.token_urlsafe(32), nonce=secrets.token_urlsafe(32),
                              verifier=secrets.token_urlsafe(48), expires_at=self.clock() + FLOW_SECONDS)
        flow_id = secrets.token_urlsafe(32)
        await self.flows.put_flow(flow_id, flow)
        query = {
            "response_type": "code", "client_id": self.settings.client_id, "redirect_uri": self.settings.redirect_url,
            "scope": " ".join(self.settings.scopes), "state": flow.state, "nonce": flow.nonce,
            "code_challenge": s256(flow.verifier), "code_challenge_method": "S256",
        }
        joiner = "&" if urlsplit(doc.authorization_endpoint).query else "?"
        return flow_id, doc.authorization_endpoint + joiner + urlencode(query)

    async def finish(self, flow_id: str | None, params: dict[str, str]) -> VerifiedJwt:
        """The callback: check what came back against the flow this browser began, redeem the code
        once, verify the ID token; the flow is used up whatever the outcome."""
        flow = await self.flows.take_flow(flow_id, self.clock()) if flow_id else None
        if "error" in params:
            described = f" ({params['error_description'][:200]})" if params.get("error_description") else ""
            raise OidcRefused(401, f"the identity provider did not log you in: {params['error'][:100]}{described}")
        if flow is None:
            raise OidcRefused(400, "no SSO login is under way in this browser (it was already completed, took over "
                                   f"{int(FLOW_SECONDS // 60)} minutes, or began in another browser); log in again")
        state, code = params.get("state"), params.get("code")
        if not state:
            raise OidcRefused(400, "the provider's answer has no `state`; log in again")
        if not hmac.compare_digest(state.encode(), flow.state.encode()):
            raise OidcRefused(400, "the `state` does not match the login this browser began (a forged or crossed "
                                   "callback); log in again")
        if not code:
            raise OidcRefused(400, "the provider's answer has no authorization `code`; log in again")
        doc, verifier = await self.metadata()
        if doc.authorization_response_iss_parameter_supported and params.get("iss") != doc.issuer:
            raise OidcRefused(400, "the answer's `iss` is not this provider's (RFC 9207: a mix-up with another provider); log in again")
        id_token = await self._redeem(doc, code, flow)
        return await self.verify_id_token(verifier, id_token, flow.nonce)

    async def verify_id_token(self, verifier: JwtVerifier, id_token: str, nonce: str) -> VerifiedJwt:
        """OpenID Connect Core §3.1.3.7: signature, `iss`, `aud` = client_id and `exp` (the gateway's
        `JwtVerifier`), then `nonce` and `azp`; then the principal mapping bearer JWTs use."""
        try:
            claims = await verifier.verify(id_token)
        except TokenInvalid as exc:
            raise OidcRefused(401, f"the ID token was refused: {exc}") from None
        except JwksUnavailable:
            raise OidcRefused(502, "the identity provider's signing keys are unavailable; try again later") from None
        presented = claims.get("nonce")
        if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), nonce.encode()):
            raise OidcRefused(401, "the ID token's nonce does not match this login (a replayed or injected token)")
        audience, azp = claims.get("aud"), claims.get("azp")
        if (isinstance(audience, list) and len(audience) > 1 or azp is not None) and azp != self.settings.client_id:
            raise OidcRefused(401, "the ID token was issued to another client (`azp`)")
        verified = verified_jwt(claims, self.settings.principal_claim, self.settings.tier_claim, self.settings.tier_map)
        if verified is None:
            raise OidcRefused(401, f"the ID token has no `{self.settings.principal_claim}` to name a principal by")
        return verified

    async def _redeem(self, doc: ProviderMetadata, code: str, flow: OidcFlowRecord) -> str:
        """Exchange the code at the token endpoint (client_secret_basic, or _post, or a public client)."""
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.settings.redirect_url,
                "code_verifier": flow.verifier}
        auth: tuple[str, str] | None = None
        if self.secret is None:
            form["client_id"] = self.settings.client_id
        elif "client_secret_basic" in doc.token_endpoint_auth_methods_supported:
            auth = (self.settings.client_id, self.secret)
        else:
            form.update(client_id=self.settings.client_id, client_secret=self.secret)
        try:
            async with httpx.AsyncClient(timeout=HTTP_TIMEOUT, follow_redirects=False) as client:
                response = await client.post(doc.token_endpoint, data=form, auth=auth, headers={"accept": "application/json"})
        except httpx.HTTPError as exc:
            raise OidcRefused(502, f"the identity provider's token endpoint cannot be reached: {exc}") from None
        body = await self._json(response, "token response")
        if response.status_code != 200:
            error = body.get("error", "?") if isinstance(body, dict) else "?"
            described = body.get("error_description") if isinstance(body, dict) else None
            raise OidcRefused(401, f"the identity provider refused the code: {str(error)[:100]}"
                                   + (f" ({str(described)[:200]})" if described else "") + " (a code is good for one use)")
        try:
            return TokenResponse.model_validate(body).id_token
        except ValidationError:
            raise OidcRefused(502, "the token endpoint's answer has no `id_token` (is `openid` among the scopes?)") from None


__all__ = ["FLOW_SECONDS", "OidcLogin", "OidcRefused", "ProviderMetadata", "TokenResponse", "id_token_verifier", "read_secret", "s256"]
