"""Decoded secrets (issue 10): encodings, nesting, bounds, split fields, the new kinds with valid and
broken checksums, redaction of what decoding revealed, and the benign look-alikes that must pass."""

from __future__ import annotations

import base64
import bz2
import codecs
import datetime
import gzip
import hashlib
import io
import json
import lzma
import random
import tarfile
import urllib.parse
import zipfile
import zlib
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
    kinds = [{k for k, _ in found({"n": " ".join(rng.choice(words) for _ in range(12))})} for _ in range(400)]
    hits = sum("seed_phrase" in k for k in kinds)
    assert 5 <= hits <= 60  # 4 checksum bits: about 1 in 16 random 12-word lists, never all of them
    # the rest are written as a seed all the same (round 8): `seed_words`, which only the network rule refuses
    assert all(k == {"seed_phrase"} or k == {"seed_words"} for k in kinds)


def test_seed_words_without_checksum() -> None:
    """Round 8 (es-wallet-seed): a whole run of 12/15/18/21/24 list words, one separator throughout,
    whose checksum fails is `seed_words`; prose, repeats and odd lengths are not."""
    words = list(bip39_words())
    rng = random.Random(8)
    phrase = next(p for p in (" ".join(rng.choice(words) for _ in range(12)) for _ in range(50)) if "seed_phrase" not in {k for k, _ in found({"n": p})})
    assert found({"n": phrase}) == {("seed_words", "")}
    assert found({"n": ", ".join(phrase.split())}) == {("seed_words", "")}
    assert found({"n": "+".join(phrase.split())}) == {("seed_words", "")}
    assert found({"n": " ".join(phrase.split()[:11])}) == set()  # 11 words
    mixed = phrase.split()
    assert found({"n": " ".join(mixed[:6]) + ", " + " ".join(mixed[6:])}) == set()  # two separators: prose-like
    assert found({"n": "letter advice cage absurd amount doctor acoustic avoid letter advice cage able"}) == set()  # repeats


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


# ---- issue 24: the encodings and obfuscations the decoder did not undo ------------------------
# Random values in each vendor's format (tests/corpus/tools/token_values.py, seeds 80-82): no account
# is behind them, and none is a documented example value.

GH24 = "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"
NPM24 = "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"
SLACK24 = "xoxb-84672660393-8282014114739-db1zf40oKzSqCmfs9dwIJvHy"
STRIPE24 = "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"
ANT24 = "sk-ant-api03-2n6BrozhCg8LbQIHfZXwRPLGaFdPnvlisnITcNVOfE0zu6zSt7z-Z3n0Ejy4cqBRHoYQhIwovgo0ZlXeWckwSRk1oY0PpAA"
GOOGLE24 = "AIza2kKyy_XuqOw9vjDUlrfo-3qEUejF1IKPOqI"
GITLAB24 = "glpat-t_oOzyhoniBM7Oujzl6v"
AWS24 = "AKIARZ2XXZXBYODYPKAJ"
PEM24 = (
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgFPhzyBWNHhNqnBl3\n"
    "NzmzNporA6PTxPxXPgKdEZYFyHuhRANCAARaJFUnb2HGMI2DK9UI3NaP6zMtpSeN\n"
    "GMRDg7rDPDLOUaw9/1VAk9CVgqCruJoHuJIO9TPGgyHr1mZuC5tIe9HS\n-----END PRIVATE KEY-----\n"
)


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


def _escapes(s: str, form: str) -> str:
    return "".join(form.format(ord(c)) for c in s)


OBFUSCATIONS = [
    ("base32", base64.b32encode(f"token={GH24}".encode()).decode()),
    ("base32", base64.b32encode(f"token={GH24}".encode()).decode().rstrip("=").lower()),
    ("base64>gzip", b64(gzip.compress(f"key={ANT24}".encode(), mtime=0))),
    ("base64>zlib", b64(zlib.compress(f"STRIPE_SECRET_KEY={STRIPE24}\n".encode()))),
    ("base64>bzip2", b64(bz2.compress(f"npmrc _authToken={NPM24}".encode()))),
    ("base64>xz", b64(lzma.compress(f"slack {SLACK24}".encode()))),
    ("hex>gzip", gzip.compress(f"key {GH24}".encode(), mtime=0).hex()),
    ("escape", _escapes(ANT24, "\\u{:04x}")),
    ("escape", GITLAB24.replace("-", "\\u002d").replace("_", "\\u005f")),
    ("escape", _escapes(STRIPE24, "\\{:03o}")),
    ("escape", _escapes(GOOGLE24, "\\u{{{:x}}}")),
    ("html", _escapes(SLACK24, "&#{};")),
    ("html", _escapes(GH24, "&#x{:x};")),
    ("quoted-printable", "".join(f"={b:02X}" for b in STRIPE24.encode())),
    ("quoted-printable", f"Content-Transfer-Encoding: quoted-printable\n\nkey=3D{GOOGLE24[:20]}=\n{GOOGLE24[20:]}\n"),
    ("charcodes", "String.fromCharCode(" + ", ".join(str(ord(c)) for c in NPM24) + ")"),
    ("charcodes", "[" + ",".join(hex(ord(c)) for c in GITLAB24) + "]"),
    ("charcodes", "+".join(f"chr({ord(c)})" for c in GH24)),
    ("rot13", codecs.encode(SLACK24, "rot13")),
    ("rot13", codecs.encode(PEM24, "rot13")),
    ("reversed", GH24[::-1]),
    ("reversed", f"{AWS24} and more"[::-1]),
    ("reversed>base64", b64(f"token={GITLAB24}")[::-1]),
    ("joined", " ".join(AWS24[i : i + 4] for i in range(0, 20, 4))),
    ("joined", "|".join(STRIPE24[i : i + 12] for i in range(0, len(STRIPE24), 12))),
    ("joined", ".".join(SLACK24)),
    ("joined", f'const k = "{ANT24[:7]}" +\n  "{ANT24[7:50]}" + "{ANT24[50:]}";'),
    ("joined", "T = ''.join([" + ", ".join(repr(GH24[i : i + 9]) for i in range(0, 40, 9)) + "])"),
    ("base64", base64.encodebytes(f"[prod]\naws_access_key_id={AWS24}\nregion=eu-west-1\n".encode()).decode()),
    ("base64>gzip", json.dumps({"data": base64.encodebytes(gzip.compress(PEM24.encode(), mtime=0)).decode()})),  # `\n` escapes
    ("base32", "https://cdn.example.net/i/" + base64.b32encode(STRIPE24.encode()).decode().rstrip("=") + "/p.gif"),
    ("rot13", "https://relay.example.net/r/" + codecs.encode(SLACK24, "rot13") + "/ok"),
    ("charcodes", "codes: " + " ".join(str(ord(c)) for c in NPM24)),
    ("charcodes", "\n".join(str(ord(c)) for c in GH24)),
    ("hex", " ".join(f"{b:02x}" for b in NPM24.encode())),
    ("base64>gzip", b64(_tar_gz({".ssh/id_ec": PEM24.encode(), ".ssh/known_hosts": b"github.com ssh-ed25519 AAAA\n"}))),
    ("base64>zip", b64(_zip({".env": f"STRIPE_SECRET_KEY={STRIPE24}\n".encode()}))),
]


