"""HTTP authentication with real parts: real RSA/EC/Ed25519 keys, a JWKS file and a JWKS served over
real HTTP, the `HttpAuth` wrapper around a small Starlette app (and around a real Gateway), driven
through httpx's ASGI transport."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from structlog.testing import capture_logs

from gateway.core.call import Credentials, ToolCall, VerifiedJwt
from gateway.config import load_settings
from gateway.transports.http_auth import (
    HttpAuth,
    Jwks,
    credentials_in,
    http_auth_options,
    looks_like_jwt,
    protected_resource_routes,
)
from gateway.policy.compile import load_policy
from gateway.stages.tier_gate import authenticate
from tests.conftest import KEYS, OpenGateway, write_policy

RESOURCE = "https://gw.example/mcp"
METADATA = "https://gw.example/.well-known/oauth-protected-resource/mcp"
ISSUER = "https://idp.example"
MISSING = f'Bearer resource_metadata="{METADATA}"'
INVALID = f'Bearer error="invalid_token", resource_metadata="{METADATA}"'


# ---- keys and tokens -----------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def uint(n: int, size: int | None = None) -> str:
    return b64(n.to_bytes(size or (n.bit_length() + 7) // 8, "big"))


KEYS_ = {
    "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ec": ec.generate_private_key(ec.SECP256R1()),
    "ed": ed25519.Ed25519PrivateKey.generate(),
}
OTHER_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(private: Any, kid: str, **extra: Any) -> dict[str, Any]:
    public = private.public_key()
    if isinstance(public, rsa.RSAPublicKey):
        nums = public.public_numbers()
        doc = {"kty": "RSA", "n": uint(nums.n), "e": uint(nums.e)}
    elif isinstance(public, ec.EllipticCurvePublicKey):
        nums = public.public_numbers()
        doc = {"kty": "EC", "crv": "P-256", "x": uint(nums.x, 32), "y": uint(nums.y, 32)}
    else:
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        doc = {"kty": "OKP", "crv": "Ed25519", "x": b64(raw)}
    return {**doc, "kid": kid, "use": "sig", **extra}


def jwks_doc(*keys: dict[str, Any]) -> dict[str, Any]:
    return {"keys": list(keys)}


DEFAULT_JWKS = jwks_doc(jwk(KEYS_["rsa"], "rsa-1"), jwk(KEYS_["ec"], "ec-1"), jwk(KEYS_["ed"], "ed-1"))


def sign(private: Any, alg: str, data: bytes) -> bytes:
    if alg == "RS256":
        return private.sign(data, padding.PKCS1v15(), hashes.SHA256())
    if alg == "PS256":
        return private.sign(data, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    if alg == "ES256":
        r, s = decode_dss_signature(private.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")
    if alg == "EdDSA":
        return private.sign(data)
    raise AssertionError(alg)


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": ISSUER, "aud": RESOURCE, "sub": "operator", "iat": now, "exp": now + 300, "scope": "mcp"}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def token(
    body: dict[str, Any] | str | None = None,
    *,
    key: str = "rsa",
    alg: str = "RS256",
    kid: str | None = "rsa-1",
    signer: Any = None,
    **header: Any,
) -> str:
    head = {"alg": alg, "typ": "JWT", **({"kid": kid} if kid else {}), **header}
    payload = body if isinstance(body, str) else json.dumps(claims() if body is None else body)
    signing_input = f"{b64(json.dumps(head).encode())}.{b64(payload.encode())}"
    return f"{signing_input}.{b64(sign(signer or KEYS_[key], alg, signing_input.encode()))}"


# ---- the app under test --------------------------------------------------------------------


async def echo(request: Request) -> Response:
    creds = credentials_in(request.scope)
    principal = request.scope.get("state", {}).get("dharma.principal")
    return JSONResponse(
        {
            "headers": {k.decode(): v.decode() for k, v in request.scope["headers"]},
            "credentials": None if creds is None else {"api_key": creds.api_key, "jwt": None if creds.jwt is None else creds.jwt.subject},
            "principal": None if principal is None else {"id": principal.id, "tier": principal.tier, "roles": list(principal.roles), "claims": principal.claims},
        }
    )


async def strict_endpoint(request: Request) -> Response:
    """Like the /v1 API: answers (and would record) an unauthenticated call itself."""
    creds = credentials_in(request.scope)
    if creds is None or not (creds.api_key or creds.jwt):
        return JSONResponse({"error_code": "unauthenticated"}, status_code=401)
    return await echo(request)


INNER = Starlette(
    routes=[
        Route("/mcp", echo, methods=["GET", "POST"]),
        Route("/v1/tools", strict_endpoint, methods=["GET"]),
        Route("/healthz", echo, methods=["GET"]),
        *protected_resource_routes(RESOURCE, [ISSUER], ["mcp", "mcp:admin"]),
    ]
)


@pytest.fixture(scope="module")
def jwks_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps(DEFAULT_JWKS))
    return path


@pytest.fixture(scope="module")
def resolve(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Credentials], Any]:
    """The real tier gate over the real test profile (principals reader, operator, clinician, admin)."""
    return partial(authenticate, load_policy(write_policy(tmp_path_factory.mktemp("policy"))))


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://gw.example")


@pytest.fixture
async def http(jwks_file: Path, resolve: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = HttpAuth(INNER, resource_url=RESOURCE, jwks=str(jwks_file), issuer=ISSUER, resolve=resolve, allowed_origins=["https://app.example"], defer=["/v1/"])
    async with client(app) as c:
        yield c


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


# ---- valid tokens --------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "alg", "kid"), [("rsa", "RS256", "rsa-1"), ("rsa", "PS256", "rsa-1"), ("ec", "ES256", "ec-1"), ("ed", "EdDSA", "ed-1")])
async def test_valid_token_resolves_principal_and_is_stripped(http: httpx.AsyncClient, key: str, alg: str, kid: str) -> None:
    t = token(claims(dept="eng"), key=key, alg=alg, kid=kid)
    r = await http.post("/mcp", headers={**bearer(t), "x-other": "kept"})
    assert r.status_code == 200, r.text
    seen = r.json()
    assert "authorization" not in seen["headers"] and "x-api-key" not in seen["headers"]
    assert seen["headers"]["x-other"] == "kept"
    assert t not in r.text
    assert seen["credentials"] == {"api_key": None, "jwt": "operator"}
    assert seen["principal"]["id"] == "operator" and seen["principal"]["tier"] == "operator"
    assert seen["principal"]["claims"]["dept"] == "eng" and seen["principal"]["claims"]["iss"] == ISSUER


async def test_leeway_accepts_small_clock_skew(http: httpx.AsyncClient) -> None:
    now = int(time.time())
    assert (await http.post("/mcp", headers=bearer(token(claims(exp=now - 5))))).status_code == 200
    assert (await http.post("/mcp", headers=bearer(token(claims(nbf=now + 5))))).status_code == 200


async def test_audience_list_and_trailing_slash(http: httpx.AsyncClient) -> None:
    assert (await http.post("/mcp", headers=bearer(token(claims(aud=["other", RESOURCE + "/"]))))).status_code == 200


# ---- invalid tokens: 401 invalid_token ------------------------------------------------------


def _hs256_confusion() -> str:
    """HS256 'signed' with the RSA public key (PEM) as the HMAC secret: the classic alg confusion."""
    pem = KEYS_["rsa"].public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': 'rsa-1'}).encode())}.{b64(json.dumps(claims()).encode())}"
    return f"{signing_input}.{b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())}"


def _alg_none() -> str:
    return f"{b64(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}.{b64(json.dumps(claims()).encode())}."


def _bad_signature() -> str:
    head, body, sig = token().split(".")
    return f"{head}.{b64(json.dumps(claims(sub='admin')).encode())}.{sig}"


def _ec_key_rsa_alg() -> str:
    """An RS256 token pointing at the EC key's kid: the key type must fit the algorithm."""
    return token(kid="ec-1")


