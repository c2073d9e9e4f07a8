"""Bearer JWTs: compact-JWS parsing, the issuer's JWKS, and signature and claim verification.

`JwtVerifier` checks a token the way an OAuth 2.1 resource server must: an accepted asymmetric
algorithm (RFC 7518/8037; `none`, HS* and algorithm confusion are refused because the key type
must fit the algorithm), a key from the issuer's `Jwks` (a file or an https URL, cached, reloaded
on an unknown `kid`), then `iss`, `aud`, `exp`/`nbf`. Done with `cryptography`, no JOSE library.

It says nothing about HTTP: reading credentials from requests and answering 401/403 is
`gateway.transports.http_auth`'s job. The JWS helpers are pure; `Jwks` reads its file or URL.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import httpx
import structlog
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

log = structlog.get_logger()

MAX_TOKEN_BYTES = 16_384
MAX_JWKS_BYTES = 1_048_576


class TokenInvalid(Exception):
    """The presented JWT cannot be accepted; the message says why (never shown in a header)."""


class JwksUnavailable(Exception):
    """The issuer's keys could not be loaded and none are cached: the token cannot be checked."""


# ---- JWS (RFC 7515/7518/8037), pure --------------------------------------------------------

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey


@dataclass(frozen=True, slots=True)
class _Alg:
    kty: Literal["RSA", "EC", "OKP"]
    hash: type[hashes.HashAlgorithm] | None = None
    crv: str | None = None
    pss: bool = False


ALGORITHMS: dict[str, _Alg] = {
    "RS256": _Alg("RSA", hashes.SHA256), "RS384": _Alg("RSA", hashes.SHA384), "RS512": _Alg("RSA", hashes.SHA512),
    "PS256": _Alg("RSA", hashes.SHA256, pss=True), "PS384": _Alg("RSA", hashes.SHA384, pss=True),
    "PS512": _Alg("RSA", hashes.SHA512, pss=True),
    "ES256": _Alg("EC", hashes.SHA256, "P-256"), "ES384": _Alg("EC", hashes.SHA384, "P-384"),
    "ES512": _Alg("EC", hashes.SHA512, "P-521"),
    "EdDSA": _Alg("OKP"),
}
_CURVES: dict[str, tuple[ec.EllipticCurve, int]] = {"P-256": (ec.SECP256R1(), 32), "P-384": (ec.SECP384R1(), 48), "P-521": (ec.SECP521R1(), 66)}
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")


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
        if spec is None or self.kty != spec.kty or self.alg not in (None, alg):
            return False
        return spec.crv is None or self.crv == spec.crv


def b64url_decode(text: str, *, strict: bool = True) -> bytes:
    """Base64url without padding. Strict (tokens): non-canonical encodings are refused, so a token
    has one spelling. Lenient (JWKS members): trailing `=` padding is tolerated."""
    if not strict:
        text = text.rstrip("=")
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise TokenInvalid("malformed base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if strict and base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii") != text:
        raise TokenInvalid("malformed base64url (non-canonical)")
    return data