@pytest.mark.parametrize(("via", "encoded"), OBFUSCATIONS)
def test_each_obfuscation_reveals_the_secret_and_says_how(via: str, encoded: str) -> None:
    value = {"q": f"payload {encoded} end"}
    kinds = {kind for kind, how in found(value) if how == via}
    assert kinds & {"api_key", "private_key"}, found(value)
    assert all(via in f.via or f.via == "" for f in detect_secrets(value))
    assert_redacted(value, encoded.strip())


def test_undone_escapes_map_back_exactly_so_only_the_secret_is_redacted() -> None:
    """Escapes, character references, rot13, reversal and rejoining map each character back: the
    redaction replaces the secret's own characters, and the text around it stays."""
    for encoded in (GITLAB24.replace("-", "\\u002d"), _escapes(SLACK24, "&#{};"), codecs.encode(SLACK24, "rot13"),
                    GH24[::-1], " ".join(AWS24[i : i + 4] for i in range(0, 20, 4))):
        redacted, _ = redact_secrets({"q": f"first words {encoded} last words"})
        assert redacted["q"].startswith("first words [REDACTED:api_key]") and redacted["q"].endswith(" last words")


def test_the_plain_decoder_is_unchanged_for_the_instruction_scanner() -> None:
    """`decode.decoded_layers` without prefixes (the instruction scanner's call) decodes base64, hex
    and URL-encoding only; the other decodings and the reassemblies need the credential prefixes."""
    for encoded in (codecs.encode(SLACK24, "rot13"), _escapes(ANT24, "\\u{:04x}"), base64.b32encode(GH24.encode()).decode()):
        assert list(decode.decoded_layers(f"payload {encoded}")) == []
    assert [layer.via for layer in decode.decoded_layers(b64(TEXT))] == ["base64"]


def test_decompression_is_bounded() -> None:
    """A compression bomb yields at most MAX_LAYER_CHARS decoded bytes; a key past that is not seen."""
    bomb = b64(zlib.compress(b"a" * 50_000_000 + f" {GH24}".encode(), 9))
    layers = list(decode.decoded_layers(bomb, decode.Prefixes.of(["ghp_"])))
    assert [len(layer.text) for layer in layers if layer.via == "base64>zlib"] == [decode.MAX_LAYER_CHARS]
    assert found({"q": bomb}) == set()


def test_an_escape_is_rescanned_only_near_itself() -> None:
    """One escape in a long text re-scans WINDOW characters around it, not the whole text."""
    text = "lorem ipsum " * 5_000 + "caf\\u00e9 " + "dolor sit " * 5_000
    (layer,) = [lay for lay in decode.decoded_layers(text, decode.Prefixes.of(["ghp_"])) if lay.via == "escape"]
    assert len(layer.text) <= 2 * decode.WINDOW + 1 and "café" in layer.text


def test_runs_too_long_to_be_tokens_are_not_turned() -> None:
    long_run = codecs.encode(SLACK24, "rot13") + "a" * decode.MAX_TURNED
    assert "rot13" not in {via for _, via in found({"q": long_run})}


SSH_ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP2l/rloynul1wk/E/fMOin3xLD7/XL/BwJ1SWKgj9go dev@laptop"
PGP_PUBLIC = (
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEawt07hYJKwYBBAHaRw8BAQdAMMeLeBcMHT0ytkZR7z0XBdQosiWeajFHUqZO\n"
    "NN+UE8+0HURldiBFeGFtcGxlIDxkZXZAZXhhbXBsZS5vcmc+iJAEExYIADgWIQRJ\n"
    "f5yl9RhiIb72AfLMibPIBuC+rAUCawt07gIbAwULCQgHAgYVCgkICwIEFgIDAQIe\n"
    "AQIXgAAKCRDMibPIBuC+rJKJAQCDYGzQvRXCIMYjwlQ/wm8xQsX1sgPaAmZ1lm6Z\n"
    "wBm2JAEA0W+vSyR0RRx1cgHbsG06peXcOfnRxetAXnPU7p8PGQg=\n=KCUy\n-----END PGP PUBLIC KEY BLOCK-----\n"
)
PUBLISHABLE = "pk_live_51zbCLBcQEmGzUOZ3TYNJCUrloglFfAYqms0yHuh8Z4WXXldFlwrSnewKaCA0NctznUd28gALfHRzCf7ERxsdIzynjCUEDtHR9W"


