"""Receipts: compact-JWS receipts built with the gateway's key, and their offline check.

A receipt is a compact JWS (RFC 7515) with an attached payload, signed with Ed25519 (RFC 8037,
alg name per RFC 9864). The payload binds the request, the response as returned and the ledger
position; it never states the decision, so a withheld answer stays indistinguishable (design §5).

Digest rule (signer and verifier apply the same function): ``resp_sha256`` is
``audit.canon.digest(strip_receipt(response))``, where the response is the MCP ``result`` object
(or the HTTP envelope without its ``receipt`` field) exactly as returned. ``strip_receipt`` removes
``_meta["dharma.gateway/receipt"]`` and then removes ``_meta`` itself only if it is left empty.
``req_sha256`` is ``digest(request)``. Both are lowercase hex SHA-256 over RFC 8785 JSON.

Receipts are built and verified without I/O, with ``now`` passed in; the one file this module
reads is a JWKS, in ``load_jwks``. The keys and their files are ``gateway.crypto.keys``'s job.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.canon import digest
from audit.merkle import leaf_hash
from audit.records import StoredRecord
from gateway.core.errors import ConfigError
from gateway.crypto.b64 import Base64urlError, b64url_decode
from gateway.crypto import strict_json
from gateway.crypto.strict_json import StrictJSONError
from gateway.crypto.keys import (
    RECEIPT_ALG,
    RECEIPT_TYP,
    KeyStore,
    check_x,
    jwk_thumbprint,
    read_bytes,
    validate_jwks,
)

__all__ = [
    "RECEIPT_META_KEY",
    "RECEIPT_TYP",
    "RECEIPT_VERSION",
    "KeyStore",
    "ReceiptInvalid",
    "attach_receipt",
    "build_receipt",
    "check_receipt_in_ledger",
    "jwk_thumbprint",
    "load_jwks",
    "strip_receipt",
    "verify_receipt",
]

RECEIPT_META_KEY = "dharma.gateway/receipt"
RECEIPT_VERSION = 1

# RFC 9864 deprecates the polymorphic "EdDSA"; older signers still emit it for Ed25519 keys, so a
# verifier accepts it as an alias. This module only ever emits "Ed25519".
_ACCEPTED_ALGS = frozenset({"Ed25519", "EdDSA"})


class ReceiptInvalid(Exception):
    """A receipt failed verification; the message says which check failed."""


# --- token parts and keys -----------------------------------------------------------------------


def _part(text: str, what: str) -> bytes:
    """One part of a receipt, strict base64url (one spelling per token), as `ReceiptInvalid`."""
    try:
        return b64url_decode(text, what)
    except Base64urlError as exc:
        raise ReceiptInvalid(f"malformed token: {exc}") from exc


@functools.lru_cache(maxsize=256)
def _public_key(x: str) -> Ed25519PublicKey:
    """Build (once per ``x``, already checked by ``check_x``) the public key; ``from_public_bytes`` is slow."""
    return Ed25519PublicKey.from_public_bytes(b64url_decode(x, "x"))


# --- receipts -----------------------------------------------------------------------------------


def strip_receipt(response: Any) -> Any:
    """Return ``response`` minus ``_meta["dharma.gateway/receipt"]``: what the digest covers.

    The rule, shared by signer and verifier: if ``response`` is a dict whose ``_meta`` is a dict,
    drop the receipt key from ``_meta``, then drop ``_meta`` if it is empty. Everything else is
    kept exactly as returned. The input is never mutated; only the changed dicts are copied.
    """
    if not isinstance(response, dict):
        return response
    meta = response.get("_meta")
    if not isinstance(meta, dict) or (meta and RECEIPT_META_KEY not in meta):
        return response
    stripped = {k: v for k, v in response.items() if k != "_meta"}
    rest = {k: v for k, v in meta.items() if k != RECEIPT_META_KEY}
    if rest:
        stripped["_meta"] = rest
    return stripped


def attach_receipt(result: dict[str, Any], token: str) -> dict[str, Any]:
    """Return a copy of ``result`` with the receipt merged into ``_meta``; other keys are kept.

    Raises:
        ValueError: ``result["_meta"]`` exists but is not an object.
    """
    meta = result.get("_meta")
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise ValueError(f"result _meta is a {type(meta).__name__}, not an object")
    return {**result, "_meta": {**meta, RECEIPT_META_KEY: token}}


def _rfc3339(now: datetime) -> str:
    u = now.astimezone(timezone.utc)
    return f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}.{u.microsecond // 1000:03d}Z"


def build_receipt(
    keys: KeyStore,
    *,
    request_id: str,
    request: Any,
    response: Any,
    ledger_seq: int,
    ledger_hash: str,
    now: datetime,
    response_sha256: str | None = None,
    request_sha256: str | None = None,
) -> str:
    """Sign a receipt binding the request, the response as returned and its ledger record.

    ``response_sha256`` / ``request_sha256`` may carry digests the caller already computed
    (of the response without receipt, of the request), so each is canonicalised once per call.

    ``response`` may already carry a receipt key; it is excluded by ``strip_receipt``. The payload
    carries no decision field, by design (§5).

    Raises:
        ValueError: ``now`` is naive, or the request/response is not canonical JSON.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    active = keys.active  # one snapshot: the payload kid and the signing key always agree
    payload = {
        "v": RECEIPT_VERSION,
        "kid": active.kid,
        "iat": int(now.timestamp()),
        "time": _rfc3339(now),
        "request_id": request_id,
        "req_sha256": request_sha256 or digest(request),
        "resp_sha256": response_sha256 or digest(strip_receipt(response)),
        "ledger": {"seq": ledger_seq, "hash": ledger_hash},
    }
    return active.sign(payload)


