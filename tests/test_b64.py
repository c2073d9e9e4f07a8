"""The one base64url helper: round trips every length, and refuses every other spelling by name."""

from __future__ import annotations

import base64
import os

import pytest

from gateway.crypto.b64 import Base64urlError, b64url_decode, b64url_encode


@pytest.mark.parametrize("size", range(0, 70))
def test_round_trip_is_unpadded_url_safe_and_matches_the_stdlib(size: int) -> None:
    data = os.urandom(size)
    text = b64url_encode(data)
    assert "=" not in text and "+" not in text and "/" not in text
    assert text == base64.urlsafe_b64encode(data).decode().rstrip("=")
    assert b64url_decode(text) == data


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("QUJD=", "is not base64url"),  # padding
        ("QUJDRA==", "is not base64url"),
        ("QU+D", "is not base64url"),  # the standard, not the URL-safe alphabet
        ("QU/D", "is not base64url"),
        ("QU D", "is not base64url"),
        ("QUJDR", "is not base64url"),  # a length no byte string encodes to
        ("QUJDRB", "is not canonical base64url"),  # non-zero trailing bits: a second spelling of "ABCD"
        ("QR", "is not canonical base64url"),
    ],
)
def test_other_spellings_are_refused_naming_what(text: str, reason: str) -> None:
    with pytest.raises(Base64urlError, match=f"^signature {reason}$"):
        b64url_decode(text, "signature")


def test_a_non_string_is_refused_and_the_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="value is not base64url"):
        b64url_decode(b"QUJD")  # type: ignore[arg-type]
    assert b64url_decode("QUJDRA") == b"ABCD"