def _public_material() -> list[str]:
    """Fresh SSH public keys, a PEM public key and a self-signed certificate (all public by design)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.x509.oid import NameOID

    out = []
    for key in (ed25519.Ed25519PrivateKey.generate(), rsa.generate_private_key(65537, 2048), ec.generate_private_key(ec.SECP256R1())):
        pub = key.public_key()
        out.append(pub.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " ci@build")
        out.append(pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.internal.example")])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=90)).sign(key, hashes.SHA256()))
    return [*out, cert.public_bytes(serialization.Encoding.PEM).decode()]


def test_public_key_material_is_no_finding() -> None:
    for material in [*_public_material(), SSH_ED25519, PGP_PUBLIC, PUBLISHABLE, "pk_test_" + PUBLISHABLE[8:]]:
        assert found({"key": material, "body": f"my public key:\n{material}\nthanks"}) == set(), material
    assert found({"stripe_api_key": PUBLISHABLE, "api_key": SSH_ED25519}) == set()  # public whatever the field says


def test_a_fake_public_block_does_not_hide_a_secret() -> None:
    """Public key material is not skipped: what is found inside it still counts."""
    fake = f"-----BEGIN CERTIFICATE-----\n{b64('aws_access_key_id=' + AWS24)}\n-----END CERTIFICATE-----\n"
    assert ("api_key", "base64") in found({"cert": fake})
    assert ("api_key", "") in found({"key": f"-----BEGIN PUBLIC KEY-----\n{GH24}\n-----END PUBLIC KEY-----"})


PLACEHOLDERS = [
    "sk_live_xxxxxxxxxxxxxxxxxxxxxxxx",
    "ghp_" + "X" * 36,
    "AKIA" + "X" * 16,
    "sk-proj-your-api-key-here",
    "sk-ant-api03-" + "x" * 40,
    "STRIPE_SECRET_KEY=sk_live_xxxxxxxxxxxxxxxxxxxxxxxx\nOPENAI_API_KEY=sk-proj-your-api-key-here\nSESSION_SECRET=change-this\n"
    f"NEXT_PUBLIC_STRIPE_KEY={PUBLISHABLE}\nDB_PASSWORD=changeme\n",
    'api_key: "your-api-key-here"',
    "DATABASE_URL=postgres://user:password@localhost:5432/app",
    "REDIS_URL=redis://:changeme@localhost:6379/0",
    "password: <your-password>",
]


@pytest.mark.parametrize("text", PLACEHOLDERS)
def test_placeholders_are_no_secret(text: str) -> None:
    assert found({"text": text}) == set()


@pytest.mark.parametrize("value", [{"password": "changeme"}, {"api_key": "YOUR_API_KEY"}, {"client_secret": "replace-me"},
                                   {"token": "<your-token>"}, {"secret": "secret"}])
def test_placeholder_values_of_secret_fields_are_no_secret(value: dict[str, str]) -> None:
    assert found(value) == set()


@pytest.mark.parametrize(
    ("value", "kind"),
    [({"text": f"{ANT24}-your-key-here"}, "api_key"), ({"password": "hunter2-changeme"}, "password"),
     ({"text": "STRIPE_SECRET_KEY=" + STRIPE24 + "\nTOKEN=" + GH24 + "\n"}, "api_key"),
     ({"text": "postgres://app:Tr0ub4dor88@db.internal/app"}, "password")],
)  # fmt: skip
def test_a_real_secret_next_to_placeholder_words_still_counts(value: dict[str, str], kind: str) -> None:
    assert kind in {k for k, _ in found(value)}


def test_a_digit_run_inside_a_digest_is_not_a_card_number() -> None:
    digest = "84bd9c3efb5eb361366635125f5df7c509d11249d4cd37448b8f0a6c726c62ffc362147120533246c418bf67a07d3ba2f"
    assert found({"sha512": digest, "b64": "Zm9v4111111111111111YmFy"}) == set()
    assert ("payment_card", "") in found({"q": "card: 4111111111111111."})


def test_a_token_split_across_objects_names_every_field_and_is_redacted() -> None:
    value = {"url": "https://api.sync.example.net/v1", "headers": {"X-Trace": ANT24[:20]}, "body": ANT24[20:]}
    (finding,) = detect_secrets(value)
    assert (finding.kind, finding.path, finding.via) == ("api_key", '$.headers["X-Trace"]+$.body', "split")
    assert set(sanitize(value, LIMITS).findings) == {finding}
    redacted, _ = redact_secrets(value)
    assert redacted["headers"]["X-Trace"] == redacted["body"] == "[REDACTED:api_key]"
    records = {"records": [{"v": GH24[i : i + 10]} for i in range(0, 40, 10)]}
    assert ("api_key", "split") in found(records)


def test_short_strings_of_different_objects_that_are_no_secret_stay_apart() -> None:
    value = {"meta": {"id": "sk-ant-api", "kind": "note"}, "items": [{"name": "release", "tag": "v1.2.3"}], "owner": "dev"}
    assert found(value) == set()


def test_character_codes_in_an_integer_array_are_decoded_and_redacted() -> None:
    value = {"url": "https://collect.example.net/e", "data": [ord(c) for c in NPM24]}
    assert found(value) == {("api_key", "charcodes")}
    (finding,) = detect_secrets(value)
    assert finding.path == "$.data"
    assert redact_secrets(value)[0]["data"] == ["[REDACTED:api_key]"]
    assert found({"values": [random.Random(4).randrange(48, 122) for _ in range(64)], "n": [1, 2, 3, 4, 5, 6, 7, 8, 9]}) == set()


NON_SECRETS_24 = [
    {"lock": json.dumps({"packages": {f"node_modules/p{i}": {"integrity": "sha512-" + b64(random.Random(i).randbytes(64))} for i in range(8)}})},
    {"html": '<script src="/a.js" integrity="sha384-' + b64(random.Random(9).randbytes(48)) + '"></script>'},
    {"css": "a{background:url(\"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'%3E%3Cpath d='M4 4l8 8'/%3E%3C/svg%3E\")}"
            "@font-face{src:url(data:font/woff2;base64," + b64(b"wOF2" + random.Random(5).randbytes(600)) + ")}"},
    {"body": b64(gzip.compress(json.dumps({"points": [{"v": i, "route": "/api/items"} for i in range(30)]}).encode(), mtime=0))},
    {"ids": "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi duckduckgogg42xjoc72x3sjasowoarfbgcmvfimaftt6twagswzczad.onion 01HZX3K5QW7M2N9P4R6T8V0Y1B"},
    {"html": "<p>It&#8217;s the band&#8217;s best record &mdash; &#x201C;loud&#x201D; &amp; clear</p>"},
    {"log": 'export {"name":"Ren\\u00e9e Fran\\u00e7ois","note":"\\ud83d\\ude00 ok","dash":"\\u2014"}'},
    {"mail": "Content-Transfer-Encoding: quoted-printable\n\nBonjour =C3=A0 tous, la r=C3=A9union est d=C3=A9plac=C3=A9e =\n=C3=A0 jeudi.\n"},
    {"post": "Spoiler (rot13): " + codecs.encode("The answer is the lighthouse keeper, use the skeleton key", "rot13")},
    {"code": 'const url = "https://api." + region + ".example.com" + "/v1/" + "items";\nconst parts = ["alpha", "beta"].join("-");'},
    {"body": "serial K7QP 4MZD 82XW LR3N, ref DE44 5001 0517 5407 3249 31, uuid 3f2b8c1e-9a4d-4e6b-8f0a-1c2d3e4f5a6b"},
    {"issue": "fails on C:\\Users\\dev\\AppData\\Local\\Temp\\x41b2 with ^\\d{3}-\\w+$ and perms \\755"},
    {"b64": base64.encodebytes(random.Random(6).randbytes(400)).decode()},
    {"csv": "id, price, qty\n1001, 250, 3\n1002, 99, 12\n1003, 120, 7\n1004, 80, 1\n1005, 75, 2\n"},
    {"msg": "temps: 21 22 23 22 21 20 19 18 18 19 21 24 26 | rgb: 255 128 64 32 100 110 97 109 101 115 200 210"},
    {"body": json.dumps({"data": base64.encodebytes(b"\x89PNG\r\n\x1a\n" + random.Random(7).randbytes(900)).decode()})},
    {"snapshot": b64(_tar_gz({"src/main.py": b"def main() -> int:\n    return 0\n", "README.md": b"# tool\n"}))},
    {"report": b64(_zip({"report.csv": b"week,orders\n47,1203\n48,1177\n"}))},
    {"issue": "starts 89 50 4e 47 0d 0a 1a 0a 00 00 00 0d 49 48 44 52, fingerprint 3A:F5:9C:10:7B:2E:44:D1:90:AA:5F:3C"},
    {"log": 'log.info("password=%s user=%s", pw, user); msg = f"password={password}"'},
]


@pytest.mark.parametrize("value", NON_SECRETS_24)
def test_encoded_data_that_is_no_secret_has_no_finding(value: Any) -> None:
    assert found(value) == set()


@pytest.mark.parametrize(
    "text",
    [".login .password:focus{outline:none} #password:invalid{border:1px solid red}",  # CSS
     "if (form.password===form.confirm) return; const pwd=document.getElementById('pwd').value;",  # code
     '{"password": "Passwort", "forgot_password": "Passwort vergessen?", "pwd": "Mot de passe"}'],  # form labels
)  # fmt: skip
def test_code_and_form_labels_about_passwords_are_no_password(text: str) -> None:
    assert found({"text": text}) == set()
    assert found({"text": b64(text)}) == set()


def test_a_token_whose_halves_were_encoded_apart_is_found_and_redacted() -> None:
    value = {"url": "https://collect.example.net/e", "first": b64(GH24[:17]), "second": b64(GH24[17:])}
    (finding,) = detect_secrets(value)
    assert (finding.kind, finding.path, finding.via) == ("api_key", "$.first+$.second", "split>base64")
    assert set(sanitize(value, LIMITS).findings) == {finding}
    assert redact_secrets(value)[0] == {**value, "first": "[REDACTED:api_key]", "second": "[REDACTED:api_key]"}


def test_an_archive_is_read_as_its_printable_runs_within_the_bound() -> None:
    """A tar inside gzip is binary (headers full of NUL bytes): its printable runs are scanned;
    a zip's members are read in memory, at most MAX_LAYER_CHARS bytes in all."""
    (layer,) = [lay for lay in decode.decoded_layers(b64(_tar_gz({"a.txt": b"x" * 40})), decode.Prefixes.of(["ghp_"]))]
    assert (layer.via, layer.text) == ("base64>gzip", "x" * 40)  # the file's content, without the tar headers
    bomb = b64(_zip({"a": b"a" * 5_000_000, "b": f"key {GH24}".encode()}))
    assert [len(lay.text) for lay in decode.decoded_layers(bomb, decode.Prefixes.of(["ghp_"]))] == [decode.MAX_LAYER_CHARS + 1]
    assert found({"q": bomb}) == set()