NOW = int(time.time())
DAY = 86_400  # tokens built at import stay valid however long the suite runs before using them
INVALID_TOKENS: dict[str, tuple[Callable[[], str], str]] = {
    "expired": (lambda: token(claims(exp=int(time.time()) - 120)), "expired"),
    "not-yet-valid": (lambda: token(claims(nbf=int(time.time()) + 120)), "not valid yet"),
    "no-exp": (lambda: token(claims(exp=None)), "no `exp`"),
    "exp-not-a-number": (lambda: token(claims(exp="tomorrow")), "`exp` is not a number"),
    "exp-nan": (lambda: token(json.dumps(claims(exp=float("nan")))), "not JSON"),
    "exp-huge-int": (lambda: token(claims(exp=10**400)), "out of range"),
    "issuer-list": (lambda: token(claims(iss=[ISSUER])), "issuer"),
    "wrong-issuer": (lambda: token(claims(iss="https://evil.example")), "issuer"),
    "wrong-audience": (lambda: token(claims(aud="https://other.example/mcp")), "audience"),
    "no-audience": (lambda: token(claims(aud=None)), "audience"),
    "unknown-kid": (lambda: token(kid="nope"), "no key"),
    "signed-by-other-key": (lambda: token(signer=OTHER_RSA), "bad signature"),
    "bad-signature": (_bad_signature, "bad signature"),
    "alg-none": (_alg_none, "algorithm 'none' is not accepted"),
    "hs256-with-public-key": (_hs256_confusion, "algorithm 'HS256' is not accepted"),
    "rs256-on-ec-key": (_ec_key_rsa_alg, "no key"),
    "crit-header": (lambda: token(crit=["exp"], exp_extra=1), "critical"),
    "typ-not-jwt": (lambda: token(typ="JOSE+JSON"), "`typ`"),
    "duplicate-sub": (lambda: token('{"iss":"%s","aud":"%s","sub":"reader","sub":"admin","exp":%d}' % (ISSUER, RESOURCE, NOW + DAY)), "duplicate"),
    "payload-not-object": (lambda: token("[1,2]"), "not a JSON object"),
    "malformed-base64": (lambda: "eyJhbGciOiJSUzI1NiJ9a.e30.abc", "base64url"),
    "header-not-json": (lambda: b64(b'{"alg": RS256') + ".e30.abc", "not JSON"),
    "not-jwt-shaped": (lambda: "eyJhbGciOiJSUzI1NiJ9.@@@.abc", "unknown API key"),
    "truncated-signature": (lambda: token()[:-10], "bad signature"),
    "no-subject": (lambda: token(claims(sub=None)), "no `sub`"),
}


