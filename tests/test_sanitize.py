"""The sanitizer's pure core: limits, cleaning, schema validation, detection and redaction."""

from __future__ import annotations

import json
import random
import time
import unicodedata
from enum import StrEnum
from typing import Any

import pytest
from jsonschema.validators import Draft202012Validator

from gateway.core.call import Finding
from gateway.core.errors import ErrorCode
from gateway.stages.sanitizer.schema import fast_check
from gateway.stages.sanitizer.walk import (
    STRIPPED_RANGES,
    SanitizeError,
    SanitizerLimits,
    SchemaValidator,
    clean_text,
    compile_schema,
    detect_secrets,
    format_path,
    parse_path,
    redact_paths,
    redact_secrets,
    sanitize,
)

LIMITS = SanitizerLimits()


def nested(depth: int) -> dict[str, Any]:
    """An object `depth` levels deep: {"a": {"a": ... {}}}."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth - 1):
        node["a"] = {}
        node = node["a"]
    return root


def raises(arguments: Any, limits: SanitizerLimits = LIMITS, schema: Any = None) -> SanitizeError:
    with pytest.raises(SanitizeError) as info:
        sanitize(arguments, limits, schema)
    return info.value


# --------------------------------------------------------------------------- shape and limits


@pytest.mark.parametrize(
    ("arguments", "limits", "path", "fragment"),
    [
        (nested(33), LIMITS, "$" + ".a" * 32, "nesting deeper than 32"),
        ({"a": [[[1]]]}, SanitizerLimits(max_depth=3), "$.a[0][0]", "nesting deeper than 3"),
        ({"a": "x" * 11}, SanitizerLimits(max_string=10), "$.a", "string longer than 10 characters"),
        ({"x" * 11: 1}, SanitizerLimits(max_string=10), "$", "object key longer than 10 characters"),
        ({"a": "ﷺ" * 4}, SanitizerLimits(max_string=10), "$.a", "longer than 10 characters after normalisation"),
        ({"a": list(range(20))}, SanitizerLimits(max_items=20), "$.a", "more than 20 values in total"),
        ({"a": 1, "b": {"c": 2, "d": 3}}, SanitizerLimits(max_items=5), "$.b", "more than 5 values"),
        ({"a": "x" * 100, "b": "y" * 100}, SanitizerLimits(max_bytes=150), "$.b", "larger than 150 bytes"),
        ({"files": [{"path": "p"}, {"path": "é" * 80}]}, SanitizerLimits(max_bytes=150), "$.files[1].path", "larger"),
    ],
)
def test_each_limit_names_path_and_limit(
    arguments: Any, limits: SanitizerLimits, path: str, fragment: str
) -> None:
    err = raises(arguments, limits)
    assert err.path == path
    assert fragment in err.message
    assert str(err) == f"{path}: {err.message}"
    assert err.code is ErrorCode.INVALID_PARAMS


def test_limits_at_the_edge_pass() -> None:
    assert sanitize(nested(32), LIMITS).arguments == nested(32)
    sanitize({"a": "x" * 10}, SanitizerLimits(max_string=10))
    sanitize({"a": list(range(18))}, SanitizerLimits(max_items=20))  # key + value + 18 elements


def test_very_deep_input_does_not_blow_the_stack() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    err = raises({"a": deep})
    assert "nesting deeper than 32" in err.message
    assert err.path.startswith("$.a[0]")
    assert detect_secrets({"a": deep}) == ()  # the detector walks iteratively too


@pytest.mark.parametrize(
    ("arguments", "got"),
    [([1, 2], "array"), ("x", "string"), (3, "number"), (True, "boolean"), (b"{}", "bytes")],
)
def test_arguments_must_be_an_object(arguments: Any, got: str) -> None:
    err = raises(arguments)
    assert (err.path, err.message) == ("$", f"arguments must be a JSON object, got {got}")


def test_none_arguments_are_an_empty_object() -> None:
    assert sanitize(None, LIMITS) == sanitize({}, LIMITS)
    assert sanitize(None, LIMITS).arguments == {}


@pytest.mark.parametrize(
    ("arguments", "path", "fragment"),
    [
        ({"a": {1, 2}}, "$.a", "set value is not JSON"),
        ({"a": [b"x"]}, "$.a[0]", "bytes value is not JSON"),
        ({"a": object()}, "$.a", "object value is not JSON"),
        ({"a": float("nan")}, "$.a", "nan is not a JSON number"),
        ({"b": {"c": float("-inf")}}, "$.b.c", "-inf is not a JSON number"),
        ({"a": 2**53}, "$.a", "integer outside"),
        ({1: "x"}, "$", "object key 1 is not a string"),
        ({"my key": {"x": None, "y": ...}}, '$["my key"].y', "ellipsis value is not JSON"),
    ],
)
def test_non_json_values_are_rejected_with_path(arguments: Any, path: str, fragment: str) -> None:
    err = raises(arguments)
    assert err.path == path
    assert fragment in err.message


def test_json_values_and_subclasses_pass() -> None:
    class Color(StrEnum):
        RED = "red"

    args = {"s": "x", "i": -(2**53 - 1), "f": 1.5, "b": False, "n": None, "l": (1, 2), "e": Color.RED, "o": {}}
    out = sanitize(args, LIMITS)
    assert out.arguments == {"s": "x", "i": -(2**53 - 1), "f": 1.5, "b": False, "n": None, "l": [1, 2], "e": "red", "o": {}}
    assert type(out.arguments["e"]) is str and type(out.arguments["l"]) is list
    assert out.changed is False and out.findings == ()


def test_input_is_not_modified() -> None:
    args = {"pa\u200bth": ["x\u200by"], "password": "hunter22"}
    before = json.dumps(args)
    sanitize(args, LIMITS)
    redact_secrets(args)
    redact_paths(args, ["$.password"])
    assert json.dumps(args) == before


# --------------------------------------------------------------------------- text cleaning


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("pa\u200bth", "path"),  # zero-width space
        ("a\u200c\u200d\u200e\u200fb", "ab"),  # ZWNJ, ZWJ, LRM, RLM
        ("a\u2060\u2061\u2062\u2063\u2064b", "ab"),  # word joiner, invisible operators
        ("\ufeffbom", "bom"),  # BOM / zero-width no-break space
        ("soft\u00adhyphen", "softhyphen"),
        ("rm -rf \u202e/ tmp\u202c", "rm -rf / tmp"),  # RLO / PDF
        ("\u202a\u202b\u202dx\u2066\u2067\u2068\u2069\u061c", "x"),  # embeddings, isolates, ALM
        ("ok\U000e0069\U000e0067\U000e006e\U000e0001\U000e007f", "ok"),  # tag characters
        ("x\U000e0100\U000e01efy", "xy"),  # variation selectors supplement
        ("a\x00b\x07c\x1bd\x7fe", "abcde"),  # C0 + DEL
        ("a\x85b\x9fc", "abc"),  # C1
        ("keep\ttabs\nand\r\nnewlines", "keep\ttabs\nand\r\nnewlines"),
        ("\uff0e\uff0e\uff0f", "../"),  # fullwidth "．．／"
        ("ｅｔｃ／ｐａｓｓｗｄ", "etc/passwd"),
        ("ﬁle", "file"),  # ligature
        ("Å", "Å"),  # composed
        ("cafe\u0301", "café"),
        ("\uffa0x", "x"),  # halfwidth Hangul filler: NFKC maps it to U+1160, stripped too
        ("plain ascii", "plain ascii"),
        ("日本語", "日本語"),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean
    assert clean_text(clean) == clean  # idempotent


def test_unchanged_strings_are_returned_as_is() -> None:
    s = "naïve ☃ text"
    assert clean_text(s) is s


def test_strip_table_covers_every_format_character() -> None:
    stripped = {c for a, b in STRIPPED_RANGES for c in range(a, b + 1)}
    cf = {c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"}
    assert cf <= stripped


def test_cleaning_applies_to_keys_and_nested_strings() -> None:
    out = sanitize({"pa\u200bth": ["\uff0e\uff0e\uff0fetc", {"k\u202e": "v\u00ad"}]}, LIMITS)
    assert out.arguments == {"path": ["../etc", {"k": "v"}]}
    assert out.changed is True


@pytest.mark.parametrize(
    ("arguments", "path", "fragment"),
    [
        ({"a": "x\ud800y"}, "$.a", "lone surrogate U+D800 at index 1"),
        ({"a": ["ok", "\udcff"]}, "$.a[1]", "lone surrogate U+DCFF"),
        ({"k\udc80": 1}, "$", 'object key "k\\udc80" contains a lone surrogate'),
    ],
)
def test_lone_surrogates_are_rejected(arguments: Any, path: str, fragment: str) -> None:
    err = raises(arguments)
    assert err.path == path
    assert fragment in err.message


def test_clean_text_rejects_lone_surrogate() -> None:
    with pytest.raises(SanitizeError, match="lone surrogate"):
        clean_text("\ud83d")


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({"path": "a", "pa\u200bth": "b"}, "$"),
        ({"x": {"pa\u200bth": "a", "path": "b"}}, "$.x"),
        ({"ｐａｔｈ": 1, "path": 2}, "$"),
    ],
)
def test_keys_colliding_after_cleaning_are_rejected(arguments: Any, path: str) -> None:
    err = raises(arguments)
    assert err.path == path
    assert "collide after cleaning" in err.message
    first, second = list(list(arguments.values())[0] if path != "$" else arguments)
    assert json.dumps(first) in err.message and json.dumps(second) in err.message


# --------------------------------------------------------------------------- schema validation

FILE_SCHEMA = {
    "type": "object",
    "properties": {
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"path": {"type": "string", "minLength": 1}, "mode": {"enum": ["r", "w"]}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 100},
    },
    "required": ["files"],
}


@pytest.mark.parametrize(
    "arguments",
    [
        {"files": []},
        {"files": [{"path": "a"}, {"path": "b", "mode": "w"}], "limit": 5},
        {"files": [{"path": "a"}], "limit": 5.0},  # 5.0 is an integer in JSON Schema
        {"files": [{"pa\u200bth": "\uff41"}]},  # validated after cleaning
    ],
)
def test_schema_pass(arguments: Any) -> None:
    sanitize(arguments, LIMITS, FILE_SCHEMA)


@pytest.mark.parametrize(
    ("arguments", "path", "fragment"),
    [
        ({}, "$", "'files' is a required property"),
        ({"files": [{"path": "a"}, {"path": 3}]}, "$.files[1].path", "3 is not of type 'string'"),
        ({"files": [{"path": "a"}, {"path": "b", "mode": "x"}]}, "$.files[1].mode", "is not one of"),
        ({"files": [{"path": ""}]}, "$.files[0].path", "should be non-empty"),
        ({"files": [{"path": "a", "extra": 1}]}, "$.files[0]", "Additional properties"),
        ({"files": [], "limit": 0}, "$.limit", "less than the minimum"),
        ({"files": [], "limit": True}, "$.limit", "is not of type 'integer'"),
        # several errors: the first in path order is reported, always the same one
        ({"files": [{"path": 1}, {"path": 2}], "limit": 0}, "$.files[0].path", "not of type"),
    ],
)
def test_schema_fail_reports_first_error_with_path(arguments: Any, path: str, fragment: str) -> None:
    err = raises(arguments, schema=FILE_SCHEMA)
    assert err.path == path
    assert fragment in err.message
    assert err.message.startswith("does not match the tool's inputSchema")


def test_schema_error_message_does_not_echo_secrets() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    err = raises({"n": "AKIAZ3MSJV4W7QYHRT5N"}, schema=schema)
    assert "AKIAZ3MSJV4W7QYHRT5N" not in str(err)
    assert "[REDACTED:api_key]" in err.message


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nope"},
        {"properties": {"a": {"pattern": "(["}}},
        {"properties": {"a": {"$ref": "#/$defs/missing"}}},
        {"properties": {"a": {"$ref": "https://example.com/remote.json"}}},  # never fetched
        {"minimum": float("nan")},
        {"$schema": 5},
        {"type": "object", "properties": []},
        {1: "x"},
        ["not", "an", "object"],
    ],
)
def test_invalid_schema_is_a_clear_error(schema: Any) -> None:
    err = raises({"a": "x"}, schema=schema)
    assert err.path == "$"
    assert "the tool's inputSchema is invalid" in err.message


def test_schema_is_compiled_once() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    same_content = json.loads(json.dumps(schema))
    first = compile_schema(schema)
    assert compile_schema(schema) is first
    assert compile_schema(same_content) is first  # cached by canonical digest, not identity
    assert isinstance(first, SchemaValidator)
    sanitize({"q": "x"}, LIMITS, first)  # a precompiled validator is accepted as is


def test_schema_draft_follows_dollar_schema() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "maximum": 5, "exclusiveMaximum": True}
    sanitize({"a": 1}, LIMITS, {"$schema": draft4["$schema"], "type": "object"})
    with pytest.raises(SanitizeError):  # boolean exclusiveMaximum is draft-04 only
        compile_schema({"maximum": 5, "exclusiveMaximum": True})
    assert compile_schema(draft4).validator.__class__.__name__ == "Draft4Validator"


FAST_SCHEMAS: list[Any] = [
    FILE_SCHEMA,
    {"type": ["string", "null"], "maxLength": 3, "pattern": "^a"},
    {"type": "object", "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
    {"type": "object", "properties": {"a": {"const": 1}, "b": {"enum": [True, None, "x", 2.5]}}},
    {"type": "array", "items": {"type": "integer", "exclusiveMaximum": 10}, "minItems": 1, "maxItems": 3},
    {"type": "object", "minProperties": 1, "maxProperties": 2, "properties": {"a": False}},
    {"items": True, "required": ["a"], "format": "email", "description": "annotations are ignored"},
]
VALUES: list[Any] = [
    None, True, False, 0, 1, 1.0, 2.5, -3, 10, 11, "", "a", "abc", "abcd", "ba", [], [1], [1, 2, 3, 4], [1.5], [True],
    {}, {"a": 1}, {"a": True}, {"a": 1.0}, {"b": None}, {"b": 2.5}, {"b": "y"}, {"a": 1, "b": 2, "c": 3},
    {"files": []}, {"files": [{"path": "x"}]}, {"files": [{"path": ""}]}, {"files": [{"path": "x", "mode": "r"}]},
    {"files": [{"path": "x", "q": 1}]}, {"files": [], "limit": 100}, {"files": [], "limit": 100.5}, {"x": -1},
]  # fmt: skip


@pytest.mark.parametrize("schema", FAST_SCHEMAS)
def test_fast_path_agrees_with_jsonschema(schema: Any) -> None:
    fast = fast_check(schema)
    assert fast is not None
    reference = Draft202012Validator(schema)
    rng = random.Random(7)
    values = VALUES + [{"files": [rng.choice(VALUES) for _ in range(3)], "limit": rng.choice(VALUES)} for _ in range(50)]
    agree = 0
    for value in values:
        if fast(value):  # "valid" from the fast path must be right; "invalid" only costs a slow check
            assert reference.is_valid(value), value
        agree += fast(value) == reference.is_valid(value)
    assert agree >= len(values) - 2


@pytest.mark.parametrize(
    "schema",
    [{"anyOf": [{"type": "string"}]}, {"$ref": "#/$defs/a"}, {"items": [{"type": "string"}]}, {"enum": [[1]]}],
)
def test_fast_path_declines_other_keywords(schema: Any) -> None:
    assert fast_check(schema) is None


# --------------------------------------------------------------------------- detection

AWS = "AKIAZ3MSJV4W7QYHRT5N"
GITHUB = "ghp_" + "a1B2c3D4e5" * 3 + "F6g7H8"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
ANTHROPIC = "sk-ant-api03-" + "Xy9_" * 20
OPENAI = "sk-proj-" + "Ab3dE" * 10
GOOGLE = "AIzaSyD" + "x8Qz3k1Lm9" * 3 + "ab"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3\n-----END RSA PRIVATE KEY-----"

# (kind, value that must be found, the secret text that must never show up afterwards)
POSITIVES: list[tuple[str, Any, str | None]] = [
    ("api_key", {"q": f"use {AWS} now"}, AWS),
    ("api_key", {"q": "ASIAY34FZKBOKMUTVV7A"}, "ASIAY34FZKBOKMUTVV7A"),
    ("api_key", {"q": GITHUB}, GITHUB),
    ("api_key", {"q": "gho_" + "Z" * 36}, "gho_" + "Z" * 36),
    ("api_key", {"q": "ghs_" + "Z9" * 18}, "ghs_" + "Z9" * 18),
    ("api_key", {"q": "github_pat_11ABCDEFG0" + "x" * 12 + "_" + "Y" * 59}, "Y" * 59),
    ("api_key", {"q": "token xoxb-123456789012-1234567890123-AbCdEfGhIjKl"}, "xoxb-123456789012"),
    ("api_key", {"q": STRIPE}, STRIPE),
    ("api_key", {"q": "rk_live_" + "a1" * 12}, "rk_live_" + "a1" * 12),
    ("api_key", {"q": ANTHROPIC}, ANTHROPIC),
    ("api_key", {"q": OPENAI}, OPENAI),
    ("api_key", {"q": GOOGLE}, GOOGLE),
    ("api_key", {"q": "curl -H 'x-api-key: 9f8e7d6c5b4a39281706'"}, "9f8e7d6c5b4a39281706"),
    ("api_key", {"headers": {"X-Api-Key": "9f8e7d6c5b4a39281706"}}, "9f8e7d6c5b4a39281706"),
    ("private_key", {"q": f"key:\n{PEM}\nthanks"}, "MIIEowIBAAKCAQEA0Z3"),
    ("private_key", {"q": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE"}, "b3BlbnNzaC1rZXktdjE"),
    ("payment_card", {"q": "card 4111 1111 1111 1111 exp 12/29"}, "4111 1111 1111 1111"),
    ("payment_card", {"q": "5555-5555-5555-4444"}, "5555-5555-5555-4444"),
    ("payment_card", {"q": "amex 378282246310005"}, "378282246310005"),
    ("payment_card", {"card": "６０１１\u200b１１１１１１１１１１１７"}, "6011111111111117"),  # cleaned first
    ("ssn", {"q": "SSN 123-45-6789 on file"}, "123-45-6789"),
    ("password", {"password": "hunter2"}, "hunter2"),
    ("password", {"db": {"DB_PASSWD": "pw1"}}, "pw1"),
    ("password", {"client_secret": "abc123"}, "abc123"),
    ("password", {"user": {"new-password": "abc123", "passwordConfirmation": "abc123"}}, "abc123"),
    ("password", {"q": "login with password=Tr0ub4dor&3 please"}, "Tr0ub4dor"),
    ("password", {"q": '{"user": "bob", "password": "correct horse"}'}, "correct horse"),
    ("password", {"q": "postgres://bob:s3cr3tpw@db.internal:5432/app"}, "s3cr3tpw"),
    ("otp_code", {"q": "Your verification code is 493021."}, "493021"),
    ("otp_code", {"q": "84729163 is your one-time passcode"}, "84729163"),
    ("otp_code", {"q": "2FA: 604 211"}, None),  # spaced codes are not detected in text (documented gap)
    ("otp_code", {"otp": "493021"}, "493021"),
    ("otp_code", {"mfa_code": 604211}, "604211"),
    ("otp_code", {"totp": "604 211"}, "604 211"),
    ("jwt", {"q": f"Authorization: Bearer {JWT}"}, JWT),
]

# near misses: must produce no finding at all
NEGATIVES: list[Any] = [
    {"q": "AKIAZ3MSJV4W7QYHRT5"},  # 19 chars
    {"q": "XAKIAZ3MSJV4W7QYHRT5N"},  # embedded in a longer word
    {"q": "ghp_short"},
    {"q": "xoxb-short"},
    {"q": "sk_test_4eC39HqLyjWDarjtT1zdp7dc"},  # test keys are not live secrets
    {"q": "sk-this-is-a-very-long-blog-post-title-slug"},  # no digits: a slug, not a key
    {"q": "AIzaShort"},
    {"q": "api_key: short"},
    {"api_key": "<your key here>"},
    {"q": "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOC\n-----END PUBLIC KEY-----"},
    {"q": "-----BEGIN CERTIFICATE-----\nMIIB"},
    {"order_id": "1234567890123452"},  # passes Luhn, but no card network starts with 1
    {"q": "order 4111111111111112"},  # Visa prefix, fails Luhn
    {"q": "41111111111111111"},  # 17 digits: Visa has 13, 16 or 19
    {"q": "ts 1700000000000 id 9007199254740991"},
    {"n": 4111111111111111},  # numbers are not scanned; cards arrive as text
    {"q": "000-12-3456"},
    {"q": "666-12-3456"},
    {"q": "912-34-5678"},
    {"q": "123-00-4567"},
    {"q": "123-45-0000"},
    {"q": "1123-45-6789"},
    {"q": "date 2023-12-3456"},
    {"q": "password reset link sent"},
    {"q": "password="},
    {"q": "password: ********"},
    {"password": ""},
    {"password_min_length": 12},
    {"passwords_enabled": True},
    {"password_required": "yes", "password_policy": "strict", "secret_name": "prod/db"},
    {"secret_name": "prod/db"},
    {"q": "https://example.com:8443/path"},
    {"q": "mailto:bob@example.com"},
    {"q": "order 493021 shipped"},
    {"q": "your code is 12345"},
    {"q": "code 123456789"},  # 9 digits
    {"otp": "abc"},
    {"otp": 12},
    {"q": "eyJhbGciOiJIUzI1NiJ9.only-two"},
    {"q": "short"},
    {"q": "plain text about keys, passes, secrets and codes"},
]


@pytest.mark.parametrize(("kind", "value", "secret"), POSITIVES)
def test_each_kind_is_detected(kind: str, value: Any, secret: str | None) -> None:
    cleaned = sanitize(value, LIMITS)  # detection runs on cleaned text
    findings = detect_secrets(cleaned.arguments)
    assert set(findings) == set(cleaned.findings)
    if secret is None:
        assert all(f.kind != kind for f in findings)
        return
    assert kind in {f.kind for f in findings}, findings
    for finding in findings:
        assert secret not in finding.detail
        assert finding.path.startswith("$.")


@pytest.mark.parametrize("value", NEGATIVES)
def test_near_misses_are_not_findings(value: Any) -> None:
    assert detect_secrets(value) == ()
    assert sanitize(value, LIMITS).findings == ()


@pytest.mark.parametrize(("kind", "value", "secret"), [p for p in POSITIVES if p[2] is not None])
def test_redact_secrets_never_leaves_the_secret(kind: str, value: Any, secret: str) -> None:
    value = sanitize(value, LIMITS).arguments
    redacted, findings = redact_secrets(value)
    text = json.dumps(redacted, ensure_ascii=False)
    assert secret not in text
    assert f"[REDACTED:{kind}]" in text
    assert findings == detect_secrets(value)
    assert detect_secrets(redacted) == ()  # redacting is final: markers are not secrets


def test_findings_carry_paths_and_safe_details() -> None:
    args = {
        "files": [{"path": "a"}, {"path": "b", "content": f"aws={AWS}"}],
        "card": "4111111111111111",
        "weird key": {"password": "pw"},
    }
    findings = set(sanitize(args, LIMITS).findings)
    assert findings == {
        Finding("api_key", "$.files[1].content", "AWS access key id, 20 chars"),
        Finding("payment_card", "$.card", "Visa card number ending 1111"),
        Finding("password", '$["weird key"].password', "password-like field, 2 chars"),
    }


def test_redact_keeps_surrounding_text_and_merges_overlaps() -> None:
    redacted, _ = redact_secrets({"q": f"a {AWS} b api_key={STRIPE} c", "l": [JWT, "ok"]})
    assert redacted == {"q": "a [REDACTED:api_key] b api_key=[REDACTED:api_key] c", "l": ["[REDACTED:jwt]", "ok"]}


def test_redact_secrets_on_a_bare_string() -> None:
    assert redact_secrets(f"x {AWS}") == ("x [REDACTED:api_key]", (Finding("api_key", "$", "AWS access key id, 20 chars"),))
    assert redact_secrets(5) == (5, ())


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("steps", "path"),
    [((), "$"), (("a", 0, "b"), "$.a[0].b"), (("my key",), '$["my key"]'), (("a\u200b", "_x1"), '$["a\\u200b"]._x1')],
)
def test_paths_round_trip(steps: tuple[Any, ...], path: str) -> None:
    assert format_path(steps) == path
    assert parse_path(path) == steps


@pytest.mark.parametrize("bad", ["a.b", "$.", "$[x]", "$..a", '$["unterminated]'])
def test_bad_paths_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_path(bad)


def test_redact_paths() -> None:
    args = {"files": [{"path": "a", "body": "x"}, {"path": "b", "body": "y"}], "token": "t", "my key": 1}
    assert redact_paths(args, ["$.token", '$["my key"]', "$.files[1].body", "$.missing.x", "$.files[9]"]) == {
        "files": [{"path": "a", "body": "x"}, {"path": "b", "body": "[REDACTED]"}],
        "token": "[REDACTED]",
        "my key": "[REDACTED]",
    }
    assert redact_paths(args, ["$.files[*].body"])["files"] == [
        {"path": "a", "body": "[REDACTED]"},
        {"path": "b", "body": "[REDACTED]"},
    ]
    assert redact_paths(args, ["$"]) == "[REDACTED]"
    assert redact_paths(args, []) is args
    assert args["token"] == "t"  # input untouched


def test_redact_paths_uses_finding_paths() -> None:
    args = {"weird key": {"password": "pw"}, "n": [f"id {AWS}"]}
    found = sanitize(args, LIMITS).findings
    assert redact_paths(args, [f.path for f in found]) == {"weird key": {"password": "[REDACTED]"}, "n": ["[REDACTED]"]}


@pytest.mark.parametrize(
    "text",
    [
        "a" * 200_000 + "://x:y@",
        "eyJ" * 70_000,
        "-----BEGIN A " * 15_000,
        "1 " * 100_000,
        "4" * 200_000,
        "password=" * 20_000,
        "sk-" + "a-" * 100_000,
        "code " + "123456 " * 30_000,
    ],
)
def test_detection_is_linear_on_adversarial_text(text: str) -> None:
    """About 0.02-0.15 s of CPU each when linear; a quadratic scan of 200,000 characters takes minutes.
    CPU time of this process, not wall time: a busy machine must not fail it."""
    start = time.process_time()
    redact_secrets({"q": text})
    assert time.process_time() - start < 1.5


SOL_KEYPAIR = [63, 167, 39, 94, 161, 53, 145, 211, 70, 188, 146, 99, 77, 120, 66, 102, 48, 79, 2, 21, 24, 240, 41, 219, 179,
               74, 82, 38, 250, 213, 230, 27, 141, 64, 109, 126, 153, 226, 168, 175, 97, 252, 179, 103, 42, 181, 222, 34,
               162, 231, 210, 185, 91, 164, 81, 248, 46, 100, 216, 15, 25, 32, 202, 192]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ({"t": "DEPLOYER_PRIVATE_KEY=0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"}, "private_key"),
        ({"t": "der private Schlüssel: 4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"}, "private_key"),
        ({"wallet": {"privateKey": "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"}}, "private_key"),
        ({"t": str(SOL_KEYPAIR)}, "private_key"),
        ({"t": '{"version":3,"crypto":{"ciphertext":"' + "ab" * 32 + '","kdf":"scrypt"}}'}, "private_key"),
        ({"t": "hardhat #0: private key 0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"}, "example_secret"),
        ({"t": "release sha256: 4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"}, None),
        ({"t": str(SOL_KEYPAIR[:32])}, None),  # a public key, not a keypair
        ({"t": str(SOL_KEYPAIR[:32] + SOL_KEYPAIR[:32])}, None),  # 64 bytes whose halves do not match
        ({"private_key": "/home/u/.ssh/deploy_key_for_production_x"}, None),
    ],
)
def test_wallet_private_keys_without_a_checksum(args: dict[str, object], kind: str | None) -> None:
    kinds = {f.kind for f in detect_secrets(args)}
    assert kinds == ({kind} if kind else set())