@pytest.mark.parametrize(
    "text",
    [
        f"https://b.s3.eu-west-1.amazonaws.com/k.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={KEY}%2F20260301%2Feu-west-1%2Fs3%2Faws4_request&X-Amz-Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",
        f"Authorization: AWS4-HMAC-SHA256 Credential={KEY}/20260301/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0b9e",
    ],
)
def test_a_key_id_in_a_sigv4_credential_scope_is_the_public_half_of_a_signature(text: str) -> None:
    """Presigned URLs and SigV4 headers are made to be handed out: the key id there is no finding."""
    assert [f.kind for f in detect_secrets(text)] == []


def test_a_key_id_without_a_credential_scope_is_still_a_key() -> None:
    assert [f.kind for f in detect_secrets(f"aws_access_key_id = {KEY}")] == ["api_key"]
    assert [f.kind for f in detect_secrets(f"{KEY}/not/a/scope")] == ["api_key"]


CYRILLIC = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х"})
GREEK = str.maketrans({"A": "Α", "K": "Κ", "I": "Ι", "Z": "Ζ", "M": "Μ", "T": "Τ"})


@pytest.mark.parametrize(
    "text",
    [
        "token ghp_" + "7WQAmL9xVQ2zg4mZaouqKLiMcVbpT41yRDoa".translate(CYRILLIC),
        "ghр_7WQAmL9xVQ2zg4mZaouqKLiMcVbpT41yRDoa",  # only the prefix's `p` is Cyrillic
        "id " + KEY.translate(GREEK),
    ],
)
def test_credentials_in_look_alike_letters_are_found(text: str) -> None:
    assert [(f.kind, f.via) for f in detect_secrets(text)] == [("api_key", "homoglyph")]


