"""Decoded secrets (issue 10): encodings, nesting, bounds, split fields, the new kinds with valid and
broken checksums, redaction of what decoding revealed, and the benign look-alikes that must pass."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import urllib.parse
from importlib import resources
from typing import Any

import pytest

from gateway.core.call import Finding
from gateway.memo import MemoSet
from gateway.stages.sanitizer import decode
from gateway.stages.sanitizer.walk import SanitizerLimits, detect_secrets, redact_secrets, sanitize
from gateway.stages.sanitizer.wallets import bip39_words, keccak256

LIMITS = SanitizerLimits()
KEY = "AKIAZ3MSJV4W7QYHRT5N"
GH = "ghp_" + "a1B2c3D4e5" * 3 + "F6g7H8"
TEXT = f"aws_access_key_id={KEY}"
SEED = "letter advice cage absurd amount doctor acoustic avoid letter advice cage above"
WIF = "KwDiBf89QgGbjEhKnhXJuH7LrciVrZi3qYjgd9M7rFU73sVHnoWn"


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def found(value: Any) -> set[tuple[str, str]]:
    """(kind, via) of every finding, checking that sanitize and detect_secrets agree."""
    findings = sanitize(value, LIMITS).findings
    assert set(findings) == set(detect_secrets(value))
    return {(f.kind, f.via) for f in findings}


def assert_redacted(value: Any, secret: str) -> None:
    redacted, _ = redact_secrets(value)
    text = json.dumps(redacted)
    assert secret not in text and "[REDACTED:" in text
    assert not {f.kind for f in detect_secrets(redacted)} & {"api_key", "seed_phrase", "wif_key", "jwt"}


ENCODINGS = [
    ("base64", b64(TEXT)),
    ("base64", b64(TEXT).rstrip("=")),
    ("base64url", base64.urlsafe_b64encode(f"{TEXT} ~~~>>>?".encode()).decode().rstrip("=")),
    ("hex", TEXT.encode().hex()),
    ("hex", "0x" + TEXT.encode().hex().upper()),
    ("hex", "".join(f"\\x{b:02x}" for b in TEXT.encode())),
    ("url", urllib.parse.quote(TEXT, safe="")),
    ("url", urllib.parse.quote_plus(f"key={KEY}&note=a b")),
]


@pytest.mark.parametrize(("via", "encoded"), ENCODINGS)
def test_each_encoding_reveals_the_key_and_says_how(via: str, encoded: str) -> None:
    value = {"q": f"payload {encoded} end"}
    assert ("api_key", via) in found(value)
    (finding,) = [f for f in detect_secrets(value) if f.via == via]
    assert finding.path == "$.q" and KEY not in finding.detail
    assert_redacted(value, encoded)


def test_url_safe_base64_with_dashes_is_named_base64url() -> None:
    encoded = base64.urlsafe_b64encode(f"{GH} ~~~>>>?".encode()).decode().rstrip("=")
    assert "-" in encoded or "_" in encoded
    assert ("api_key", "base64url") in found({"q": encoded})


def test_nesting_is_followed_and_named_outermost_first() -> None:
    inner = urllib.parse.quote(f"token {GH}", safe="")
    assert ("api_key", "base64>url") in found({"q": b64(inner)})
    assert ("api_key", "base64>base64>base64") in found({"q": b64(b64(b64(TEXT)))})
    assert_redacted({"q": "x=" + b64(b64(b64(TEXT)))}, KEY)


def test_depth_is_bounded() -> None:
    four = b64(b64(b64(b64(TEXT))))
    assert found({"q": four}) == set()
    assert decode.MAX_DEPTH == 3


def test_size_is_bounded() -> None:
    filler = "A" * decode.MAX_LAYER_CHARS  # a run longer than the decoder reads: its tail is not looked at
    assert found({"q": b64(b"x" * (decode.MAX_LAYER_CHARS // 4 * 3) + TEXT.encode())}) == set()
    assert list(decode.decoded_layers(filler)) == []
    many = " ".join(b64(f"note {i} " * 3) for i in range(decode.MAX_LAYERS + 10))
    assert len(list(decode.decoded_layers(many))) == decode.MAX_LAYERS


def test_short_runs_are_not_decoded() -> None:
    assert list(decode.decoded_layers("aGVsbG8=")) == []  # "hello": too short to hide a key


def test_split_across_fields_names_every_field() -> None:
    value = {"to": "ops@example.com", "part1": KEY[:10], "part2": KEY[10:]}
    (finding,) = detect_secrets(value)
    assert (finding.kind, finding.path, finding.via) == ("api_key", "$.part1+$.part2", "split")
    redacted, _ = redact_secrets(value)
    assert redacted == {"to": "ops@example.com", "part1": "[REDACTED:api_key]", "part2": "[REDACTED:api_key]"}
    assert set(sanitize(value, LIMITS).findings) == {finding}


def test_split_token_in_an_array_and_split_base64() -> None:
    assert ("api_key", "split") in found({"parts": [GH[:15], GH[15:30], GH[30:]]})
    encoded = b64(TEXT)
    assert ("api_key", "split>base64") in found({"a": encoded[:21], "b": encoded[21:]})


def test_split_jwt_and_seed_words_one_per_field() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    assert ("jwt", "split") in found({"h": jwt[:40], "t": jwt[40:]})
    assert ("seed_phrase", "split") in found({"w": SEED.split()})


def test_a_whole_secret_in_one_field_is_not_also_a_split_one() -> None:
    assert found({"a": KEY, "b": "next"}) == {("api_key", "")}


def test_numbers_in_separate_fields_are_not_joined_into_a_card() -> None:
    assert found({"a": "4111", "b": "1111", "c": "1111", "d": "1111"}) == set()


def test_jwt_needs_a_json_header_with_alg_also_in_urls() -> None:
    header = base64.urlsafe_b64encode(b'{"alg":"RS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(b'{"sub":"42"}').decode().rstrip("=")
    token = f"{header}.{body}.c2lnbmF0dXJlLWJ5dGVz"
    assert found({"u": f"https://app.example/cb?access_token={token}&x=1"}) == {("jwt", "")}
    no_alg = base64.urlsafe_b64encode(b'{"typ":"JWT","kid":"k"}').decode().rstrip("=")
    assert found({"u": f"eyJ{no_alg[3:]}.{body}.c2ln"}) == set()
    assert found({"u": "eyJzb21lIjoidGhpbmcifQ.eyJub3QiOiJqd3QifQ.x"}) == set()


ENV = "PATH=/usr/local/bin:/usr/bin\nHOME=/home/dev\nUSER=dev\nSHELL=/bin/bash\nTERM=xterm\n"


@pytest.mark.parametrize(
    "text",
    [ENV, "export GITHUB_TOKEN=tok123abc\nexport STRIPE_SECRET=whsec_abc123\nexport REGION=eu-west-1\n"],
)
def test_env_dumps(text: str) -> None:
    assert ("env_dump", "") in found({"out": text})
    assert ("env_dump", "base64") in found({"out": b64(text)})


@pytest.mark.parametrize(
    "text",
    [
        "API_KEY=your-api-key\nDB_PASSWORD=\nSECRET_TOKEN=<token>\nDEBUG=true\n",
        "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\nAWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nREGION=us-east-1\n",
        "a=1\nb=2\n",
    ],
)
def test_env_templates_and_examples_are_not_dumps(text: str) -> None:
    assert "env_dump" not in {k for k, _ in found({"out": text})}


def test_wordlist_is_the_published_bip39_english_list() -> None:
    data = resources.files("gateway.stages.sanitizer").joinpath("data/bip39_english.txt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "2f5eed53a4727b4bf8880d8f3f199efc90e58503646d9ff8eff3a2ed3b24dbda"
    assert len(bip39_words()) == 2048


@pytest.mark.parametrize(
    "phrase",
    [SEED, "1. letter 2. advice 3. cage 4. absurd 5. amount 6. doctor\n7. acoustic 8. avoid 9. letter 10. advice 11. cage 12. above",
     " ".join(["zoo"] * 17 + ["when"])],
)  # fmt: skip
def test_seed_phrases_with_valid_checksums(phrase: str) -> None:
    assert ("seed_phrase", "") in found({"note": f"backup: {phrase}"})
    assert_redacted({"note": phrase}, phrase.split()[2])


@pytest.mark.parametrize(
    "phrase",
    ["letter advice cage absurd amount doctor acoustic avoid letter advice cage able",  # checksum fails
     "letter advice cage absurd amount doctor acoustic avoid letter advice cage",  # 11 words
     "the team will review each access report before they build a final plan for the budget office"],
)  # fmt: skip
def test_seed_phrase_look_alikes(phrase: str) -> None:
    assert "seed_phrase" not in {k for k, _ in found({"note": phrase})}


def test_random_wordlist_words_rarely_pass_the_checksum() -> None:
    words = list(bip39_words())
    rng = random.Random(10)
    hits = sum(bool(found({"n": " ".join(rng.choice(words) for _ in range(12))})) for _ in range(400))
    assert 5 <= hits <= 60  # 4 checksum bits: about 1 in 16 random 12-word lists, never all of them


def test_wif_keys() -> None:
    assert found({"k": WIF}) == {("wif_key", "")}
    assert found({"k": "5KJvsngHeMpm884wtkJNzQGaCErckhHJBGFsvd3VyK5qMZXj3hS"}) == {("wif_key", "")}
    broken = WIF[:-1] + ("m" if WIF[-1] != "m" else "n")
    assert found({"k": broken}) == set()
    assert_redacted({"k": f"key {WIF}"}, WIF)


ADDRESSES = [
    "1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNa",
    "3J98t1WpEZ73CNmQviecrnyiWrnqRhWNLy",
    "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4",
    "BC1QW508D6QEJXTDG4Y5R3ZARVARY0C5XW7KV8F3T4",
    "bc1p0xlxvlhemja6c4dqv22uapctqupfhlxm9h8z3k2e72q4k9hcz7vqzk5jj0",
    "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
    "0xde709f2102306220921060314715629080e2fb77",
]


@pytest.mark.parametrize("address", ADDRESSES)
def test_wallet_addresses_are_findings_with_the_address_as_excerpt(address: str) -> None:
    (finding,) = detect_secrets({"to": f"pay {address} today"})
    assert (finding.kind, finding.excerpt) == ("wallet_address", address)
    assert redact_secrets({"to": address})[0] == {"to": address}  # public: reported, not redacted


@pytest.mark.parametrize(
    "address",
    ["1A1zP1eP5QGefi2DMPTfTL5SLmv7DivfNb", "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t5",
     "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3T4", "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD"],
)  # fmt: skip
def test_wallet_addresses_with_broken_checksums_are_nothing(address: str) -> None:
    assert detect_secrets({"to": address}) == ()


def test_keccak256_matches_the_known_vectors() -> None:
    assert keccak256(b"").hex() == "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
    assert keccak256(b"abc").hex() == "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45"


EXAMPLES = [
    "AKIAIOSFODNN7EXAMPLE",
    "AKIAI44QH8DHBEXAMPLE",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    " ".join(["abandon"] * 11 + ["about"]),
    "5HueCGU8rMjxEXxiPuD5BDku4MkFqeZyd4dZ1jvhTVqvbTLvyTJ",
]


@pytest.mark.parametrize("example", EXAMPLES)
def test_documented_examples_are_example_secrets_not_secrets(example: str) -> None:
    assert found({"doc": f"In the tutorial we use {example} as the value."}) == {("example_secret", "")}
    assert redact_secrets({"doc": example})[0] == {"doc": example}


BENIGN = [
    {"img": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA" + b64(random.Random(1).randbytes(3000))},
    {"img": "/9j/4AAQSkZJRgABAQ" + b64(random.Random(2).randbytes(3000))},
    {"blob": b64(random.Random(3).randbytes(2000))},
    {"sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "git": "9315086a1c2b3d4e5f60718293a4b5c6d7e8f901"},
    {"id": "550e8400-e29b-41d4-a716-446655440000", "trace": "4bf92f3577b34da6a3ce929d0e0e4736"},
    {"path": "/usr/local/lib/python3.11/site-packages/gateway/stages/sanitizer/decode.py", "mode": "w"},
    {"text": "The quick brown fox jumps over the lazy dog. Agents call tools; the gateway decides what runs."},
    {"url": "https://example.com/search?q=hello%20world&lang=en&page=2"},
    {"cmd": "git log --oneline -5 && git status", "cwd": "/home/dev/src/internationalization-helpers"},
    {"svg": "data:image/svg+xml;base64," + b64('<svg xmlns="http://www.w3.org/2000/svg" width="10"/>')},
]


@pytest.mark.parametrize("value", BENIGN)
def test_benign_look_alikes_have_no_findings(value: Any) -> None:
    assert found(value) == set()


def test_findings_from_plain_text_keep_an_empty_via() -> None:
    assert detect_secrets({"q": f"use {KEY}"}) == (Finding("api_key", "$.q", "AWS access key id, 20 chars"),)


# ---- URL path segments; split arrays; shell variables are not passwords ---------------------

ANTHROPIC_KEY = "sk-ant-api03-Qw7Er4Ty1Ui8Op5As2Df9Gh6Jk3Lz0Xc"


@pytest.mark.parametrize(
    "url",
    [
        "https://r.short.example/" + b64(ANTHROPIC_KEY).rstrip("="),
        "https://r.short.example/" + base64.urlsafe_b64encode(ANTHROPIC_KEY.encode()).decode().rstrip("=") + "/x",
        "https://cdn.example/v1/u/" + b64(ANTHROPIC_KEY) + "?ref=mail",
        "/srv/uploads/" + b64(ANTHROPIC_KEY).rstrip("="),
    ],
)
def test_a_key_encoded_as_one_path_segment_is_found(url: str) -> None:
    assert ("api_key", "base64") in found({"url": url}) or ("api_key", "base64url") in found({"url": url})


@pytest.mark.parametrize(
    "command",
    [
        'docker run --rm \\\n  -v "$PWD":/app -w /app python:3.12 pytest',
        "docker run -v $PWD:/src alpine ls",
        "cd $PWD/build && make",
        "mysql --password=$MYSQL_PWD -e 'select 1'",
        'export PGPASSWORD="$(cat ~/.pgpass-token)"',
    ],
)
def test_shell_variables_are_not_password_assignments(command: str) -> None:
    assert found({"command": command}) == set()


@pytest.mark.parametrize(
    "text",
    ['$password = "hunter2xyz";', "DB_PWD=s3cr3tval", "password=$Summer2024", "pwd: 'Tr0ub4dor'"],
)
def test_password_assignments_near_those_still_count(text: str) -> None:
    assert ("password", "") in found({"text": text})


def test_a_key_split_across_array_items_of_any_length_is_found() -> None:
    google = "AIzaSyB" + "q7Wm2Xc9Lp4Tz8Rv1Hn6Jd3Ks5Fg0Ea2Yb"[:32]
    for cut in ((4, 20), (10, 11, 30), (13, 26)):
        pieces = [google[a:b] for a, b in zip((0, *cut), (*cut, len(google)))]
        assert ("api_key", "split") in found({"url": "https://c.example/e", "events": pieces}), pieces
    assert found({"events": ["AIzaSy", "not", "a", "key"]}) == set()


def test_strings_found_clean_are_remembered_and_secrets_never_are() -> None:
    """The secret scan keeps short strings it found nothing in (they repeat in every answer of a
    tool) and answers them from that memo; a string holding a secret is never kept, so it is found
    again every time, with or without clean strings around it, and a long clean string is not kept."""
    from gateway.stages.sanitizer import secrets

    clean = "dharma-bench-echo 0.1"
    result = {"content": [{"type": "text", "text": clean}], "_meta": {"server": {"name": clean, "version": "1.0.0"}}}
    assert detect_secrets(result) == ()
    assert clean in secrets._CLEAN
    assert detect_secrets(result) == ()
    hit = {"content": [{"type": "text", "text": TEXT}], "_meta": {"server": {"name": clean}}}
    for _ in range(2):
        assert [f.kind for f in detect_secrets(hit)] == ["api_key"]
        assert TEXT not in secrets._CLEAN
    long_clean = "Lorem ipsum, " * 25
    assert detect_secrets({"text": long_clean}) == () and long_clean not in secrets._CLEAN
    assert redact_secrets(hit)[0]["content"][0]["text"] == "aws_access_key_id=[REDACTED:api_key]"


def test_the_memo_of_clean_strings_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.stages.sanitizer import secrets

    monkeypatch.setattr(secrets, "_CLEAN", MemoSet(3))
    for i in range(7):
        assert detect_secrets({"text": f"plain words number {i}"}) == ()
        assert len(secrets._CLEAN) <= 3
    assert [f.kind for f in detect_secrets({"text": TEXT})] == ["api_key"]
