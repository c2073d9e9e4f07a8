"""Base64url (RFC 4648 §5) without padding: the one encoder and strict decoder of the gateway.

JWS segments, receipt parts, key ids and the sealed approval state all use it. Decoding is strict
so that a value has exactly one spelling: only the URL-safe alphabet, no `=` padding, no length
that no byte string encodes to, and no non-zero trailing bits (a second encoding of the same
bytes, which would let a token be altered without changing what it says).
"""

from __future__ import annotations

import base64
import re

__all__ = ["Base64urlError", "b64url_decode", "b64url_encode"]

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")


class Base64urlError(ValueError):
    """Text that is not the canonical unpadded base64url of any bytes; the message names what."""


def b64url_encode(data: bytes) -> str:
    """Unpadded base64url of `data`."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str, what: str = "value") -> bytes:
    """The bytes `text` encodes; `Base64urlError` naming `what` unless it is their canonical spelling."""
    if not isinstance(text, str) or not _ALPHABET.fullmatch(text) or len(text) % 4 == 1:
        raise Base64urlError(f"{what} is not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if b64url_encode(data) != text:
        raise Base64urlError(f"{what} is not canonical base64url")
    return data