@pytest.mark.parametrize(
    "text",
    ["Привет! Ключ API хранится в Vault, токены не пересылаем.", "ΚΑΛΗΜΕΡΑ, Η ΠΑΡΑΓΓΕΛΙΑ ΑΚΙΑ-20260301 ΑΠΕΣΤΑΛΗ"],
)
def test_prose_in_other_scripts_is_no_credential(text: str) -> None:
    assert list(detect_secrets(text)) == []


def test_escapes_escaped_twice_and_legacy_percent_u_are_undone() -> None:
    assert [f.via for f in detect_secrets("".join(f"\\\\u{ord(c):04x}" for c in KEY))] == ["escape"]
    assert [f.via for f in detect_secrets("".join(f"%u{ord(c):04X}" for c in KEY))] == ["escape"]
    assert list(detect_secrets("search.asp?q=caf%u00E9%20cr%u00E8me")) == []


def test_a_secret_is_found_by_its_vendors_name_alone() -> None:
    secret = "1874OU3xfuPTb/0AwZqAWeTa38DpDbn820RQ6ymo"
    assert [f.kind for f in detect_secrets(f"AWS_SECRET_ACCESS_KEY={secret}")] == ["api_key"]
    assert [f.kind for f in detect_secrets(f"client_secret: '{secret}'")] == ["api_key"]
    assert [f.via for f in detect_secrets(f"aws_secret_access_key = {secret}".encode().hex())] == ["hex"]
    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    assert list(detect_secrets(f"secret_key_sha256 = {digest}\naccess_token_ttl = 3600\nsecret_key = <your-secret-key-here>")) == []


def test_private_key_bodies_without_armour_and_keys_cut_at_a_seam() -> None:
    """Round 4: a DER/OpenSSH key body is a private key; public DER is not; a key cut across two values is found joined."""
    rsa = "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0"
    ec = "MHcCAQEEIIBJRg78jRgZaXtTb5QFJlHiwGUVdL5g1wDEhKO7mAbCdEfGoAoGCCqGSM49AwEHoUQDQgAE"
    spki = "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA0y4AClh0e/P0oEPnijE6abcdefghijklmnop"
    csr = "MIHWMH0CAQAwGzEZMBcGA1UEAwwQc2hvcC5leGFtcGxlLm9yZzBZMBMGByqGSM49abcdefghijklmn"
    assert {f.kind for f in detect_secrets({"k": rsa})} == {"private_key"}
    assert {f.kind for f in detect_secrets({"k": "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAA"})} == {"private_key"}
    assert detect_secrets({"a": spki, "b": csr}) == ()
    cut = detect_secrets({"a": "notes\n" + ec[:5], "b": ec[5:] + "\n"})
    assert [(f.kind, f.path, f.via) for f in cut] == [("private_key", "$.a+$.b", "split")]
    header = detect_secrets({"a": "see below\n-----BEGIN RSA PRIV", "b": "ATE KEY-----\n(rest follows)"})
    assert [(f.kind, f.via) for f in header] == [("private_key", "split")]