def _object(raw: bytes, what: str) -> dict[str, Any]:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise TokenInvalid(f"{what} has a duplicate member")
        return dict(pairs)

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=unique, parse_constant=no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TokenInvalid(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise TokenInvalid(f"{what} is not a JSON object")
    return value


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments, the first an encoded JSON object: tell a JWT from an API key."""
    return bool(_JWT_SHAPE.fullmatch(token))


def split_jws(token: str) -> tuple[dict[str, Any], bytes, bytes, bytes]:
    """(header, payload bytes, signing input, signature) of a compact JWS; nothing verified yet."""
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenInvalid("token is too long")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenInvalid("not a compact JWS (three dot-separated parts)")
    header = _object(b64url_decode(parts[0]), "JOSE header")
    return header, b64url_decode(parts[1]), f"{parts[0]}.{parts[1]}".encode("ascii"), b64url_decode(parts[2])


def parse_jwk(obj: Any) -> Jwk | None:
    """A public signing key, or None for entries the gateway never uses (symmetric, encryption, unknown)."""
    if not isinstance(obj, dict) or obj.get("use", "sig") != "sig":
        return None
    ops = obj.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        return None
    kty, crv, kid, alg = obj.get("kty"), obj.get("crv"), obj.get("kid"), obj.get("alg")
    if not isinstance(kid, (str, type(None))) or not isinstance(alg, (str, type(None))):
        return None
    try:
        key: PublicKey
        if kty == "RSA":
            n, e = (int.from_bytes(b64url_decode(obj[k], strict=False), "big") for k in ("n", "e"))
            key = rsa.RSAPublicNumbers(e, n).public_key()
            if key.key_size < 2048:
                return None
        elif kty == "EC" and crv in _CURVES:
            curve, size = _CURVES[crv]
            x, y = b64url_decode(obj["x"], strict=False), b64url_decode(obj["y"], strict=False)
            if len(x) != size or len(y) != size:
                return None
            key = ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"), curve).public_key()
        elif kty == "OKP" and crv == "Ed25519":
            key = ed25519.Ed25519PublicKey.from_public_bytes(b64url_decode(obj["x"], strict=False))
        elif kty == "OKP" and crv == "Ed448":
            key = ed448.Ed448PublicKey.from_public_bytes(b64url_decode(obj["x"], strict=False))
        else:
            return None
    except (KeyError, TypeError, ValueError, TokenInvalid):
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


def verify_signature(alg: str, jwk: Jwk, signing_input: bytes, signature: bytes) -> bool:
    spec = ALGORITHMS[alg]
    try:
        if isinstance(jwk.key, rsa.RSAPublicKey) and spec.hash is not None:
            pad: padding.AsymmetricPadding = (
                padding.PSS(padding.MGF1(spec.hash()), padding.PSS.DIGEST_LENGTH) if spec.pss else padding.PKCS1v15()
            )
            jwk.key.verify(signature, signing_input, pad, spec.hash())
        elif isinstance(jwk.key, ec.EllipticCurvePublicKey) and spec.hash is not None and spec.crv is not None:
            size = _CURVES[spec.crv][1]
            if len(signature) != 2 * size:
                return False
            r, s = int.from_bytes(signature[:size], "big"), int.from_bytes(signature[size:], "big")
            jwk.key.verify(encode_dss_signature(r, s), signing_input, ec.ECDSA(spec.hash()))
        elif isinstance(jwk.key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
            jwk.key.verify(signature, signing_input)
        else:
            return False
    except InvalidSignature:
        return False
    return True


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(number := float(value)):
            raise TokenInvalid(f"`{name}` is not a number")
    except OverflowError:
        raise TokenInvalid(f"`{name}` is out of range") from None
    return number


def check_claims(claims: Mapping[str, Any], *, issuers: frozenset[str], audiences: frozenset[str], now: float, leeway: float) -> None:
    """Issuer, audience (RFC 8707: this gateway), expiry and not-before, with `leeway` seconds of skew."""
    iss = claims.get("iss")
    if not isinstance(iss, str) or iss not in issuers:
        raise TokenInvalid("token was issued by an issuer this gateway does not trust")
    aud = claims.get("aud")
    given = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if not {a.rstrip("/") for a in given if isinstance(a, str)} & audiences:
        raise TokenInvalid("token's audience is not this gateway")
    exp, nbf = _number(claims, "exp"), _number(claims, "nbf")
    _number(claims, "iat")
    if exp is None:
        raise TokenInvalid("token has no `exp`")
    if now >= exp + leeway:
        raise TokenInvalid("token has expired")
    if nbf is not None and now + leeway < nbf:
        raise TokenInvalid("token is not valid yet")


# ---- the issuer's keys ---------------------------------------------------------------------


def _is_loopback(host: str | None) -> bool:
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
            if parts.scheme == "http" and not _is_loopback(parts.hostname):
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


class JwtVerifier:
    """Verify a bearer JWT: an accepted asymmetric algorithm, a key from the JWKS, then the claims."""

    def __init__(
        self,
        jwks: Jwks,
        *,
        issuer: str | Sequence[str],
        audience: str | Sequence[str],
        algorithms: Iterable[str] = tuple(ALGORITHMS),
        leeway: float = 30.0,
        clock: Callable[[], float] = time.time,
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
        self.leeway, self.clock = leeway, clock

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims once signature, issuer, audience and validity period all check out."""
        header, payload, signing_input, signature = split_jws(token)
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise TokenInvalid(f"algorithm {str(alg)[:20]!r} is not accepted")
        if "crit" in header:
            raise TokenInvalid("token has critical header parameters this gateway does not understand")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ("jwt", "at+jwt", "application/at+jwt")):
            raise TokenInvalid("token is not a JWT access token (`typ`)")
        if kid is not None and not isinstance(kid, str):
            raise TokenInvalid("`kid` is not a string")
        keys = await self.jwks.candidates(kid, alg)
        if not keys:
            raise TokenInvalid("no key of the issuer matches the token's `kid` and `alg`")
        if not any(verify_signature(alg, k, signing_input, signature) for k in keys):
            raise TokenInvalid("bad signature")
        claims = _object(payload, "JWT claims set")
        check_claims(claims, issuers=self.issuers, audiences=self.audiences, now=self.clock(), leeway=self.leeway)
        return claims


__all__ = [
    "ALGORITHMS", "MAX_JWKS_BYTES", "MAX_TOKEN_BYTES", "Jwk", "Jwks", "JwksUnavailable", "JwtVerifier", "PublicKey",
    "TokenInvalid", "b64url_decode", "check_claims", "looks_like_jwt", "parse_jwk", "parse_jwks", "split_jws",
    "verify_signature",
]