@pytest.mark.parametrize("name", list(INVALID_TOKENS))
async def test_invalid_token_is_401_invalid_token(http: httpx.AsyncClient, name: str) -> None:
    make, reason = INVALID_TOKENS[name]
    r = await http.post("/mcp", headers=bearer(make()))
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == INVALID
    assert r.json()["error_code"] == "unauthenticated" and reason in r.json()["message"], r.json()


async def test_missing_credentials_401_with_exact_challenge(http: httpx.AsyncClient) -> None:
    for headers in ({}, {"authorization": "Basic YTpi"}, {"authorization": "Bearer "}):
        r = await http.post("/mcp", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == MISSING


async def test_conflicting_credentials_400(http: httpx.AsyncClient) -> None:
    r = await http.post("/mcp", headers={**bearer(KEYS["reader"]), "x-api-key": KEYS["admin"]})
    assert r.status_code == 400 and r.headers["www-authenticate"].startswith('Bearer error="invalid_request"')


# ---- 403 -----------------------------------------------------------------------------------


async def test_valid_token_naming_nobody_is_403_insufficient_scope(http: httpx.AsyncClient) -> None:
    r = await http.post("/mcp", headers=bearer(token(claims(sub="stranger"))))
    assert r.status_code == 403
    assert r.headers["www-authenticate"] == f'Bearer error="insufficient_scope", resource_metadata="{METADATA}"'


async def test_required_scope_missing_is_403_with_scope(jwks_file: Path, resolve: Any) -> None:
    app = HttpAuth(INNER, resource_url=RESOURCE, jwks=str(jwks_file), issuer=ISSUER, resolve=resolve, required_scopes=["mcp:admin"])
    async with client(app) as c:
        r = await c.post("/mcp", headers=bearer(token(claims(scope="mcp"))))
        assert r.status_code == 403
        assert r.headers["www-authenticate"] == f'Bearer error="insufficient_scope", scope="mcp:admin", resource_metadata="{METADATA}"'
        assert (await c.post("/mcp", headers=bearer(token(claims(scope="mcp mcp:admin"))))).status_code == 200
        assert (await c.post("/mcp", headers=bearer(token(claims(scope=None, scp=["mcp:admin"]))))).status_code == 200
        missing = await c.post("/mcp")
        assert missing.headers["www-authenticate"] == f'Bearer scope="mcp:admin", resource_metadata="{METADATA}"'


# ---- Origin --------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://localhost:3000", "https://app.example.evil", "https://app.example:444", "javascript:x"])
async def test_bad_origin_is_403_even_with_valid_token(http: httpx.AsyncClient, origin: str) -> None:
    r = await http.post("/mcp", headers={**bearer(token()), "origin": origin})
    assert r.status_code == 403 and "www-authenticate" not in r.headers


@pytest.mark.parametrize("origin", ["https://app.example", "HTTPS://APP.EXAMPLE:443", "https://gw.example"])
async def test_allowed_origin(http: httpx.AsyncClient, origin: str) -> None:
    assert (await http.post("/mcp", headers={**bearer(token()), "origin": origin})).status_code == 200


async def test_localhost_origins_only_when_bound_to_localhost(resolve: Any) -> None:
    local = HttpAuth(INNER, resource_url="http://127.0.0.1:8765/mcp", resolve=resolve, bind_host="127.0.0.1")
    public = HttpAuth(INNER, resource_url="https://gw.example/mcp", resolve=resolve, bind_host="0.0.0.0")
    headers = {**bearer(KEYS["reader"]), "origin": "http://localhost:6274"}
    async with client(local) as c:
        assert (await c.post("/mcp", headers=headers)).status_code == 200
        assert (await c.post("/mcp", headers={**headers, "origin": "http://[::1]:3000"})).status_code == 200
        assert (await c.post("/mcp", headers={**headers, "origin": "http://attacker.example"})).status_code == 403
    async with client(public) as c:
        assert (await c.post("/mcp", headers=headers)).status_code == 403


# ---- API keys ------------------------------------------------------------------------------


async def test_api_keys_still_work_and_are_stripped(http: httpx.AsyncClient) -> None:
    for headers in (bearer(KEYS["reader"]), {"x-api-key": KEYS["reader"]}, {"authorization": f"Bearer {KEYS['reader']}", "x-api-key": KEYS["reader"]}):
        r = await http.post("/mcp", headers=headers)
        assert r.status_code == 200
        seen = r.json()
        assert seen["principal"]["id"] == "reader" and seen["credentials"]["api_key"] == KEYS["reader"]
        assert not {"authorization", "x-api-key"} & set(seen["headers"])
    r = await http.post("/mcp", headers={"x-api-key": "wrong-key"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == INVALID


async def test_credentials_sent_twice_are_refused_and_proxy_credentials_stripped(http: httpx.AsyncClient) -> None:
    """The one pass over the headers finds every Authorization and X-API-Key (a second of either is
    refused: which one counts would be a guess) and passes on none of the credential headers."""
    for twice in ([("authorization", f"Bearer {KEYS['reader']}"), ("authorization", f"Bearer {KEYS['admin']}")],
                  [("x-api-key", KEYS["reader"]), ("x-api-key", KEYS["reader"])]):
        r = await http.post("/mcp", headers=twice)
        assert r.status_code == 400 and "send one credential, once" in r.text
    r = await http.post("/mcp", headers=[("x-api-key", KEYS["reader"]), ("proxy-authorization", "Basic eDp5"), ("x-other", "kept")])
    assert r.status_code == 200
    seen = r.json()["headers"]
    assert "proxy-authorization" not in seen and seen["x-other"] == "kept"


async def test_without_jwks_a_jwt_looking_bearer_is_an_api_key(resolve: Any) -> None:
    async with client(HttpAuth(INNER, resource_url=RESOURCE, resolve=resolve)) as c:
        assert (await c.post("/mcp", headers=bearer(token()))).status_code == 401
        assert (await c.post("/mcp", headers=bearer(KEYS["admin"]))).json()["principal"]["id"] == "admin"


async def test_anonymous_user_only_without_any_credential(resolve: Any, tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path, principals=[
        {"id": "local", "tier": "reader", "local_user": "alice"},
        {"id": "admin", "tier": "admin", "api_key_sha256": hashlib.sha256(b"admin-key").hexdigest()},
    ]))
    app = HttpAuth(INNER, resource_url=RESOURCE, resolve=partial(authenticate, policy), anonymous={"/mcp": "alice"})
    async with client(app) as c:
        r = await c.post("/mcp")
        assert r.status_code == 200 and r.json()["principal"]["id"] == "local"
        assert (await c.post("/mcp", headers=bearer("admin-key"))).json()["principal"]["id"] == "admin"
        r = await c.post("/mcp", headers=bearer("wrong-key"))  # a bad credential is never downgraded to anonymous
        assert r.status_code == 401 and r.headers["www-authenticate"] == INVALID
    nobody = HttpAuth(INNER, resource_url=RESOURCE, resolve=partial(authenticate, policy), anonymous={"/mcp": "mallory"})
    async with client(nobody) as c:
        assert (await c.post("/mcp")).headers["www-authenticate"] == MISSING


# ---- deferred and unprotected paths --------------------------------------------------------


async def test_deferred_path_lets_the_endpoint_answer_and_adds_the_challenge(http: httpx.AsyncClient) -> None:
    r = await http.get("/v1/tools")
    assert r.status_code == 401 and r.json() == {"error_code": "unauthenticated"} and r.headers["www-authenticate"] == MISSING
    r = await http.get("/v1/tools", headers=bearer(INVALID_TOKENS["expired"][0]()))
    assert r.status_code == 401 and r.headers["www-authenticate"] == INVALID
    r = await http.get("/v1/tools", headers={"x-api-key": "wrong-key", "x-other": "1"})
    assert r.status_code == 200  # this endpoint only checks presence; the pipeline would refuse the key
    assert "x-api-key" not in r.json()["headers"]
    r = await http.get("/v1/tools", headers=bearer(token()))
    assert r.status_code == 200 and r.json()["principal"]["id"] == "operator"


async def test_unprotected_paths_pass_untouched(http: httpx.AsyncClient) -> None:
    r = await http.get("/healthz", headers={"authorization": "Bearer whatever", "origin": "https://evil.example"})
    assert r.status_code == 200 and r.json()["headers"]["authorization"] == "Bearer whatever"
    assert (await http.get("/mcpx")).status_code == 404  # a prefix is matched by path segment


# ---- RFC 9728 metadata ---------------------------------------------------------------------


async def test_protected_resource_metadata(http: httpx.AsyncClient) -> None:
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        r = await http.get(path)
        assert r.status_code == 200
        assert r.json() == {
            "resource": RESOURCE,
            "authorization_servers": [ISSUER],
            "bearer_methods_supported": ["header"],
            "scopes_supported": ["mcp", "mcp:admin"],
        }
    assert METADATA.endswith("/.well-known/oauth-protected-resource/mcp")


# ---- JWKS over real HTTP -------------------------------------------------------------------


class JwksServer:
    """A JWKS endpoint on a free 127.0.0.1 port (http.server in a thread), counting its fetches."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] = jwks_doc(jwk(KEYS_["rsa"], "rsa-1"))
        self.fetches = 0
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.fetches += 1
                body = json.dumps(outer.doc).encode()
                self.send_response(outer.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def jwks_server() -> Iterator[JwksServer]:
    server = JwksServer()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_jwks_url_fetched_cached_and_refetched_once_on_unknown_kid(jwks_server: JwksServer, resolve: Any) -> None:
    clock = FakeClock()
    keys = Jwks(jwks_server.url, ttl=300, min_refetch=10, clock=clock)
    app = HttpAuth(INNER, resource_url=RESOURCE, jwks=keys, issuer=ISSUER, resolve=resolve)
    async with client(app) as c:
        assert jwks_server.fetches == 0  # a URL is fetched lazily
        assert (await c.post("/mcp", headers=bearer(token()))).status_code == 200
        assert (await c.post("/mcp", headers=bearer(token()))).status_code == 200
        assert jwks_server.fetches == 1  # cached

        # the issuer rotates in a new key: the first token with its kid triggers exactly one refetch
        jwks_server.doc = jwks_doc(jwk(KEYS_["rsa"], "rsa-1"), jwk(KEYS_["ec"], "ec-2"))
        clock.now += 11
        assert (await c.post("/mcp", headers=bearer(token(key="ec", alg="ES256", kid="ec-2")))).status_code == 200
        assert jwks_server.fetches == 2

        # unknown kids cannot make the gateway hammer the issuer: one refetch per interval
        for _ in range(3):
            r = await c.post("/mcp", headers=bearer(token(kid="rsa-unknown")))
            assert r.status_code == 401 and r.headers["www-authenticate"] == INVALID
        assert jwks_server.fetches == 2
        clock.now += 11
        assert (await c.post("/mcp", headers=bearer(token(kid="rsa-unknown")))).status_code == 401
        assert jwks_server.fetches == 3

        # the TTL expires: refetched; a key the issuer dropped is no longer accepted
        jwks_server.doc = jwks_doc(jwk(KEYS_["ec"], "ec-2"))
        clock.now += 301
        assert (await c.post("/mcp", headers=bearer(token()))).status_code == 401
        assert jwks_server.fetches == 4


async def test_jwks_url_down_keeps_cached_keys_and_503_without_any(jwks_server: JwksServer, resolve: Any) -> None:
    clock = FakeClock()
    keys = Jwks(jwks_server.url, ttl=60, min_refetch=0, clock=clock)
    with capture_logs() as logs:
        async with client(HttpAuth(INNER, resource_url=RESOURCE, jwks=keys, issuer=ISSUER, resolve=resolve)) as c:
            assert (await c.post("/mcp", headers=bearer(token()))).status_code == 200
            jwks_server.status = 500
            clock.now += 61
            assert (await c.post("/mcp", headers=bearer(token()))).status_code == 200  # stale keys still serve
        fresh = Jwks(jwks_server.url, clock=clock)
        async with client(HttpAuth(INNER, resource_url=RESOURCE, jwks=fresh, issuer=ISSUER, resolve=resolve)) as c:
            r = await c.post("/mcp", headers=bearer(token()))
            assert r.status_code == 503 and r.headers["retry-after"]
    failed = [e for e in logs if e["event"] == "jwks.reload_failed"]
    assert [e["cached"] for e in failed] == [True, False] and failed[0]["log_level"] == "warning"


# ---- mapping a token to a principal --------------------------------------------------------


async def test_tier_claim_maps_an_unlisted_subject_to_a_tier(jwks_file: Path, resolve: Any) -> None:
    app = HttpAuth(
        INNER, resource_url=RESOURCE, jwks=str(jwks_file), issuer=ISSUER, resolve=resolve,
        principal_claim="email", tier_claim="groups", tier_map={"idp-admins": "admin", "idp-readers": "reader"},
    )
    async with client(app) as c:
        r = await c.post("/mcp", headers=bearer(token(claims(email="ana@example.com", groups=["staff", "idp-readers"]))))
        assert r.status_code == 200
        principal = r.json()["principal"]
        assert principal["id"] == "ana@example.com" and principal["tier"] == "reader" and principal["roles"] == []
        assert principal["claims"]["groups"] == ["staff", "idp-readers"]
        r = await c.post("/mcp", headers=bearer(token(claims(email="bob@example.com", groups=["staff"]))))
        assert r.status_code == 403
        # a subject that is a policy principal keeps the policy's tier and roles, whatever the token says
        r = await c.post("/mcp", headers=bearer(token(claims(email="reader", groups=["idp-admins"]))))
        assert r.json()["principal"]["tier"] == "reader"


def test_authenticate_resolves_verified_jwt(tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path, principals=[
        {"id": "clinician", "tier": "clinician", "roles": ["clinician"], "claims": {"dept": "policy-wins"}},
    ]))
    p = authenticate(policy, Credentials(jwt=VerifiedJwt("clinician", {"dept": "token", "x": 1}, tier="admin")))
    assert p is not None and (p.id, p.tier, p.roles) == ("clinician", "clinician", ("clinician",))
    assert p.claims == {"dept": "policy-wins", "x": 1}
    p = authenticate(policy, Credentials(jwt=VerifiedJwt("svc-1", {"sub": "svc-1"}, tier="reader")))
    assert p is not None and (p.id, p.tier, p.roles, p.claims) == ("svc-1", "reader", (), {"sub": "svc-1"})
    assert authenticate(policy, Credentials(jwt=VerifiedJwt("svc-1", {}, tier="no-such-tier"))) is None
    assert authenticate(policy, Credentials(jwt=VerifiedJwt("svc-1", {}))) is None
    assert "token" not in repr(Credentials(jwt=VerifiedJwt("svc-1", {"secret": "token"})))


async def test_jwt_principal_and_claims_reach_the_rules_of_a_real_gateway(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, jwks_file: Path) -> None:
    """End to end: HttpAuth → a governed endpoint → the real pipeline, where a rule reads principal.claims."""
    rules = {
        "apiVersion": "dharma/v1", "kind": "RuleSet", "metadata": {"name": "claims"},
        "rules": [{"id": "eng-only", "tools": ["read_*"], "when": 'principal.claims.dept != "eng"', "effect": "deny", "message": "engineering only"}],
    }
    gw = await open_test_gateway(write_policy(tmp_path / "p", rules=rules))
    (sandbox / "a.txt").write_text("A", encoding="utf-8")

    async def governed(request: Request) -> Response:
        creds = credentials_in(request.scope)
        assert creds is not None and "authorization" not in request.headers
        outcome = (await gw.govern(ToolCall(tool="read_file", arguments={"path": "a.txt"}, request_id=f"r-{time.monotonic_ns()}", credentials=creds))).outcome
        return JSONResponse({"status": outcome.status.value, "message": outcome.message, "code": outcome.error_code})

    app = HttpAuth(Starlette(routes=[Route("/mcp", governed, methods=["POST"])]), resource_url=RESOURCE, jwks=str(jwks_file), issuer=ISSUER, resolve=gw.principal_for)
    async with client(app) as c:
        ok = (await c.post("/mcp", headers=bearer(token(claims(sub="reader", dept="eng"))))).json()
        assert ok["status"] == "ok", ok
        no = (await c.post("/mcp", headers=bearer(token(claims(sub="reader", dept="sales"))))).json()
        assert no == {"status": "blocked", "message": "engineering only", "code": "policy_blocked"}


# ---- configuration and construction --------------------------------------------------------


def test_settings_auth_block_builds_the_middleware(tmp_path: Path, jwks_file: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "jwks.json").write_text(jwks_file.read_text())
    config = tmp_path / "dharma.yaml"
    config.write_text(
        "auth:\n"
        "  resource_url: https://gw.example/mcp\n"
        "  authorization_servers: [https://idp.example]\n"
        "  allowed_origins: [https://app.example]\n"
        "  jwt:\n"
        "    jwks: keys/jwks.json\n"
        "    issuer: https://idp.example\n"
        "    tier_claim: dharma_tier\n"
    )
    settings = load_settings(config, env={})
    assert settings.auth.jwt is not None and settings.auth.jwt.jwks == str(tmp_path / "keys" / "jwks.json")
    assert settings.auth.protect == ["/mcp", "/v1/"] and settings.auth.defer == []  # the guard answers (and records) /v1 too
    options = http_auth_options(settings)
    auth = HttpAuth(INNER, **options)
    assert auth.verifier is not None and auth.verifier.audiences == {RESOURCE} and auth.tier_claim == "dharma_tier"
    assert auth.local_origins and auth.anonymous == {}
    default = http_auth_options(load_settings(None, env={}))
    assert default["resource_url"] == "http://127.0.0.1:8765/mcp" and "jwks" not in default
    moved = http_auth_options(load_settings(None, env={}, overrides={"mcp": {"path": "/agents/mcp", "anonymous_user": "alice"}}))
    assert moved["protect"] == ["/mcp", "/v1/", "/agents/mcp"] and moved["anonymous"] == {"/agents/mcp": "alice"}
    assert moved["resource_url"] == "http://127.0.0.1:8765/agents/mcp"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"resource_url": "gw.example/mcp"},
        {"resource_url": RESOURCE, "allowed_origins": ["https://app.example/path"]},
        {"resource_url": RESOURCE, "jwks": "https://idp.example/jwks"},  # no issuer
        {"resource_url": RESOURCE, "jwks": "http://idp.example/jwks", "issuer": ISSUER},  # plain http off loopback
        {"resource_url": RESOURCE, "jwks": "/no/such/jwks.json", "issuer": ISSUER},
        {"resource_url": RESOURCE, "jwks": "https://idp.example/jwks", "issuer": ISSUER, "algorithms": ["HS256"]},
        {"resource_url": RESOURCE, "protect": ["mcp"]},
    ],
)
def test_options_are_validated_at_construction(kwargs: dict[str, Any]) -> None:
    with pytest.raises((ValueError, OSError)):
        HttpAuth(INNER, **kwargs)


def test_jwt_shape() -> None:
    assert looks_like_jwt(token()) and looks_like_jwt(_alg_none())
    assert not looks_like_jwt(KEYS["reader"]) and not looks_like_jwt("a.b.c") and not looks_like_jwt("eyJ.a.b.c.d")


async def test_pyjwt_made_tokens_verify(jwks_file: Path, resolve: Any) -> None:
    """Interoperability: a token signed by PyJWT (when installed) is accepted."""
    jwt = pytest.importorskip("jwt")
    t = jwt.encode(claims(), KEYS_["ec"], algorithm="ES256", headers={"kid": "ec-1"})
    async with client(HttpAuth(INNER, resource_url=RESOURCE, jwks=str(jwks_file), issuer=ISSUER, resolve=resolve)) as c:
        assert (await c.post("/mcp", headers=bearer(t))).json()["principal"]["id"] == "operator"


async def test_mangled_tokens_only_ever_fail_as_invalid(jwks_file: Path) -> None:
    """Random damage to a valid token is refused as TokenInvalid: never accepted (base64url must be
    canonical, so no two spellings of one token), never a crash (which would be a 500)."""
    import random

    from gateway.transports.http_auth import JwtVerifier, TokenInvalid

    verifier = JwtVerifier(Jwks(str(jwks_file)), issuer=ISSUER, audience=RESOURCE)
    rng = random.Random(7)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ \\\"{}\u00e9"
    for key, alg, kid in (("rsa", "RS256", "rsa-1"), ("ec", "ES256", "ec-1"), ("ed", "EdDSA", "ed-1")):
        good = token(key=key, alg=alg, kid=kid)
        assert (await verifier.verify(good))["sub"] == "operator"
        for _ in range(200):
            chars = list(good)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(chars))
                op = rng.random()
                if op < 0.5:
                    chars[i] = rng.choice(alphabet)
                elif op < 0.75:
                    del chars[i]
                else:
                    chars.insert(i, rng.choice(alphabet))
            mangled = "".join(chars)
            if mangled == good:  # the edits cancelled out
                continue
            with pytest.raises(TokenInvalid):
                await verifier.verify(mangled)


def test_jwks_parsing_keeps_only_usable_signing_keys() -> None:
    from gateway.transports.http_auth import parse_jwks

    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    padded = jwk(KEYS_["rsa"], "padded")
    padded["n"] += "=" * (-len(padded["n"]) % 4)
    doc = jwks_doc(
        padded,
        jwk(small, "small"),
        jwk(KEYS_["ec"], "enc", use="enc"),
        jwk(KEYS_["ed"], "verify-only", key_ops=["verify"]),
        {"kty": "oct", "k": b64(b"secret"), "kid": "hmac"},
        {"kty": "EC", "crv": "P-256", "x": b64(b"\x01" * 32), "y": b64(b"\x02" * 32), "kid": "off-curve"},
        {"kty": "RSA", "kid": "broken"},
        "not an object",
    )
    keys = parse_jwks(json.dumps(doc).encode())
    assert [k.kid for k in keys] == ["padded", "verify-only"]
    assert keys[0].fits("RS256") and keys[0].fits("PS512") and not keys[0].fits("ES256") and not keys[0].fits("HS256")
    assert keys[1].fits("EdDSA") and not keys[1].fits("RS256")
    with pytest.raises(ValueError):
        parse_jwks(b'{"keys": "nope"}')


def test_routing_answers_follow_the_prefix_rules() -> None:
    """`HttpAuth`'s (protected, anonymous user, deferred) for a path are the prefix rules' own."""
    guard = HttpAuth(Starlette(), resource_url="http://127.0.0.1:8080/mcp", protect=("/mcp", "/v1/"),
                     defer=("/v1/",), anonymous={"/mcp": "alice"})
    assert guard._route("/mcp") == (True, "alice", False)
    assert guard._route("/mcp/x") == (True, "alice", False)
    assert guard._route("/mcpx") == (False, None, False)
    assert guard._route("/v1/tools") == (True, None, True)
    assert guard._route("/v1") == (False, None, False)
