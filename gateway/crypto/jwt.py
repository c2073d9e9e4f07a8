"""Bearer JWTs: a strict pre-parse, the issuer's JWKS, then PyJWT for the signature and the claims.

`JwtVerifier` checks a token the way an OAuth 2.1 resource server must. PyJWT (`jwt.decode`, with
explicit `algorithms`, `audience`, `issuer`, `leeway` and required claims) verifies the signature
and `iss`, `aud`, `exp`, `nbf`, `iat`. Before it sees the token, the gateway refuses what PyJWT
would let through: more than 16 KiB; base64url that is padded or not canonical (one spelling per
token); duplicate members or NaN in the header or the claims; `crit`; a `typ` that is not a JWT
access token; an `alg` outside the allow-list (asymmetric RFC 7518/8037 only: `none` and HS* never);
NumericDate claims that are not finite JSON numbers. Keys come from the issuer's `Jwks` (a file or
an https URL, cached, reloaded on an unknown `kid`), are parsed by PyJWT's `PyJWK` and kept only if
they are public signing keys (RSA of at least 2048 bits); a key is used only for the algorithms
its type and curve fit, which is what stops algorithm confusion.

It says nothing about HTTP: reading credentials from requests and answering 401/403 is
`gateway.transports.http_auth`'s job. The pre-parse is pure; `Jwks` reads its file or URL.
"""

from __future__ import annotations

import ipaddress
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import jwt
import structlog
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.exceptions import InvalidJTIError, InvalidSubjectError

from gateway.crypto import strict_json
from gateway.crypto.b64 import Base64urlError, b64url_decode
from gateway.crypto.strict_json import StrictJSONError

log = structlog.get_logger()

MAX_TOKEN_BYTES = 16_384
MAX_JWKS_BYTES = 1_048_576
MIN_RSA_BITS = 2048


class TokenInvalid(Exception):
    """The presented JWT cannot be accepted; the message says why (never shown in a header)."""


class JwksUnavailable(Exception):
    """The issuer's keys could not be loaded and none are cached: the token cannot be checked."""


# ---- the strict pre-parse (RFC 7515/7518/8037), pure ----------------------------------------

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey

#: The accepted algorithms: name → (key type, curve; None = any the key type allows).
ALGORITHMS: dict[str, tuple[str, str | None]] = {
    "RS256": ("RSA", None), "RS384": ("RSA", None), "RS512": ("RSA", None),
    "PS256": ("RSA", None), "PS384": ("RSA", None), "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"), "ES384": ("EC", "P-384"), "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),
}
#: The PyJWT algorithm that parses a JWK of this (kty, crv); other keys are never used.
_PARSED_AS = {
    ("RSA", None): "RS256", ("EC", "P-256"): "ES256", ("EC", "P-384"): "ES384", ("EC", "P-521"): "ES512",
    ("OKP", "Ed25519"): "EdDSA", ("OKP", "Ed448"): "EdDSA",
}
_PUBLIC_MEMBERS = ("kty", "crv", "n", "e", "x", "y")
_NUMERIC_DATES = ("exp", "nbf", "iat")
_JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")
_ACCESS_TOKEN_TYPES = ("jwt", "at+jwt", "application/at+jwt")


@dataclass(frozen=True, slots=True)
class Jwk:
    """One public signing key from a JWKS."""

    kid: str | None
    kty: str
    crv: str | None
    alg: str | None
    key: PublicKey

    def fits(self, alg: str) -> bool:
        """Key type (and curve) must be what the algorithm needs: this is what stops alg confusion."""
        spec = ALGORITHMS.get(alg)
        if spec is None or self.kty != spec[0] or self.alg not in (None, alg):
            return False
        return spec[1] is None or self.crv == spec[1]


