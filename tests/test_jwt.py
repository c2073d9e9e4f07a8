"""The JWT verifier on PyJWT, with real keys and real JWKS files.

Two things are proved here: the gateway's strict pre-parse refuses tokens that PyJWT on its own
accepts (each case asserts both), and PyJWT's checks run with the gateway's issuers, audiences,
leeway, required claims and key set (keys PyJWK alone cannot parse, several keys per kid)."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed448, rsa

from gateway.crypto.jwt import Jwks, JwtVerifier, TokenInvalid, parse_jwk
from tests.test_http_auth import ISSUER, KEYS_, OTHER_RSA, RESOURCE, b64, claims, jwk, jwks_doc, sign, token

RSA_PUBLIC = KEYS_["rsa"].public_key()
SMALL_RSA = rsa.generate_private_key(public_exponent=65537, key_size=1024)
ED448 = ed448.Ed448PrivateKey.generate()


def verifier_for(tmp_path: Path, *keys: dict[str, Any], **options: Any) -> JwtVerifier:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks_doc(*keys)))
    return JwtVerifier(Jwks(str(path)), **{"issuer": ISSUER, "audience": RESOURCE, **options})


def raw_token(header: str, payload: str, *, private: Any = None, alg: str = "RS256") -> str:
    """A token whose header and claims are sent as these exact JSON texts."""
    signing_input = f"{b64(header.encode())}.{b64(payload.encode())}"
    return f"{signing_input}.{b64(sign(private or KEYS_['rsa'], alg, signing_input.encode()))}"


def pyjwt_accepts(t: str, key: Any = RSA_PUBLIC) -> dict[str, Any]:
    """What PyJWT alone makes of the token, checked as strictly as PyJWT can be asked to."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short RSA key only warns
        return pyjwt.decode(t, key, algorithms=["RS256"], audience=RESOURCE, issuer=ISSUER, options={"require": ["exp", "iss", "aud"]})


NOW = int(time.time())
DAY = 86_400  # tokens built at import stay valid however long the suite runs before using them
HEADER = '{"alg":"RS256","typ":"JWT","kid":"rsa-1"}'
CLAIMS = '"iss":"%s","aud":"%s","exp":%d' % (ISSUER, RESOURCE, NOW + DAY)

PYJWT_ALONE_ACCEPTS: dict[str, tuple[Callable[[], str], str]] = {
    "padded-signature": (lambda: token() + "==", "signature is not base64url"),
    "duplicate-claim": (lambda: raw_token(HEADER, '{%s,"sub":"reader","sub":"admin"}' % CLAIMS), "JWT claims set has a duplicate member"),
    "duplicate-header-member": (lambda: raw_token('{"alg":"RS256","typ":"JWT","kid":"rsa-1","kid":"rsa-1"}', "{%s}" % CLAIMS), "JOSE header has a duplicate member"),
    "nan-claim": (lambda: raw_token(HEADER, '{%s,"score":NaN}' % CLAIMS), "JWT claims set is not JSON"),
    "exp-as-string": (lambda: token(claims(exp=str(NOW + DAY))), "`exp` is not a number"),
    "nbf-as-boolean": (lambda: token(claims(nbf=True)), "`nbf` is not a number"),
    "exp-beyond-float": (lambda: token(claims(exp=10**400)), "`exp` is out of range"),
    "typ-not-a-jwt": (lambda: token(typ="dpop+jwt"), "`typ`"),
    "crit-b64": (lambda: token(crit=["b64"], b64=True), "critical header parameters"),
}


@pytest.mark.parametrize("name", list(PYJWT_ALONE_ACCEPTS))
async def test_pre_parse_refuses_what_pyjwt_alone_accepts(tmp_path: Path, name: str) -> None:
    make, reason = PYJWT_ALONE_ACCEPTS[name]
    t = make()
    assert pyjwt_accepts(t)["iss"] == ISSUER
    with pytest.raises(TokenInvalid, match=reason):
        await verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1")).verify(t)


async def test_rsa_keys_under_2048_bits_are_never_used(tmp_path: Path) -> None:
    t = token(signer=SMALL_RSA, kid="small")
    assert pyjwt_accepts(t, SMALL_RSA.public_key())["sub"] == "operator"
    assert parse_jwk(jwk(SMALL_RSA, "small")) is None
    with pytest.raises(TokenInvalid, match="no key"):
        await verifier_for(tmp_path, jwk(SMALL_RSA, "small")).verify(t)


async def test_issuer_is_matched_exactly_never_as_a_substring(tmp_path: Path) -> None:
    verifier = verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1"))
    for near in (ISSUER[:-1], "idp.example", ISSUER + "/", ""):
        with pytest.raises(TokenInvalid, match="issuer this gateway does not trust"):
            await verifier.verify(token(claims(iss=near)))
    two = verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1"), issuer=["https://other.example", ISSUER])
    assert (await two.verify(token()))["iss"] == ISSUER


async def test_leeway_and_iat_reach_pyjwt(tmp_path: Path) -> None:
    strict = verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1"), leeway=0)
    with pytest.raises(TokenInvalid, match="token has expired"):
        await strict.verify(token(claims(exp=int(time.time()) - 5)))
    with pytest.raises(TokenInvalid, match="token is not valid yet"):
        await strict.verify(token(claims(iat=int(time.time()) + 60)))
    lenient = verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1"), leeway=120)
    assert (await lenient.verify(token(claims(iat=int(time.time()) + 60))))["sub"] == "operator"


@pytest.mark.parametrize(("claim", "reason"), [("exp", "no `exp`"), ("iss", "issuer"), ("aud", "audience")])
async def test_required_claims(tmp_path: Path, claim: str, reason: str) -> None:
    with pytest.raises(TokenInvalid, match=reason):
        await verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1")).verify(token(claims(**{claim: None})))


async def test_ed448_keys_verify_although_pyjwk_cannot_infer_their_algorithm(tmp_path: Path) -> None:
    raw = ED448.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    doc = {"kty": "OKP", "crv": "Ed448", "x": b64(raw), "kid": "ed448-1", "use": "sig"}
    with pytest.raises(pyjwt.PyJWTError):
        pyjwt.PyJWK(doc)
    t = token(signer=ED448, alg="EdDSA", kid="ed448-1")
    assert (await verifier_for(tmp_path, doc).verify(t))["sub"] == "operator"


async def test_every_key_under_a_kid_is_tried_and_a_private_jwk_is_used_as_its_public_half(tmp_path: Path) -> None:
    exported = pyjwt.algorithms.RSAAlgorithm.to_jwk(KEYS_["rsa"], as_dict=True)
    private = {**{k: v for k, v in exported.items() if k != "key_ops"}, "kid": "shared"}
    assert "d" in private
    parsed = parse_jwk(private)
    assert parsed is not None and isinstance(parsed.key, rsa.RSAPublicKey)
    verifier = verifier_for(tmp_path, jwk(OTHER_RSA, "shared"), private)
    assert (await verifier.verify(token(kid="shared")))["sub"] == "operator"
    with pytest.raises(TokenInvalid, match="bad signature"):
        await verifier.verify(token(kid="shared", signer=rsa.generate_private_key(public_exponent=65537, key_size=2048)))


async def test_a_key_published_for_one_algorithm_is_not_used_for_another(tmp_path: Path) -> None:
    verifier = verifier_for(tmp_path, jwk(KEYS_["rsa"], "rsa-1", alg="RS256"))
    assert (await verifier.verify(token()))["sub"] == "operator"
    with pytest.raises(TokenInvalid, match="no key"):
        await verifier.verify(token(alg="PS256"))