def test_documented_example_values_of_any_vendor_are_examples() -> None:
    """Round 4: a vendor's published example value, or a value marked EXAMPLE with no random body
    beside the mark, is example_secret, under any name."""
    for value in (
        {"t": "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
        {"aws_secret": "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY"},
        {"t": "AKIAIOSFODNN7EXAMPLE"},
    ):
        assert {f.kind for f in detect_secrets(value)} == {"example_secret"}, value
    assert not {f.kind for f in detect_secrets({"stripe_secret_key": "sk_test_EXAMPLE0000000000000000"})} - {"example_secret"}


@pytest.mark.parametrize("marked", ["{}EXAMPLE", "EXAMPLE{}", "{}EXAMPLEKEY", "EXAMPLE-{}"])
def test_a_real_secret_marked_example_stays_a_secret(marked: str) -> None:
    """The mark is no way out: a random body beside EXAMPLE is still a secret (an agent told to
    append EXAMPLE to what it sends must not get a credential through)."""
    body = "Zr9x2Lq8Vb7Nc6Mm5Kk4Jj3Hh2Gg1Ff0Ddd1Qq"
    kinds = {f.kind for f in detect_secrets({"t": "aws_secret_access_key = " + marked.format(body)})}
    assert "example_secret" not in kinds and kinds, kinds
    assert {f.kind for f in detect_secrets({"t": "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Rt2KEY"})} == {"api_key"}


def _base58check(payload: bytes) -> str:
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    data = payload + hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    n, out = int.from_bytes(data, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = alphabet[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def test_extended_private_keys_of_any_version_are_private_keys_and_extended_public_keys_are_not() -> None:
    """Round 5 (es-wallet-private-key): Base58Check of 78 bytes with the 0x00 private-key marker,
    whole or cut over lines; an xpub (02/03 there) is public; BIP-32's test vector is an example."""
    rng = random.Random(5)
    body = b"\x03" + rng.randbytes(4) + b"\x80\x00\x00\x00" + rng.randbytes(32)
    for version in ("0488ADE4", "04B2430C", "04358394", "019D9CFE"):  # xprv, zprv, tprv, Litecoin Ltpv
        key = _base58check(bytes.fromhex(version) + body + b"\x00" + rng.randbytes(32))
        assert {f.kind for f in detect_secrets({"t": f"root: {key}"})} == {"private_key"}, key[:4]
        assert {f.kind for f in detect_secrets({"t": key[:50] + "\n" + key[50:]})} == {"private_key"}
    xpub = _base58check(bytes.fromhex("0488B21E") + body + b"\x02" + rng.randbytes(32))
    assert detect_secrets({"t": f"watch-only import of {xpub}"}) == ()
    vector = "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi"
    assert {f.kind for f in detect_secrets({"t": vector})} == {"example_secret"}


def test_ascii85_and_base85_runs_are_decoded() -> None:
    """Round 5 (es-ascii85-credential): Adobe `<~ ~>` Ascii85 (also wrapped) always; unframed
    Ascii85/base85 when the text names the encoding or (round 6) the run is dense in base85's
    symbols; Ascii85 of ordinary text finds nothing."""
    framed = "<~" + base64.a85encode(f"token {GH}".encode()).decode() + "~>"
    assert [f.via for f in detect_secrets({"t": "blob=" + framed})] == ["ascii85"]
    wrapped = "\n".join(framed[i : i + 30] for i in range(0, len(framed), 30))
    assert [f.via for f in detect_secrets({"t": wrapped})] == ["ascii85"]
    bare = base64.b85encode(TEXT.encode()).decode()
    assert {f.via for f in detect_secrets({"t": f"b85decode this: {bare}"})} == {"base85"}
    assert {f.via for f in detect_secrets({"t": bare})} == {"base85"}  # round 6: unnamed, dense in symbols
    pdf = "<~" + base64.a85encode(b"BT /F1 12 Tf 72 712 Td (Invoice total 418.20 EUR) Tj ET").decode() + "~>"
    assert detect_secrets({"t": pdf}) == ()


@pytest.mark.parametrize("text", [
    "Cookie: csrftoken=abc; sessionid=q8w7e6r5t4y3u2i1o0p9a8s7d6f5g4h3",
    "Set-Cookie: connect.sid=s%3AQm9vZ2xlLXNlc3Npb24tNzc4.Zx8Kp2Lr9Tq4Wm7Yb3Nc6Vd1Fg5Hj0; Path=/; HttpOnly",
    "my cookies: PHPSESSID=k3j9f8s7d6a5q4w3e2r1t0y9u8",
    "JSESSIONID=9A7F3C2B1E0D4F6A8B9C0D1E2F3A4B5C",
    '[{"name": "_shop_session", "value": "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA%3D%3D--4e1f0a9b"}]',
    ".app.dev\tTRUE\t/\tTRUE\t1795000000\t__Secure-next-auth.session-token\teyJhbGciOiJkaXIiLCJlbmMiOiJBMjU2R0NNIn0..Qx9Lm2Kp7",
    "curl -H 'Authorization: Bearer Zk39fj2LmQ81bXz0Pq7wE4rTyU' https://api.internal.io/v2",
    '{"Authorization": "Bearer ya29.a0AfB_byC7Lm2Kp9Qx4Rt8Vw1Zy3Nb6Md0Hj5Gf2"}',
])
def test_session_cookies_and_bearer_tokens_are_credentials(text: str) -> None:
    """Round 5 (es-session-token): a session cookie in a cookie position or under a framework's
    name, a browser cookie export, a cookies.txt line, an opaque bearer token."""
    assert "api_key" in {f.kind for f in detect_secrets({"t": text})}, text


@pytest.mark.parametrize("text", [
    "Cookie: _ga=GA1.2.1843920731.1764000000; theme=dark; lang=en-US",
    'curl -H "Authorization: Bearer $TOKEN" ; Authorization: Bearer <access_token>',
    "Authorization: Bearer ${{ secrets.API_TOKEN }} or Bearer YOUR_ACCESS_TOKEN_HERE",
    "Set-Cookie: sessionid=<value>; HttpOnly; SESSION_COOKIE_NAME = 'sessionid'",
    "error in session_id=7f3c2a9e-41b8-4c0d-9e55-2b7a1f0c8d34 request_id=req_8Kq2Lm9Zp4Xw",
    "Authorization: Bearer eyJh****...****Qm7Z Cookie: sessionid=********; csrftoken=[REDACTED]",
])
def test_session_look_alikes_are_not_credentials(text: str) -> None:
    assert detect_secrets({"t": text}) == (), text


@pytest.mark.parametrize("text", [
    "OPENAI_API_KEY=sk-proj-Ab3d…Xy9Z",
    "api_key=sk-proj-Ab3dEf9H…(redacted)…Xy9Z2kLmN",
    "STRIPE_SECRET_KEY=sk_live_51H8...redacted...",
    "client_secret = 7f3Qxxxxxxxxxxxxxxxxxxxxxxxx91Ab",
])
def test_a_masked_credential_is_no_secret(text: str) -> None:
    """Round 5 (bn-redacted-credential): a value shown masked, with fewer visible characters than a key."""
    assert detect_secrets({"t": text}) == (), text
    assert detect_secrets({"api_key": text.split("=", 1)[1].strip()}) == ()


def test_a_masked_value_is_not_rejoined_across_its_mask() -> None:
    """The separator-removing reassembly does not join the parts of a masked value (nor what follows it)."""
    text = "Your config has OPENAI_API_KEY=sk-proj-Ab3d…Xy9Z and STRIPE_SECRET_KEY=sk_live_51H8...redacted... - both rotated."
    assert sanitize({"text": text}, LIMITS).findings == ()
    assert [f.via for f in detect_secrets({"t": GH[:12] + " " + GH[12:]})] == ["joined"]  # a token cut by a space still is


def test_a_mask_beside_a_whole_key_does_not_hide_it() -> None:
    assert {f.kind for f in detect_secrets({"t": f"token {GH}…"})} == {"api_key"}
    assert {f.kind for f in detect_secrets({"t": "aws_secret_access_key = 1874OU3xfuPTb/0AwZqAWeTa38DpDbn820RQ6ymo...***"})} == {"api_key"}


def _z85(data: bytes) -> str:
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    data += b"\0" * (-len(data) % 4)
    out = ""
    for i in range(0, len(data), 4):
        n, group = int.from_bytes(data[i : i + 4], "big"), ""
        for _ in range(5):
            n, r = divmod(n, 85)
            group = alphabet[r] + group
        out += group
    return out


def test_unnamed_ascii85_base85_and_z85_runs_are_decoded_and_binary_ones_are_not() -> None:
    """Round 6 (es-ascii85-credential): a run without frame or name is decoded when it is dense in
    base85's symbols, in any of the three alphabets; what decodes to binary finds nothing."""
    for encoded, via in ((base64.a85encode(TEXT.encode()).decode(), "ascii85"), (base64.b85encode(GH.encode()).decode(), "base85"),
                         (_z85(GH.encode()), "z85")):
        assert via in {f.via for f in detect_secrets({"t": f"blob {encoded} end"})}, via
    curve_public = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # a ZeroMQ CURVE public key (32 random bytes)
    patch = "GIT binary patch\nliteral 1024\nzcmV<}0R#XC000000000000000Fa!bs0000000000000000O$Yo0001;b5ch_0Itpz+5i9m"
    assert detect_secrets({"a": curve_public, "b": patch, "c": "if (a && b) { x[i] = (y << 2) | z; } // ok?"}) == ()


WIF = "L4Yn7pmheLUJ1FQCR5EjrzcZk2BoYXWjtSjN9rsGJctEU514A8Y1"


@pytest.mark.parametrize("sep", ["-", " ", ".\n", " | "])
def test_a_wif_key_written_in_groups_is_a_wif_key(sep: str) -> None:
    """Round 6 (es-wallet-private-key): the groups joined pass Base58Check."""
    grouped = sep.join(WIF[i : i + 5] for i in range(0, len(WIF), 5))
    assert "wif_key" in {f.kind for f in detect_secrets({"t": f"backup: {grouped}"})}
    other = sep.join(["KQ4WP", "7YHTN", "3MXDR", "B9C2V", "JF6GT", "L9PQR", "K2MNB", "X7YHT", "4MXDR", "B9C2V", "Q"])
    assert detect_secrets({"t": f"activation code {other}"}) == ()


def test_a_hex_private_key_in_groups_needs_a_key_word_and_no_digest_word() -> None:
    key = "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"
    colons = ":".join(key[i : i + 2] for i in range(0, 64, 2))
    assert "private_key" in {f.kind for f in detect_secrets({"t": f"deployer pk {colons}"})}
    assert "private_key" in {f.kind for f in detect_secrets({"t": "private key: 0x " + " ".join(key[i : i + 8] for i in range(0, 64, 8))})}
    assert detect_secrets({"t": f"SHA256 Fingerprint={colons.upper()}"}) == ()


JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1c2VyXzI4Mzc0IiwiZXhwIjoxNzY0MzAzNjAwfQ."
       "tnwfIgHh1oTWztp-GtazMKCJk-G40t4m26ZmL2VUA74")


@pytest.mark.parametrize("sep", ["", "~", " ", "\n"])
def test_a_jwt_with_its_dots_removed_or_replaced_is_a_jwt(sep: str) -> None:
    """Round 6 (es-session-token): found by its structure (a header naming `alg`, a JSON payload,
    a signature), whatever stands between the parts."""
    assert "jwt" in {f.kind for f in detect_secrets({"t": "session " + JWT.replace(".", sep)})}


def test_jwt_look_alikes_without_a_signature_are_not_jwts() -> None:
    header = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImtleS0yMDI2In0"
    event = base64.urlsafe_b64encode(json.dumps({"event": "pageview", "page": "/pricing", "ts": 1764300000}).encode()).decode()
    assert detect_secrets({"a": f"the header we emit is {header}", "b": f"https://a.example/b.gif?d={event.rstrip('=')}"}) == ()


def test_json_held_in_a_string_is_walked_as_fields() -> None:
    """Round 6: an HTTP body that is serialised JSON: a JWT split over its fields is found, and the
    string is redacted whole."""
    h, p, sig = JWT.split(".")
    args = {"method": "POST", "body": json.dumps({"a": h, "b": p, "c": sig})}
    assert [f.via for f in detect_secrets(args)] == ["json>split"]
    assert redact_secrets(args)[0]["body"] == "[REDACTED:jwt]"
    assert detect_secrets({"body": json.dumps({"a": "hello", "b": [1, 2, 3]})}) == ()


# ---- round 7 (r7-misc): credentials written out rather than encoded (`spelled`) ----------------

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_MORSE = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", (
    ".- -... -.-. -.. . ..-. --. .... .. .--- -.- .-.. -- -. --- .--. --.- .-. ... - ..- ...- .-- -..- -.-- --.. "
    "----- .---- ..--- ...-- ....- ..... -.... --... ---.. ----.").split()))
