"""HTTP authentication: the gateway as an OAuth 2.1 resource server (MCP authorization, RFC 9728).

`HttpAuth` is a pure ASGI wrapper in front of the protected paths (`/mcp`, `/v1/`). It checks
`Origin`, reads the caller's credentials (`Authorization: Bearer`, `X-API-Key`), has a JWT
verified against the issuer's JWKS (signature, `iss`, `aud`, `exp`/`nbf`: `gateway.crypto.jwt`, on PyJWT), answers
401/403 with `WWW-Authenticate`, and removes the credential headers from the scope before the
endpoint runs, so nothing downstream can forward the client's token upstream. What it found
lands in `scope["state"]`:

- `"dharma.credentials"`: `Credentials` (an API key, or a `VerifiedJwt`; never the raw JWT);
- `"dharma.principal"`: the `Principal` from the `resolve` callable, or None without one;
- `"dharma.auth"`: the `AuthResult` (method, and on a deferred path why it failed).

Every request it refuses itself is counted, and recorded in the karma ledger aggregated per
(source, reason) per interval, through the gateway's `RefusalRecorder` (`gateway.core.refusals`;
what a record says of the request: `gateway.transports.auth_refusals`).

It also serves the RFC 9728 protected-resource metadata routes. It only says who is calling;
every policy decision stays in the pipeline, and token cryptography stays in `gateway.crypto.jwt`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import structlog
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.core.call import Credentials, Principal, VerifiedJwt
from gateway.core.errors import ErrorCode
from gateway.core.refusals import RefusalRecorder
from gateway.crypto.jwt import (
    ALGORITHMS,
    Jwk,
    Jwks,
    JwksUnavailable,
    JwtVerifier,
    TokenInvalid,
    is_loopback,
    looks_like_jwt,
    parse_jwks,
)
from gateway.transports.auth_refusals import bearer_of, record_refusal

if TYPE_CHECKING:
    from gateway.config import AuthSettings, ServerSettings, Settings

log = structlog.get_logger()

METADATA_PATH = "/.well-known/oauth-protected-resource"
STATE_CREDENTIALS, STATE_PRINCIPAL, STATE_AUTH = "dharma.credentials", "dharma.principal", "dharma.auth"
STRIPPED_HEADERS = frozenset({b"authorization", b"proxy-authorization", b"x-api-key"})


# ---- the middleware ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthResult:
    """What `HttpAuth` found. A status other than 200 means it refused (or, on a deferred path, handed
    over) the request; `error` is then the RFC 6750 code, None when no credential was presented, and
    `reason` one of `gateway.core.refusals.REASONS`."""

    credentials: Credentials
    principal: Principal | None = None
    method: Literal["jwt", "api_key"] | None = None
    status: int = 200
    error: str | None = None
    message: str = ""
    scopes: tuple[str, ...] = field(default=())
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


def route_path(scope: Scope) -> str:
    """The request path below the app's mount point (`root_path` removed)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


def metadata_url(resource_url: str) -> str:
    """RFC 9728 §3.1: `/.well-known/oauth-protected-resource` inserted before the resource's path."""
    parts = urlsplit(resource_url)
    return f"{parts.scheme}://{parts.netloc}{METADATA_PATH}{parts.path.rstrip('/')}"


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query or parts.username:
        return None
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


def _quoted(value: str) -> str:
    return '"' + re.sub(r'[^\x20-\x7e]|["\\]', "", value) + '"'


def _scopes_of(claims: Mapping[str, Any]) -> tuple[str, ...]:
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        return tuple(raw.split())
    if isinstance(raw, list):
        return tuple(s for s in raw if isinstance(s, str))
    return ()