def _object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = strict_json.loads(raw)
    except StrictJSONError as exc:
        raise TokenInvalid(f"{what} has a duplicate member" if exc.kind == "duplicate" else f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise TokenInvalid(f"{what} is not a JSON object")
    return value


def _segment(text: str, what: str) -> bytes:
    try:
        return b64url_decode(text, what)
    except Base64urlError as exc:
        raise TokenInvalid(str(exc)) from None


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments, the first an encoded JSON object: tell a JWT from an API key."""
    return bool(_JWT_SHAPE.fullmatch(token))


def split_jws(token: str) -> tuple[dict[str, Any], bytes]:
    """(JOSE header, payload bytes) of a compact JWS whose three parts are canonical base64url; nothing verified yet."""
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenInvalid("token is too long")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenInvalid("not a compact JWS (three dot-separated parts)")
    header = _object(_segment(parts[0], "JOSE header"), "JOSE header")
    payload = _segment(parts[1], "payload")
    _segment(parts[2], "signature")
    return header, payload


def claims_set(payload: bytes) -> dict[str, Any]:
    """The claims as a JSON object without duplicate members, its NumericDates finite JSON numbers
    (PyJWT would take `"123"`, `true` or 10**400)."""
    claims = _object(payload, "JWT claims set")
    for name in _NUMERIC_DATES:
        if name not in claims:
            continue
        value = claims[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TokenInvalid(f"`{name}` is not a number")
        try:
            finite = math.isfinite(float(value))
        except OverflowError:
            finite = False
        if not finite:
            raise TokenInvalid(f"`{name}` is out of range")
    return claims


def parse_jwk(obj: Any) -> Jwk | None:
    """A public signing key (parsed by PyJWT's `PyJWK`), or None for entries the gateway never uses
    (symmetric, encryption, unknown types and curves, RSA under 2048 bits, malformed)."""
    if not isinstance(obj, dict) or obj.get("use", "sig") != "sig":
        return None
    ops = obj.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        return None
    kty, crv, kid, alg = obj.get("kty"), obj.get("crv"), obj.get("kid"), obj.get("alg")
    if not all(isinstance(v, (str, type(None))) for v in (kty, crv, kid, alg)):
        return None
    parsed_as = _PARSED_AS.get((kty, None if kty == "RSA" else crv))
    if parsed_as is None:
        return None
    try:
        key = jwt.PyJWK({k: obj[k] for k in _PUBLIC_MEMBERS if k in obj}, algorithm=parsed_as).key
    except (jwt.PyJWTError, ValueError, TypeError):
        return None
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        return None
    return Jwk(kid, kty, crv if isinstance(crv, str) else None, alg, key)


def parse_jwks(raw: bytes) -> tuple[Jwk, ...]:
    try:
        doc = _object(raw, "JWKS")
    except TokenInvalid as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(doc.get("keys"), list):
        raise ValueError("JWKS has no `keys` list")
    return tuple(k for k in (parse_jwk(item) for item in doc["keys"]) if k is not None)


# ---- the issuer's keys ---------------------------------------------------------------------


def is_loopback(host: str | None) -> bool:
    """`localhost`, a `*.localhost` name or a loopback IP address (the one place plain http is allowed)."""
    if not host:
        return False
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Jwks:
    """The issuer's signing keys, from a file or a URL, cached for `ttl` seconds.

    A token whose `kid` is unknown triggers one reload (keys rotate), at most once per
    `min_refetch` seconds so that random kids cannot make the gateway hammer the issuer. When a
    reload fails the cached keys stay in use; with none cached, `JwksUnavailable`.
    """

    def __init__(
        self,
        source: str | Path,
        *,
        ttl: float = 300.0,
        min_refetch: float = 10.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url: str | None = None
        self.path: Path | None = None
        if isinstance(source, str) and "://" in source:
            parts = urlsplit(source)
            if parts.scheme not in ("https", "http") or not parts.hostname:
                raise ValueError(f"JWKS URL {source!r}: must be https://")
            if parts.scheme == "http" and not is_loopback(parts.hostname):
                raise ValueError(f"JWKS URL {source!r}: plain http is allowed only on a loopback host")
            self.url = source
        else:
            self.path = Path(source).expanduser()
        if ttl <= 0 or min_refetch < 0 or timeout <= 0:
            raise ValueError("JWKS ttl and timeout must be positive, min_refetch not negative")
        self.ttl, self.min_refetch, self.timeout, self.clock = ttl, min_refetch, timeout, clock
        self._keys: tuple[Jwk, ...] | None = None
        self._loaded_at = float("-inf")
        self._expires = float("-inf")
        self._lock = anyio.Lock()
        if self.path is not None:  # a file is read now, so a bad one stops the server at startup
            self._keys = parse_jwks(self.path.read_bytes())
            self._loaded_at = self._expires = clock()
            self._expires += ttl

    async def candidates(self, kid: str | None, alg: str) -> list[Jwk]:
        """Keys that may have signed a token with this `kid` and `alg`."""
        now = self.clock()
        if self._keys is None or now >= self._expires:
            await self._reload(now)
        found = self._match(kid, alg)
        if not found and kid is not None and now - self._loaded_at >= self.min_refetch:
            await self._reload(now)
            found = self._match(kid, alg)
        return found

    def _match(self, kid: str | None, alg: str) -> list[Jwk]:
        return [k for k in self._keys or () if (kid is None or k.kid == kid) and k.fits(alg)]

    async def _reload(self, now: float) -> None:
        async with self._lock:
            if self._loaded_at >= now:  # another request reloaded while this one waited
                return
            try:
                keys = parse_jwks(await self._read())
            except (OSError, ValueError, httpx.HTTPError) as exc:
                log.warning("jwks.reload_failed", source=self.url or str(self.path), error=str(exc), cached=self._keys is not None)
                self._loaded_at, self._expires = now, now + max(self.min_refetch, 1.0)
                if self._keys is None:
                    raise JwksUnavailable(f"cannot load the issuer's keys: {exc}") from exc
                return
            self._keys, self._loaded_at, self._expires = keys, now, now + self.ttl
            log.info("jwks.loaded", source=self.url or str(self.path), keys=len(keys))

    async def _read(self) -> bytes:
        if self.path is not None:
            return await anyio.Path(self.path).read_bytes()
        assert self.url is not None
        async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as client:
            async with client.stream("GET", self.url, headers={"accept": "application/json"}) as response:
                response.raise_for_status()
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        raise ValueError(f"JWKS is over {MAX_JWKS_BYTES} bytes")
                return bytes(body)


_ISSUER = "token was issued by an issuer this gateway does not trust"
_AUDIENCE = "token's audience is not this gateway"
_MISSING = {"iss": _ISSUER, "aud": _AUDIENCE}
_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "token has expired"),
    (jwt.ImmatureSignatureError, "token is not valid yet"),
    (jwt.InvalidIssuerError, _ISSUER),
    (jwt.InvalidAudienceError, _AUDIENCE),
    (InvalidSubjectError, "`sub` is not a string"),
    (InvalidJTIError, "`jti` is not a string"),
)
#: Claims every token must carry (PyJWT's `require`); `nbf` and `iat` are checked when present.
REQUIRED_CLAIMS = ("exp", "iss", "aud")


def _reason(exc: jwt.PyJWTError) -> str:
    """What PyJWT refused, in the gateway's words (the 401 message and the tests name these)."""
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return _MISSING.get(exc.claim, f"token has no `{exc.claim}`")
    return next((reason for kind, reason in _REASONS if isinstance(exc, kind)), str(exc) or type(exc).__name__)


class JwtVerifier:
    """Verify a bearer JWT: the strict pre-parse, a key from the JWKS, then PyJWT's signature and claims checks."""

    def __init__(
        self,
        jwks: Jwks,
        *,
        issuer: str | Sequence[str],
        audience: str | Sequence[str],
        algorithms: Iterable[str] = tuple(ALGORITHMS),
        leeway: float = 30.0,
    ) -> None:
        self.jwks = jwks
        self.issuers = frozenset([issuer] if isinstance(issuer, str) else issuer)
        self.audiences = frozenset(a.rstrip("/") for a in ([audience] if isinstance(audience, str) else audience))
        self.algorithms = frozenset(algorithms)
        if not self.issuers or not self.audiences:
            raise ValueError("JWT validation needs at least one issuer and one audience")
        unknown = self.algorithms - set(ALGORITHMS)
        if unknown or not self.algorithms:
            raise ValueError(f"unsupported JWT algorithm(s) {sorted(unknown)}; supported: {', '.join(ALGORITHMS)}")
        if not 0 <= leeway <= 300:
            raise ValueError("leeway must be between 0 and 300 seconds")
        self.leeway = leeway
        # PyJWT compares exactly: a tuple (never a str, which would match substrings in some
        # versions) of the issuers, and each audience with and without one trailing slash.
        self._issuer = tuple(sorted(self.issuers))
        self._audience = tuple(sorted(self.audiences | {a + "/" for a in self.audiences}))
        self._options = {"require": list(REQUIRED_CLAIMS), "enforce_minimum_key_length": True}

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims once signature, issuer, audience and validity period all check out."""
        header, payload = split_jws(token)
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise TokenInvalid(f"algorithm {str(alg)[:20]!r} is not accepted")
        if "crit" in header:
            raise TokenInvalid("token has critical header parameters this gateway does not understand")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in _ACCESS_TOKEN_TYPES):
            raise TokenInvalid("token is not a JWT access token (`typ`)")
        if kid is not None and not isinstance(kid, str):
            raise TokenInvalid("`kid` is not a string")
        claims_set(payload)
        keys = await self.jwks.candidates(kid, alg)
        if not keys:
            raise TokenInvalid("no key of the issuer matches the token's `kid` and `alg`")
        for key in keys:
            try:
                return jwt.decode(
                    token,
                    key.key,
                    algorithms=[a for a in sorted(self.algorithms) if key.fits(a)],
                    audience=self._audience,
                    issuer=self._issuer,
                    leeway=self.leeway,
                    options=self._options,
                )
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError as exc:
                raise TokenInvalid(_reason(exc)) from None
        raise TokenInvalid("bad signature")


__all__ = [
    "ALGORITHMS", "MAX_JWKS_BYTES", "MAX_TOKEN_BYTES", "MIN_RSA_BITS", "REQUIRED_CLAIMS", "Jwk", "Jwks",
    "JwksUnavailable", "JwtVerifier", "PublicKey", "TokenInvalid", "claims_set", "is_loopback", "looks_like_jwt",
    "parse_jwk", "parse_jwks", "split_jws",
]