def _find_key(jwks: Mapping[str, Any], kid: str) -> Ed25519PublicKey:
    keys = jwks.get("keys") if isinstance(jwks, Mapping) else None
    if not isinstance(keys, list):
        raise ReceiptInvalid("JWKS has no 'keys' list")
    for jwk in keys:
        if isinstance(jwk, Mapping) and jwk.get("kid") == kid:
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                raise ReceiptInvalid(f"kid {kid!r} is not an Ed25519 OKP key in the JWKS")
            if jwk.get("alg", RECEIPT_ALG) not in _ACCEPTED_ALGS or jwk.get("use", "sig") != "sig":
                raise ReceiptInvalid(f"kid {kid!r} is not an Ed25519 signing key in the JWKS")
            x = check_x(jwk.get("x"))
            if x is None:
                raise ReceiptInvalid(f"kid {kid!r} has a malformed 'x' in the JWKS")
            return _public_key(x)
    raise ReceiptInvalid(f"unknown kid {kid!r} (not in the JWKS)")


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = strict_json.loads(data)
    except StrictJSONError as exc:
        raise ReceiptInvalid(f"malformed token: {what} is not strict JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ReceiptInvalid(f"malformed token: {what} is not a JSON object")
    return value


def verify_receipt(
    token: str,
    jwks: Mapping[str, Any],
    *,
    response: Any | None = None,
    request: Any | None = None,
) -> dict[str, Any]:
    """Check a receipt against a JWKS and, if given, the response and request; return its payload.

    Checks, in order: three base64url parts; header alg ``Ed25519`` (``EdDSA`` accepted as an
    alias), typ, no ``crit``; kid in ``jwks`` as an Ed25519 OKP key; the signature; payload
    version and kid; then ``resp_sha256`` against ``digest(strip_receipt(response))`` and
    ``req_sha256`` against ``digest(request)``. ``response`` is the MCP ``result`` object (for a
    JSON-RPC message, pass ``message["result"]``).

    Raises:
        ReceiptInvalid: the message names the first check that failed.
    """
    if not isinstance(token, str):
        raise ReceiptInvalid("malformed token: not a string")
    parts = token.split(".")
    if len(parts) != 3:
        raise ReceiptInvalid(f"malformed token: {len(parts)} parts, expected 3")
    header_b64, payload_b64, sig_b64 = parts
    if not payload_b64:
        raise ReceiptInvalid("malformed token: empty payload (detached payloads are not used)")
    header = _json_object(_part(header_b64, "header"), "header")
    alg = header.get("alg")
    if alg not in _ACCEPTED_ALGS:
        raise ReceiptInvalid(f"wrong alg {alg!r} (expected 'Ed25519')")
    if "crit" in header:
        raise ReceiptInvalid(f"unsupported critical header parameters {header['crit']!r}")
    if header.get("typ") != RECEIPT_TYP:
        raise ReceiptInvalid(f"wrong typ {header.get('typ')!r} (expected {RECEIPT_TYP!r})")
    kid = header.get("kid")
    if not isinstance(kid, str):
        raise ReceiptInvalid("malformed token: header has no kid")
    public_key = _find_key(jwks, kid)
    signature = _part(sig_b64, "signature")
    if len(signature) != 64:
        raise ReceiptInvalid("bad signature: not 64 bytes")
    try:
        public_key.verify(signature, f"{header_b64}.{payload_b64}".encode("ascii"))
    except InvalidSignature as exc:
        raise ReceiptInvalid(f"bad signature (kid {kid!r})") from exc
    payload = _json_object(_part(payload_b64, "payload"), "payload")
    if payload.get("v") != RECEIPT_VERSION:
        raise ReceiptInvalid(f"unsupported receipt version {payload.get('v')!r}")
    if payload.get("kid") != kid:
        raise ReceiptInvalid(f"payload kid {payload.get('kid')!r} differs from header kid {kid!r}")
    if response is not None and payload.get("resp_sha256") != digest(strip_receipt(response)):
        raise ReceiptInvalid("digest mismatch for response: it is not the response that was signed")
    if request is not None and payload.get("req_sha256") != digest(request):
        raise ReceiptInvalid("digest mismatch for request: it is not the request that was signed")
    return payload


def check_receipt_in_ledger(payload: Mapping[str, Any], record: StoredRecord | None) -> None:
    """Check that a verified receipt's ledger position names `record` (the record at that seq).

    The record's bytes must hash to the receipt's ``ledger.hash``, and its entry must carry the
    receipt's ``request_id`` and, as ``response_digest``, its ``resp_sha256``.

    Raises:
        ReceiptInvalid: the message names the first check that failed.
    """
    ledger = payload.get("ledger")
    if not isinstance(ledger, Mapping):
        raise ReceiptInvalid("the receipt has no ledger position")
    seq = ledger.get("seq")
    if record is None:
        raise ReceiptInvalid(f"the ledger has no record {seq!r} (the receipt's ledger.seq)")
    actual = leaf_hash(record.body).hex()
    if actual != record.hash:
        raise ReceiptInvalid(f"ledger record {record.seq} was modified: its bytes do not hash to its stored hash")
    if ledger.get("hash") != actual:
        raise ReceiptInvalid(f"ledger record {record.seq} has hash {actual}, not the receipt's {ledger.get('hash')!r}")
    try:
        entry = record.to_dict()
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ReceiptInvalid(f"ledger record {record.seq} is not a well-formed record") from None
    if entry.get("request_id") != payload.get("request_id"):
        raise ReceiptInvalid(f"ledger record {record.seq} is for request {entry.get('request_id')!r}, "
                             f"not the receipt's {payload.get('request_id')!r}")
    if entry.get("response_digest") != payload.get("resp_sha256"):
        raise ReceiptInvalid(f"ledger record {record.seq} has response digest {entry.get('response_digest')!r}, "
                             f"not the receipt's resp_sha256 {payload.get('resp_sha256')!r}")


# --- JWKS files ---------------------------------------------------------------------------------


def load_jwks(path: Path) -> dict[str, Any]:
    """Read a JWKS file for offline verification.

    Keys of other types are kept (a shared JWKS may list them); receipts naming them fail.

    Raises:
        ConfigError: the file is missing, unreadable, not JSON, or not a JWKS.
    """
    path = Path(path)
    try:
        doc = strict_json.loads(read_bytes(path))
    except StrictJSONError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    try:
        return validate_jwks(doc)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
