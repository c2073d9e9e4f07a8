"""Receipts: key files, compact JWS round trip, tampering, rotation, digest rule, JWKS loading."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.canon import digest
from gateway.core.errors import ConfigError
from gateway.crypto.receipts import (
    RECEIPT_META_KEY,
    KeyStore,
    ReceiptInvalid,
    attach_receipt,
    build_receipt,
    load_jwks,
    strip_receipt,
    verify_receipt,
)

NOW = datetime(2025, 3, 4, 5, 6, 7, 891_000, tzinfo=timezone.utc)
REQUEST = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
           "params": {"name": "read_file", "arguments": {"path": "/etc/hosts"}}}
RESULT = {"content": [{"type": "text", "text": "127.0.0.1 localhost"}], "isError": False}


def b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture
def keys(tmp_path: Path) -> KeyStore:
    return KeyStore.open(tmp_path)


def receipt_for(keys: KeyStore, result: Any = RESULT, request: Any = REQUEST) -> str:
    return build_receipt(keys, request_id="req-1", request=request, response=result,
                         ledger_seq=42, ledger_hash="ab" * 32, now=NOW)


def reassemble(header: dict[str, Any], payload_b64: str, sig_b64: str) -> str:
    return f"{b64e(json.dumps(header).encode())}.{payload_b64}.{sig_b64}"


# --- round trip and payload ---------------------------------------------------------------------


def test_round_trip_through_attach_and_verify(keys: KeyStore) -> None:
    token = receipt_for(keys)
    sent = attach_receipt(RESULT, token)
    assert sent["_meta"][RECEIPT_META_KEY] == token
    assert "_meta" not in RESULT  # the input is not mutated
    payload = verify_receipt(sent["_meta"][RECEIPT_META_KEY], keys.jwks(),
                             response=sent, request=REQUEST)
    assert payload == {
        "v": 1,
        "kid": keys.kid,
        "iat": int(NOW.timestamp()),
        "time": "2025-03-04T05:06:07.891Z",
        "request_id": "req-1",
        "req_sha256": digest(REQUEST),
        "resp_sha256": digest(RESULT),
        "ledger": {"seq": 42, "hash": "ab" * 32},
    }


def test_header_is_ed25519_with_kid_and_typ(keys: KeyStore) -> None:
    header = json.loads(b64d(receipt_for(keys).split(".")[0]))
    assert header == {"alg": "Ed25519", "kid": keys.kid, "typ": "dharma-receipt+jws"}


def test_token_parts_are_unpadded_base64url(keys: KeyStore) -> None:
    token = receipt_for(keys)
    assert "=" not in token and "+" not in token and "/" not in token
    assert len(b64d(token.split(".")[2])) == 64


@pytest.mark.parametrize("result", [
    {**RESULT, "isError": True},
    {"content": [{"type": "text", "text": "Blocked by policy"}], "isError": True},
])
def test_payload_has_no_decision(keys: KeyStore, result: dict[str, Any]) -> None:
    payload = verify_receipt(receipt_for(keys, result), keys.jwks())
    assert set(payload) == {"v", "kid", "iat", "time", "request_id", "req_sha256",
                            "resp_sha256", "ledger"}
    assert "decision" not in json.dumps(payload)


def test_sign_uses_canonical_payload_bytes(keys: KeyStore) -> None:
    token = keys.sign({"b": 1, "a": [1, 2], "kid": keys.kid, "v": 1})
    assert b64d(token.split(".")[1]) == b'{"a":[1,2],"b":1,"kid":"%s","v":1}' % keys.kid.encode()


def test_naive_now_is_refused(keys: KeyStore) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        build_receipt(keys, request_id="r", request={}, response={}, ledger_seq=1,
                      ledger_hash="h", now=datetime(2025, 1, 1))


def test_time_is_utc_whatever_the_offset(keys: KeyStore) -> None:
    local = NOW.astimezone(timezone(timedelta(hours=-5)))
    token = build_receipt(keys, request_id="r", request={}, response={}, ledger_seq=1,
                          ledger_hash="h", now=local)
    assert verify_receipt(token, keys.jwks())["time"] == "2025-03-04T05:06:07.891Z"


# --- tampering ----------------------------------------------------------------------------------


def test_tampered_payload_is_a_bad_signature(keys: KeyStore) -> None:
    h, p, s = receipt_for(keys).split(".")
    payload = json.loads(b64d(p))
    payload["ledger"]["seq"] = 43
    forged = f"{h}.{b64e(json.dumps(payload).encode())}.{s}"
    with pytest.raises(ReceiptInvalid, match="bad signature"):
        verify_receipt(forged, keys.jwks())


def test_tampered_signature_is_a_bad_signature(keys: KeyStore) -> None:
    h, p, s = receipt_for(keys).split(".")
    sig = bytearray(b64d(s))
    sig[10] ^= 1
    with pytest.raises(ReceiptInvalid, match="bad signature"):
        verify_receipt(f"{h}.{p}.{b64e(bytes(sig))}", keys.jwks())


def test_tampered_header_is_a_bad_signature(keys: KeyStore) -> None:
    _, p, s = receipt_for(keys).split(".")
    header = {"alg": "Ed25519", "kid": keys.kid, "typ": "dharma-receipt+jws", "x": 1}
    with pytest.raises(ReceiptInvalid, match="bad signature"):
        verify_receipt(reassemble(header, p, s), keys.jwks())


def test_non_canonical_base64_signature_is_refused(keys: KeyStore) -> None:
    h, p, s = receipt_for(keys).split(".")
    # 64 bytes -> 86 chars; the last char carries 4 unused bits. Flip one of them.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet[alphabet.index(s[-1]) ^ 1]
    with pytest.raises(ReceiptInvalid, match="malformed token"):
        verify_receipt(f"{h}.{p}.{s[:-1]}{last}", keys.jwks())


def test_receipt_of_another_key_with_same_kid_fails(tmp_path: Path, keys: KeyStore) -> None:
    other = KeyStore.open(tmp_path / "other")
    jwks = other.jwks()
    jwks["keys"][0]["kid"] = keys.kid  # a JWKS entry claiming our kid with another key
    with pytest.raises(ReceiptInvalid, match="bad signature"):
        verify_receipt(receipt_for(keys), jwks)


def test_unknown_kid(tmp_path: Path, keys: KeyStore) -> None:
    other = KeyStore.open(tmp_path / "other")
    with pytest.raises(ReceiptInvalid, match="unknown kid"):
        verify_receipt(receipt_for(keys), other.jwks())


@pytest.mark.parametrize("alg", ["none", "HS256", "ES256", None])
def test_wrong_alg(keys: KeyStore, alg: str | None) -> None:
    _, p, s = receipt_for(keys).split(".")
    header = {"alg": alg, "kid": keys.kid, "typ": "dharma-receipt+jws"}
    for sig in (s, ""):
        with pytest.raises(ReceiptInvalid, match="wrong alg"):
            verify_receipt(reassemble(header, p, sig), keys.jwks())


def test_eddsa_is_accepted_as_an_alias(keys: KeyStore) -> None:
    fields = {"alg": "EdDSA", "kid": keys.kid, "typ": "dharma-receipt+jws"}
    header = b64e(json.dumps(fields).encode())
    payload = b64e(json.dumps({"v": 1, "kid": keys.kid}).encode())
    sig = keys._active.private_key.sign(f"{header}.{payload}".encode())
    assert verify_receipt(f"{header}.{payload}.{b64e(sig)}", keys.jwks())["v"] == 1


def test_crit_header_is_refused(keys: KeyStore) -> None:
    _, p, s = receipt_for(keys).split(".")
    header = {"alg": "Ed25519", "kid": keys.kid, "typ": "dharma-receipt+jws", "crit": ["b64"]}
    with pytest.raises(ReceiptInvalid, match="critical"):
        verify_receipt(reassemble(header, p, s), keys.jwks())


@pytest.mark.parametrize("token", [
    "", "a.b", "a.b.c.d", "!!!.e30.AA", "e30..AA", "bm90IGpzb24.e30.AA", "W10.e30.AA",
])
def test_malformed_tokens(keys: KeyStore, token: str) -> None:
    with pytest.raises(ReceiptInvalid, match="malformed token"):
        verify_receipt(token, keys.jwks())


def test_jwks_entry_of_wrong_type_is_refused(keys: KeyStore) -> None:
    jwks = {"keys": [{"kty": "EC", "crv": "P-256", "kid": keys.kid, "x": "a", "y": "b"}]}
    with pytest.raises(ReceiptInvalid, match="not an Ed25519 OKP key"):
        verify_receipt(receipt_for(keys), jwks)


# --- digests ------------------------------------------------------------------------------------


def test_response_digest_mismatch_after_one_character(keys: KeyStore) -> None:
    sent = attach_receipt(RESULT, receipt_for(keys))
    changed = json.loads(json.dumps(sent))
    changed["content"][0]["text"] = "127.0.0.2 localhost"
    with pytest.raises(ReceiptInvalid, match="digest mismatch for response"):
        verify_receipt(sent["_meta"][RECEIPT_META_KEY], keys.jwks(), response=changed)


def test_request_digest_mismatch(keys: KeyStore) -> None:
    token = receipt_for(keys)
    other = json.loads(json.dumps(REQUEST))
    other["params"]["arguments"]["path"] = "/etc/shadow"
    with pytest.raises(ReceiptInvalid, match="digest mismatch for request"):
        verify_receipt(token, keys.jwks(), request=other)


def test_attach_keeps_other_meta_keys_and_the_digest_covers_them(keys: KeyStore) -> None:
    result = {**RESULT, "_meta": {"progressToken": "p1", "vendor/x": {"a": 1}}}
    sent = attach_receipt(result, receipt_for(keys, result))
    assert sent["_meta"]["progressToken"] == "p1"
    assert sent["_meta"]["vendor/x"] == {"a": 1}
    token = sent["_meta"][RECEIPT_META_KEY]
    verify_receipt(token, keys.jwks(), response=sent)
    changed = {**sent, "_meta": {**sent["_meta"], "progressToken": "p2"}}
    with pytest.raises(ReceiptInvalid, match="digest mismatch for response"):
        verify_receipt(token, keys.jwks(), response=changed)
    dropped = {**sent, "_meta": {RECEIPT_META_KEY: token}}
    with pytest.raises(ReceiptInvalid, match="digest mismatch for response"):
        verify_receipt(token, keys.jwks(), response=dropped)


def test_attach_refuses_non_object_meta() -> None:
    with pytest.raises(ValueError, match="_meta"):
        attach_receipt({"_meta": "x"}, "tok")


@pytest.mark.parametrize(("given", "expected"), [
    ({"a": 1}, {"a": 1}),
    ({"a": 1, "_meta": {RECEIPT_META_KEY: "t"}}, {"a": 1}),
    ({"a": 1, "_meta": {RECEIPT_META_KEY: "t", "k": 2}}, {"a": 1, "_meta": {"k": 2}}),
    ({"a": 1, "_meta": {"k": 2}}, {"a": 1, "_meta": {"k": 2}}),
    ({"a": 1, "_meta": {}}, {"a": 1}),  # empty _meta is removed on both sides
    ({"a": 1, "_meta": "odd"}, {"a": 1, "_meta": "odd"}),
    ([1, 2], [1, 2]),
    (None, None),
])
def test_strip_receipt_rule(given: Any, expected: Any) -> None:
    before = json.dumps(given)
    assert strip_receipt(given) == expected
    assert json.dumps(given) == before  # never mutates


def test_empty_meta_before_attach_still_verifies(keys: KeyStore) -> None:
    result = {**RESULT, "_meta": {}}
    sent = attach_receipt(result, receipt_for(keys, result))
    verify_receipt(sent["_meta"][RECEIPT_META_KEY], keys.jwks(), response=sent)


def test_receipt_over_response_already_carrying_one(keys: KeyStore) -> None:
    first = attach_receipt(RESULT, "old-token")
    token = receipt_for(keys, first)
    verify_receipt(token, keys.jwks(), response=attach_receipt(first, token))


# --- keys, kid, rotation ------------------------------------------------------------------------


def test_kid_is_rfc7638_thumbprint(keys: KeyStore) -> None:
    jwk = keys.jwks()["keys"][0]
    assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
    assert jwk["use"] == "sig" and jwk["alg"] == "Ed25519"
    members = '{"crv":"Ed25519","kty":"OKP","x":"%s"}' % jwk["x"]
    assert jwk["kid"] == keys.kid == b64e(hashlib.sha256(members.encode()).digest())
    pem = (keys.directory / f"receipt-{keys.kid}.pem").read_bytes()
    private = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(private, Ed25519PrivateKey)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
    assert b64e(raw) == jwk["x"]


def test_reopen_loads_the_same_keys(tmp_path: Path, keys: KeyStore) -> None:
    again = KeyStore.open(tmp_path, create=False)
    assert again.kid == keys.kid
    assert again.checkpoint_public_key_bytes() == keys.checkpoint_public_key_bytes()
    verify_receipt(receipt_for(keys), again.jwks())


def test_key_files_and_directory_permissions(keys: KeyStore) -> None:
    assert stat.S_IMODE(keys.directory.stat().st_mode) == 0o700
    files = sorted(p.name for p in keys.directory.iterdir())
    assert files == ["active", "checkpoint.pem", f"receipt-{keys.kid}.pem"]
    keys.rotate()
    for path in keys.directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_permissions_hold_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = KeyStore.open(tmp_path)
    finally:
        os.umask(old)
    for path in store.directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_checkpoint_key_is_separate(keys: KeyStore) -> None:
    assert keys.checkpoint_key_name == "dharma-gateway"
    raw = keys.checkpoint_public_key_bytes()
    assert len(raw) == 32
    # published (issue 7) only as the checkpoint JWK, never as a receipt key
    assert [k["use"] for k in keys.jwks()["keys"] if k["x"] == b64e(raw)] == ["dharma-checkpoint"]
    assert all(k["x"] != b64e(raw) for k in keys.jwks()["keys"] if k["use"] == "sig")


def test_rotate_keeps_old_receipts_verifiable(tmp_path: Path, keys: KeyStore) -> None:
    old_kid = keys.kid
    old_token = receipt_for(keys)
    checkpoint = keys.checkpoint_public_key_bytes()
    new_kid = keys.rotate()
    assert new_kid == keys.kid != old_kid
    new_token = receipt_for(keys)
    assert json.loads(b64d(new_token.split(".")[0]))["kid"] == new_kid
    third = keys.rotate()
    jwks = keys.jwks()
    assert [k["kid"] for k in jwks["keys"] if k["use"] == "sig"] == [third, new_kid, old_kid]
    assert jwks["keys"][-1]["use"] == "dharma-checkpoint"  # the checkpoint key stays published, last
    for token in (old_token, new_token):
        verify_receipt(token, jwks, response=RESULT, request=REQUEST)
    # persisted: a fresh open sees the same JWKS; the old private key is gone
    again = KeyStore.open(tmp_path, create=False)
    assert again.jwks() == jwks
    assert again.checkpoint_public_key_bytes() == checkpoint
    assert not (keys.directory / f"receipt-{old_kid}.pem").exists()
    verify_receipt(old_token, again.jwks())


# --- key-file failures --------------------------------------------------------------------------


def test_missing_keys_with_create_false(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keys: missing"):
        KeyStore.open(tmp_path, create=False)
    (tmp_path / "keys").mkdir()
    with pytest.raises(ConfigError, match="active: missing"):
        KeyStore.open(tmp_path, create=False)


def test_missing_active_key_file(tmp_path: Path, keys: KeyStore) -> None:
    (keys.directory / f"receipt-{keys.kid}.pem").unlink()
    with pytest.raises(ConfigError, match=f"receipt-{keys.kid}.pem: missing"):
        KeyStore.open(tmp_path)


def test_missing_checkpoint_with_create_false(tmp_path: Path, keys: KeyStore) -> None:
    (keys.directory / "checkpoint.pem").unlink()
    with pytest.raises(ConfigError, match="checkpoint.pem: missing"):
        KeyStore.open(tmp_path, create=False)
    assert KeyStore.open(tmp_path).kid == keys.kid  # create=True makes only what is missing


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"-----BEGIN PRIVATE KEY-----\nAAAA\n"])
def test_corrupted_key_file(tmp_path: Path, keys: KeyStore, content: bytes) -> None:
    path = keys.directory / f"receipt-{keys.kid}.pem"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"{path}: not a PEM Ed25519 private key"):
        KeyStore.open(tmp_path)


def test_key_file_of_another_type(tmp_path: Path, keys: KeyStore) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    (keys.directory / "checkpoint.pem").write_bytes(other)
    with pytest.raises(ConfigError, match="checkpoint.pem: not a PEM Ed25519 private key"):
        KeyStore.open(tmp_path)


def test_key_file_that_does_not_match_its_name(tmp_path: Path, keys: KeyStore) -> None:
    checkpoint = (keys.directory / "checkpoint.pem").read_bytes()
    (keys.directory / f"receipt-{keys.kid}.pem").write_bytes(checkpoint)
    with pytest.raises(ConfigError, match="not the one its name says"):
        KeyStore.open(tmp_path)


def test_corrupted_active_file(tmp_path: Path, keys: KeyStore) -> None:
    (keys.directory / "active").write_text("../../etc/passwd\n")
    with pytest.raises(ConfigError, match="active: does not name a key id"):
        KeyStore.open(tmp_path)


@pytest.mark.parametrize("content", ["not json", '{"keys": 3}', '{"keys": [{"kid": "x"}]}'])
def test_corrupted_retired_manifest(tmp_path: Path, keys: KeyStore, content: str) -> None:
    (keys.directory / "retired.json").write_text(content)
    with pytest.raises(ConfigError, match="retired.json: "):
        KeyStore.open(tmp_path)


def test_unreadable_key_file(tmp_path: Path, keys: KeyStore) -> None:
    path = keys.directory / f"receipt-{keys.kid}.pem"
    if os.geteuid() == 0:  # root reads through chmod 000; a directory is unreadable to anyone
        path.unlink()
        path.mkdir()
        with pytest.raises(ConfigError, match=f"{path}: is a directory"):
            KeyStore.open(tmp_path)
        return
    path.chmod(0)
    try:
        with pytest.raises(ConfigError, match=f"{path}: permission denied"):
            KeyStore.open(tmp_path)
    finally:
        path.chmod(0o600)


def test_permission_error_is_a_config_error(
        tmp_path: Path, keys: KeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # The chmod-000 case above only runs as non-root; this pins the mapping everywhere.
    path = keys.directory / f"receipt-{keys.kid}.pem"
    real = Path.read_bytes

    def deny(self: Path) -> bytes:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", deny)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: permission denied")):
        KeyStore.open(tmp_path)


def _open_kids(root: str) -> tuple[str, bytes]:
    store = KeyStore.open(Path(root))
    return store.kid, store.checkpoint_public_key_bytes()


def test_concurrent_first_open_agrees_on_one_key(tmp_path: Path) -> None:
    with ProcessPoolExecutor(max_workers=8) as pool:
        seen = set(pool.map(_open_kids, [str(tmp_path)] * 16))
    assert len(seen) == 1
    store = KeyStore.open(tmp_path, create=False)
    assert seen == {(store.kid, store.checkpoint_public_key_bytes())}
    assert sorted(p.name for p in store.directory.iterdir()) == [
        "active", "checkpoint.pem", f"receipt-{store.kid}.pem"]


# --- load_jwks ----------------------------------------------------------------------------------


def test_load_jwks_round_trip(tmp_path: Path, keys: KeyStore) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    verify_receipt(receipt_for(keys), load_jwks(path), response=RESULT)


@pytest.mark.parametrize(("content", "message"), [
    (None, "missing"),
    ("{", "not valid JSON"),
    ("[]", "not a JWKS"),
    ('{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k", "x": "short"}]}', "malformed 'x'"),
])
def test_load_jwks_errors(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "jwks.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: ") + f".*{message}"):
        load_jwks(path)


def test_load_jwks_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_jwks(tmp_path)


def test_the_jwks_publishes_the_checkpoint_key_and_receipts_never_accept_it(keys: KeyStore) -> None:
    from audit.checkpoint import sign_checkpoint, verify_checkpoint_jwks

    jwks = keys.jwks()
    [receipt_jwk, checkpoint_jwk] = jwks["keys"]
    assert receipt_jwk["kid"] == keys.kid and checkpoint_jwk["use"] == "dharma-checkpoint"
    note = sign_checkpoint("o", 1, hashlib.sha256(b"r").digest(), keys.checkpoint_key, keys.checkpoint_key_name)
    assert verify_checkpoint_jwks(note, jwks).size == 1  # the published JWKS alone checks checkpoints
    # a receipt signed with the checkpoint key under its published kid is refused
    header = b64e(json.dumps({"alg": "Ed25519", "kid": checkpoint_jwk["kid"], "typ": "dharma-receipt+jws"}).encode())
    payload = b64e(json.dumps({"v": 1, "kid": checkpoint_jwk["kid"]}).encode())
    sig = b64e(keys.checkpoint_key.sign(f"{header}.{payload}".encode()))
    with pytest.raises(ReceiptInvalid, match="not an Ed25519 signing key"):
        verify_receipt(f"{header}.{payload}.{sig}", jwks)
    # and the rotation of receipt keys leaves the checkpoint key published, last
    keys.rotate()
    assert keys.jwks()["keys"][-1] == checkpoint_jwk and len(keys.jwks()["keys"]) == 3