def verified_jwt(claims: dict[str, Any], principal_claim: str, tier_claim: str | None,
                 tier_map: Mapping[str, str]) -> VerifiedJwt | None:
    """A verified token's claims as `VerifiedJwt` (its principal claim, and the tier its tier claim
    names after `tier_map`), or None when it names no principal. Bearer JWTs and the page's OIDC
    ID tokens are mapped by this one function."""
    subject = claims.get(principal_claim)
    if not isinstance(subject, str) or not subject:
        return None
    tier = None
    if tier_claim is not None:
        value = claims.get(tier_claim)
        values = [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
        if not tier_map:
            tier = values[0] if len(values) == 1 else None
        else:
            tier = next((t for claim, t in tier_map.items() if claim in values), None)
    return VerifiedJwt(subject, claims, tier)


ErrorBody = Callable[[ErrorCode, str], Mapping[str, Any]]
Resolve = Callable[[Credentials], Principal | None]


def default_error_body(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"error_code": code.value, "message": message, "retryable": code.retryable}


class HttpAuth:
    """Authenticate requests to the protected paths; see the module docstring for what it guarantees.

    Args:
        resource_url: the canonical URL of this gateway's MCP endpoint (RFC 8707 resource); the
            default audience, and the base of the `resource_metadata` URL.
        jwks: a JWKS file path or URL, or a ready `Jwks`; without one, bearer values are API keys.
        issuer / audience / algorithms / leeway: what a JWT must satisfy (audience defaults to
            `resource_url`).
        principal_claim / tier_claim / tier_map: how a verified JWT names its principal and tier.
        resolve: credentials → principal (e.g. `Gateway.principal_for`); with it, an unknown API
            key is a 401 and a valid token that names nobody a 403.
        allowed_origins: browser origins allowed besides the resource's own (and loopback ones
            when `bind_host` is a loopback address).
        protect: path prefixes to guard ("/mcp" also covers "/mcp/…"; "/v1/" is a prefix).
        defer: protected prefixes where a missing or invalid credential is handed to the
            endpoint (which answers and records it); the 401 it returns gets `WWW-Authenticate`.
        anonymous: {path prefix: local user} for callers that present no credential at all
            (e.g. `{"/mcp": "alice"}`); resolved like a stdio user, 401 if it names nobody.
        required_scopes: OAuth scopes every JWT must carry (403 `insufficient_scope` otherwise).
        error_body: builds the JSON body of the answers this wrapper gives itself.
        refusals: where the requests this wrapper refuses are counted and recorded (the gateway's).
        max_body_bytes: the most of a refused request's body read for its record's digest.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        resource_url: str,
        jwks: str | Path | Jwks | None = None,
        issuer: str | Sequence[str] | None = None,
        audience: str | Sequence[str] | None = None,
        algorithms: Iterable[str] = tuple(ALGORITHMS),
        leeway: float = 30.0,
        jwks_cache_seconds: float = 300.0,
        jwks_min_refetch_seconds: float = 10.0,
        principal_claim: str = "sub",
        tier_claim: str | None = None,
        tier_map: Mapping[str, str] | None = None,
        resolve: Resolve | None = None,
        allowed_origins: Iterable[str] = (),
        bind_host: str | None = None,
        protect: Iterable[str] = ("/mcp", "/v1/"),
        defer: Iterable[str] = (),
        anonymous: Mapping[str, str] | None = None,
        required_scopes: Iterable[str] = (),
        error_body: ErrorBody = default_error_body,
        refusals: RefusalRecorder | None = None,
        max_body_bytes: int = 2_097_152,
    ) -> None:
        self.app = app
        parts = urlsplit(resource_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(f"resource_url {resource_url!r}: must be an absolute http(s) URL without query or fragment")
        self.resource_url = resource_url
        self.metadata_url = metadata_url(resource_url)
        self.verifier: JwtVerifier | None = None
        if jwks is not None:
            if issuer is None:
                raise ValueError("JWT validation needs `issuer`")
            keys = jwks if isinstance(jwks, Jwks) else Jwks(jwks, ttl=jwks_cache_seconds, min_refetch=jwks_min_refetch_seconds)
            self.verifier = JwtVerifier(keys, issuer=issuer, audience=audience or resource_url, algorithms=algorithms, leeway=leeway)
        if not principal_claim:
            raise ValueError("principal_claim must name a claim")
        self.principal_claim, self.tier_claim, self.tier_map = principal_claim, tier_claim, dict(tier_map or {})
        self.resolve = resolve
        origins = [(o, _origin_key(o)) for o in allowed_origins]
        bad = [o for o, key in origins if key is None]
        if bad:
            raise ValueError(f"allowed_origins: {bad} are not origins like https://host[:port]")
        self.origins = frozenset(k for _, k in origins if k is not None) | {_origin_key(f"{parts.scheme}://{parts.netloc}")}
        self.local_origins = is_loopback(bind_host)
        self.protect, self.defer = self._prefixes(protect), self._prefixes(defer)
        self.anonymous = dict(anonymous or {})
        self._prefixes(self.anonymous)
        self.required_scopes = tuple(required_scopes)
        self.error_body = error_body
        self.refusals, self.max_body_bytes = refusals, max_body_bytes

    @staticmethod
    def _prefixes(paths: Iterable[str]) -> tuple[str, ...]:
        out = tuple(paths)
        if any(not p.startswith("/") for p in out):
            raise ValueError(f"paths must start with '/': {out}")
        return out

    @staticmethod
    def _under(path: str, prefixes: tuple[str, ...]) -> bool:
        return any(path.startswith(p) if p.endswith("/") else path == p or path.startswith(p + "/") for p in prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        protected, anonymous_user, deferred = self._route(path)
        if not protected:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        raw = scope["headers"]
        headers = Headers(raw=raw)
        origin, authorization, api_keys = headers.get("origin"), headers.getlist("authorization"), headers.getlist("x-api-key")
        kept = [pair for pair in raw if pair[0].lower() not in STRIPPED_HEADERS]
        if origin is not None and not self.origin_allowed(origin):
            log.debug("auth.origin_refused", path=path, origin=origin[:200])
            refused = AuthResult(Credentials(), status=403, message="this Origin may not call the gateway", reason="foreign_origin")
            await self._refuse(scope, receive, send, refused, ErrorCode.FORBIDDEN, authorization, api_keys, challenge=False)
            return
        result = await self._authenticate(authorization, api_keys, anonymous_user)
        if not result.ok:
            log.debug("auth.refused", path=path, status=result.status, error=result.error, reason=result.message, deferred=deferred and result.status == 401)
            if not (deferred and result.status == 401):
                code = {401: ErrorCode.UNAUTHENTICATED, 403: ErrorCode.FORBIDDEN, 503: ErrorCode.BACKEND_UNAVAILABLE}.get(result.status, ErrorCode.INVALID_PARAMS)
                await self._refuse(scope, receive, send, result, code, authorization, api_keys)
                return
            if self.refusals is not None:  # the endpoint answers and records it (per call, e.g. the tool API)
                self.refusals.count(result.reason or "no_credential")
            send = self._challenging(send, self._challenge(result.error))
        scope = dict(scope)
        scope["headers"] = kept
        state = scope.setdefault("state", {})
        state[STATE_CREDENTIALS], state[STATE_PRINCIPAL], state[STATE_AUTH] = result.credentials, result.principal, result
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, result: AuthResult, code: ErrorCode,
                      authorization: list[str], api_keys: list[str], *, challenge: bool = True) -> None:
        """Record the refusal (the first of its record reads the body for its digest), then answer it."""
        if self.refusals is not None:
            await record_refusal(self.refusals, scope, receive, reason=result.reason or "no_credential", status=result.status,
                                 error_code=code.value, authorization=authorization, api_keys=api_keys,
                                 jwt=self.verifier is not None, verified=result.credentials.jwt, max_body_bytes=self.max_body_bytes)
        await self._answer(send, result.status, self._challenge(result.error) if challenge else None, code, result.message)

    def around(self, app: ASGIApp) -> HttpAuth:
        """The same guard (one JWKS cache, one configuration) in front of another app: the
        Starlette stack's middleware, while the MCP path is served by this one directly."""
        clone = copy.copy(self)
        clone.app = app
        return clone

    def origin_allowed(self, origin: str) -> bool:
        """The MCP transport rule against DNS rebinding: a present Origin must be one we trust."""
        key = _origin_key(origin)
        if key is None:
            return False
        return key in self.origins or (self.local_origins and is_loopback(key[1]))

    def _anonymous_user(self, path: str) -> str | None:
        return next((user for prefix, user in self.anonymous.items() if self._under(path, (prefix,))), None)

    def _route(self, path: str) -> tuple[bool, str | None, bool]:
        """(protected, anonymous user, deferred) for `path`."""
        return self._under(path, self.protect), self._anonymous_user(path), self._under(path, self.defer)

    async def authenticate(self, headers: Headers, anonymous_user: str | None = None) -> AuthResult:
        """Read and check the caller's credentials (never raises; failures are in the result)."""
        return await self._authenticate(headers.getlist("authorization"), headers.getlist("x-api-key"), anonymous_user)

    async def _authenticate(self, authorization: list[str], api_keys: list[str], anonymous_user: str | None) -> AuthResult:
        """`authenticate`, given the values of the Authorization and X-API-Key headers."""
        if len(authorization) > 1 or len(api_keys) > 1:
            return AuthResult(Credentials(), status=400, error="invalid_request", message="send one credential, once",
                              reason="credential_repeated")
        bearer = bearer_of(authorization)
        key = api_keys[0].strip() if api_keys else None
        if bearer and key and bearer != key:
            return AuthResult(Credentials(), status=400, error="invalid_request", message="send either Authorization or X-API-Key, not both",
                              reason="credential_conflict")
        if bearer and self.verifier is not None and looks_like_jwt(bearer):
            return await self._jwt(bearer)
        token = bearer or key
        if not token and anonymous_user is not None:
            anonymous = Credentials(local_user=anonymous_user)
            principal = self.resolve(anonymous) if self.resolve is not None else None
            if self.resolve is None or principal is not None:
                return AuthResult(anonymous, principal)
        if not token:
            return AuthResult(Credentials(), status=401, message="no credentials: send Authorization: Bearer <token>", reason="no_credential")
        credentials = Credentials(api_key=token)
        if self.resolve is None:
            return AuthResult(credentials, method="api_key")
        principal = self.resolve(credentials)
        if principal is None:
            return AuthResult(credentials, method="api_key", status=401, error="invalid_token", message="unknown API key", reason="unknown_key")
        return AuthResult(credentials, principal, "api_key")

    async def _jwt(self, token: str) -> AuthResult:
        assert self.verifier is not None
        try:
            claims = await self.verifier.verify(token)
        except TokenInvalid as exc:
            return AuthResult(Credentials(), method="jwt", status=401, error="invalid_token", message=f"invalid token: {exc}", reason="invalid_token")
        except JwksUnavailable:
            return AuthResult(Credentials(), method="jwt", status=503, error="temporarily_unavailable", message="the issuer's keys are unavailable; retry later",
                              reason="jwks_unavailable")
        verified = verified_jwt(claims, self.principal_claim, self.tier_claim, self.tier_map)
        if verified is None:
            return AuthResult(Credentials(), method="jwt", status=401, error="invalid_token", message=f"token has no `{self.principal_claim}`",
                              reason="invalid_token")
        subject = verified.subject
        scopes = _scopes_of(claims)
        credentials = Credentials(jwt=verified)
        missing = [s for s in self.required_scopes if s not in scopes]
        if missing:
            return AuthResult(credentials, None, "jwt", 403, "insufficient_scope", f"token lacks scope(s) {' '.join(missing)}", scopes,
                              "insufficient_scope")
        principal = self.resolve(credentials) if self.resolve is not None else None
        if self.resolve is not None and principal is None:
            return AuthResult(credentials, None, "jwt", 403, "insufficient_scope", f"{subject!r} is not a principal of this gateway's policy", scopes,
                              "unknown_principal")
        return AuthResult(credentials, principal, "jwt", scopes=scopes)

    def _challenge(self, error: str | None) -> str | None:
        if error in (None, "invalid_token", "invalid_request", "insufficient_scope"):
            params = [f"error={_quoted(error)}"] if error else []
            if self.required_scopes and error in (None, "insufficient_scope"):
                params.append(f"scope={_quoted(' '.join(self.required_scopes))}")
            params.append(f"resource_metadata={_quoted(self.metadata_url)}")
            return "Bearer " + ", ".join(params)
        return None

    @staticmethod
    def _challenging(send: Send, challenge: str | None) -> Send:
        """On a deferred path: add the challenge to the endpoint's 401, if it did not set one."""

        async def wrapped(message: Message) -> None:
            if challenge and message["type"] == "http.response.start" and message["status"] == 401:
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"www-authenticate" for k, _ in headers):
                    message = {**message, "headers": [*headers, (b"www-authenticate", challenge.encode("latin-1"))]}
            await send(message)

        return wrapped

    async def _answer(self, send: Send, status: int, challenge: str | None, code: ErrorCode, message: str) -> None:
        body = json.dumps(self.error_body(code, message)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]
        if challenge:
            headers.append((b"www-authenticate", challenge.encode("latin-1")))
        if status == 503:
            headers.append((b"retry-after", b"10"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def credentials_in(scope: Scope) -> Credentials | None:
    """The credentials `HttpAuth` put in the scope, or None when it did not run for this request."""
    found = scope.get("state", {}).get(STATE_CREDENTIALS)
    return found if isinstance(found, Credentials) else None


# ---- RFC 9728 metadata ---------------------------------------------------------------------


def protected_resource_metadata(resource_url: str, authorization_servers: Sequence[str] = (), scopes_supported: Sequence[str] = ()) -> dict[str, Any]:
    doc: dict[str, Any] = {"resource": resource_url}
    if authorization_servers:
        doc["authorization_servers"] = list(authorization_servers)
    doc["bearer_methods_supported"] = ["header"]
    if scopes_supported:
        doc["scopes_supported"] = list(scopes_supported)
    return doc


def protected_resource_routes(resource_url: str, authorization_servers: Sequence[str] = (), scopes_supported: Sequence[str] = ()) -> list[Route]:
    """`GET /.well-known/oauth-protected-resource` at the root and at the RFC 9728 path form (`…/mcp`)."""
    doc = protected_resource_metadata(resource_url, authorization_servers, scopes_supported)
    headers = {"cache-control": "public, max-age=3600", "access-control-allow-origin": "*"}

    async def metadata(request: Request) -> Response:
        return JSONResponse(doc, headers=headers)

    paths = dict.fromkeys([METADATA_PATH, urlsplit(metadata_url(resource_url)).path])
    return [Route(p, metadata, methods=["GET"]) for p in paths]


# ---- from settings -------------------------------------------------------------------------


def resource_url_for(auth: AuthSettings, server: ServerSettings, mcp_path: str = "/mcp") -> str:
    """`auth.resource_url`, else the MCP endpoint at the address the server binds."""
    if auth.resource_url:
        return auth.resource_url
    host = f"[{server.host}]" if ":" in server.host else server.host
    return f"http://{host}:{server.port}{mcp_path}"


def http_auth_options(settings: Settings, *, resolve: Resolve | None = None) -> dict[str, Any]:
    """Keyword arguments for `HttpAuth` from dharma.yaml: the `auth:` block, the server's bind
    address, and the MCP endpoint's path and `anonymous_user`."""
    auth, server = settings.auth, settings.server
    mcp_path: str = getattr(getattr(settings, "mcp", None), "path", "/mcp")
    anonymous_user: str | None = getattr(getattr(settings, "mcp", None), "anonymous_user", None)
    options: dict[str, Any] = {
        "resource_url": resource_url_for(auth, server, mcp_path),
        "allowed_origins": auth.allowed_origins,
        "bind_host": server.host,
        "protect": [*auth.protect, *([] if HttpAuth._under(mcp_path, HttpAuth._prefixes(auth.protect)) else [mcp_path])],
        "defer": auth.defer,
        "anonymous": {mcp_path: anonymous_user} if anonymous_user is not None else {},
        "required_scopes": auth.required_scopes,
        "resolve": resolve,
        "max_body_bytes": server.max_body_bytes,
    }
    if auth.jwt is not None:
        options.update(
            jwks=auth.jwt.jwks,
            issuer=auth.jwt.issuer,
            audience=auth.jwt.audience,
            algorithms=auth.jwt.algorithms,
            leeway=auth.jwt.leeway_seconds,
            jwks_cache_seconds=auth.jwt.jwks_cache_seconds,
            jwks_min_refetch_seconds=auth.jwt.jwks_min_refetch_seconds,
            principal_claim=auth.jwt.principal_claim,
            tier_claim=auth.jwt.tier_claim,
            tier_map=auth.jwt.tier_map,
        )
    return options


__all__ = [
    "ALGORITHMS", "AuthResult", "HttpAuth", "Jwk", "Jwks", "JwksUnavailable", "JwtVerifier", "TokenInvalid",
    "credentials_in", "http_auth_options", "verified_jwt", "looks_like_jwt", "metadata_url", "parse_jwks",
    "protected_resource_metadata", "protected_resource_routes", "resource_url_for",
]