_NATO = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", (
    "Alfa Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliett Kilo Lima Mike November Oscar Papa Quebec "
    "Romeo Sierra Tango Uniform Victor Whiskey X-ray Yankee Zulu").split()))
_DIGIT_NAMES = "zero one two three four five six seven eight nine".split()


def b58(data: bytes) -> str:
    n, out = int.from_bytes(data, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def nato(s: str) -> str:
    return " ".join(_DIGIT_NAMES[int(c)] if c.isdigit() else ("underscore" if c == "_" else
                    ("capital " if c.isupper() else "lowercase ") + _NATO[c.upper()]) for c in s)


@pytest.mark.parametrize(
    ("text", "via"),
    [
        (f"cache key {b58(GH.encode())} (base58)", "base58"),
        (b58(b"\x00" + GH.encode() + hashlib.sha256(hashlib.sha256(b"\x00" + GH.encode()).digest()).digest()[:4]), "base58"),
        ("-".join(KEY[i : i + 4] for i in range(0, 20, 4)), "regrouped"),
        ("-".join(GH), "regrouped"),
        ("_".join(GH[i : i + 5] for i in range(0, len(GH), 5)), "regrouped"),
        ("decode: " + " ".join(_MORSE[c] for c in KEY), "morse"),
        (" / ".join(_MORSE[c] for c in KEY), "morse"),
        ("spelled: " + nato(GH), "phonetic"),
        (" ".join(format(b, "08b") for b in GH.encode()), "binary"),
        ("".join(chr(33 + (ord(c) - 33 + 47) % 94) for c in GH), "rot47"),
    ],
)
def test_a_credential_written_out_is_found(text: str, via: str) -> None:
    """Round 7 (es-base58-credential, es-dashed-credential, es-morse-credential): base58 and
    Base58Check, a token cut into groups by a separator (the separator at every k+1-th place, or
    everywhere), Morse in either word spacing, spelling-alphabet words with case words, bits, ROT47."""
    assert ("api_key", via) in found({"t": text})


@pytest.mark.parametrize(
    "text",
    [
        "ipfs://" + b58(b"\x12\x20" + hashlib.sha256(b"doc").digest()),  # a CID: a multihash, not text
        "sig " + b58(hashlib.sha512(b"tx").digest()),  # a Solana signature
        "-.-. --.- / -.-. --.- / -.. . / -.- .---- .- -... -.-. / -.-",  # Morse practice: CQ CQ DE K1ABC K
        "Your reference is X-ray seven Kilo two Lima Mike, flight Alfa Foxtrot one two three four.",
        "3f2a9c1e-8b7d-4e6f-a1b2-c3d4e5f60718 QWER7-TY2UI-9OPAS-DF3GH-JKLZX",  # a UUID, a licence key in groups
        "https://blog.example/posts/how-to-rotate-ghp-and-sk-live-tokens-safely",
        " ".join(format(b, "08b") for b in b"Hello, world!"),
    ],
)
def test_text_written_out_that_spells_no_credential_passes(text: str) -> None:
    assert found({"t": text}) == set()


AWS_SECRET = "W6Jh7AoEvXlIwJEeglyN9lTX1g1//Mgnzmg2nUyD"  # random, in the shape of an AWS secret access key


def test_unlabelled_aws_secret_joined_from_pieces() -> None:
    """Round 8 (es-split-credential): a 40-character AWS-secret-shaped value is no finding alone,
    and one when only joined pieces make it: fields, array items, lines of a message."""
    assert found({"k": AWS_SECRET}) == set()
    assert found({"a": AWS_SECRET[:13], "b": AWS_SECRET[13:27], "c": AWS_SECRET[27:]}) == {("api_key", "split")}
    assert found({"k": [AWS_SECRET[i : i + 10] for i in range(0, 40, 10)]}) == {("api_key", "split")}
    text = f"part A: {AWS_SECRET[:14]}\npart B: {AWS_SECRET[14:28]}\npart C: {AWS_SECRET[28:]}"
    assert found({"m": text}) == {("api_key", "split")}
    # short ids whose lengths add up to 40, one of them upper case only: no cut secret
    assert found({"order": "Ord7Kx2", "cart": "c9QmZ4Lp", "coupon": "SPRING26", "session": "Zx81Kd0aQ", "ref": "Aa3bC9dE"}) == set()
    assert found({"a": AWS_SECRET[:20], "b": AWS_SECRET[20:] + "x"}) == set()  # 41: not the shape


def test_leet_substitution_undone() -> None:
    """Round 8 (es-leetspeak-credential): a stated letter/digit map is undone after it."""
    assert found({"m": "map a=4 e=3 o=0 s=5: 5k_liv3_QWxRTyUpLkJhGfDdZcVbNmqw"}) == {("api_key", "leet")}
    assert found({"m": "leet: a=4 e=3 o=0 s=5, so N00b5l4y3r reads NoobSlayer"}) == set()


def test_passwords_and_pins_in_prose() -> None:
    """Round 8 (ux-conversation-in-query): a password or PIN given in a sentence is a password."""
    assert found({"m": "my password for the bank is Tulip!77x"}) == {("password", "")}
    assert found({"m": "and my PIN is 4821"}) == {("password", "")}
    assert found({"m": "su contraseña del correo es Girasol!91"}) == {("password", "")}
    for benign in ("the password is required", "how do I reset my password if I forgot my PIN?",
                   "the PIN is 4 digits long", "Your password is <your-password>"):
        assert found({"m": benign}) == set(), benign
