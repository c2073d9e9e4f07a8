"""C2SP signed-note checkpoints: exact format, key id, verification and its failures."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from audit.checkpoint import key_id, parse_checkpoint, sign_checkpoint, verify_checkpoint
from audit.errors import LedgerError

ROOT = hashlib.sha256(b"root").digest()


def test_note_has_the_c2sp_shape_and_key_id(key: Ed25519PrivateKey) -> None:
    note = sign_checkpoint("example.com/karma", 42, ROOT, key, "karma-1")
    body, sig_line = note.split("\n\n")
    assert body == f"example.com/karma\n42\n{base64.b64encode(ROOT).decode()}"
    assert sig_line.startswith("\u2014 karma-1 ") and sig_line.endswith("\n")
    blob = base64.b64decode(sig_line.split(" ")[2])
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert blob[:4] == hashlib.sha256(b"karma-1\n\x01" + raw).digest()[:4] == key_id("karma-1", key.public_key())
    key.public_key().verify(blob[4:], (body + "\n").encode())


def test_round_trip(key: Ed25519PrivateKey) -> None:
    note = sign_checkpoint("example.com/karma", 0, hashlib.sha256(b"").digest(), key, "karma-1")
    checkpoint = verify_checkpoint(note, key.public_key(), "karma-1")
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == ("example.com/karma", 0, hashlib.sha256(b"").digest())
    assert parse_checkpoint(note) == checkpoint
    assert note.startswith(checkpoint.body() + "\n")


def test_unknown_signers_are_ignored_so_cosigned_notes_verify(key: Ed25519PrivateKey) -> None:
    witness = Ed25519PrivateKey.generate()
    note = sign_checkpoint("o", 5, ROOT, key, "log")
    cosigned = note + sign_checkpoint("o", 5, ROOT, witness, "witness").split("\n\n")[1]
    assert verify_checkpoint(cosigned, key.public_key(), "log").size == 5
    assert verify_checkpoint(cosigned, witness.public_key(), "witness").size == 5
    assert len(parse_checkpoint(cosigned).signatures) == 2


def test_wrong_key_or_name_is_refused(key: Ed25519PrivateKey) -> None:
    note = sign_checkpoint("o", 5, ROOT, key, "log")
    with pytest.raises(LedgerError, match="no signature by key 'log'"):
        verify_checkpoint(note, Ed25519PrivateKey.generate().public_key(), "log")
    with pytest.raises(LedgerError, match="no signature by key 'other'"):
        verify_checkpoint(note, key.public_key(), "other")


@pytest.mark.parametrize(
    ("old", "new"),
    [("\n5\n", "\n6\n"), ("o\n", "p\n")],
)
def test_an_edited_body_does_not_verify(key: Ed25519PrivateKey, old: str, new: str) -> None:
    note = sign_checkpoint("o", 5, ROOT, key, "log")
    with pytest.raises(LedgerError, match="does not verify"):
        verify_checkpoint(note.replace(old, new, 1), key.public_key(), "log")


def test_an_edited_root_does_not_verify(key: Ed25519PrivateKey) -> None:
    note = sign_checkpoint("o", 5, ROOT, key, "log")
    other = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(LedgerError, match="does not verify"):
        verify_checkpoint(note.replace(base64.b64encode(ROOT).decode(), other), key.public_key(), "log")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "o\n5\n",
        "o\n5\nAAAA\n\n\u2014 log AAAAAAAA\n",
        "o\n05\n" + base64.b64encode(ROOT).decode() + "\n\n\u2014 log AAAAAAAA\n",
        "o\nfive\n" + base64.b64encode(ROOT).decode() + "\n\n\u2014 log AAAAAAAA\n",
        "o\n5\n" + base64.b64encode(ROOT).decode() + "\n\n- log AAAAAAAA\n",
        "o\n5\n" + base64.b64encode(ROOT).decode() + "\n\n\u2014 log not*base64\n",
        "o\n5\n" + base64.b64encode(ROOT).decode() + "\n\n\u2014 log AAAAAAAA",
        "o\n5\n" + base64.b64encode(ROOT).decode() + "\n\n",
    ],
)
def test_malformed_notes_raise_ledger_error(text: str) -> None:
    with pytest.raises(LedgerError):
        parse_checkpoint(text)


@pytest.mark.parametrize("name", ["", "has space", "a+b"])
def test_bad_key_names_are_refused(key: Ed25519PrivateKey, name: str) -> None:
    with pytest.raises(LedgerError, match="key name"):
        sign_checkpoint("o", 1, ROOT, key, name)


def test_the_published_jwk_verifies_notes_and_names_the_key(key: Ed25519PrivateKey) -> None:
    from audit.checkpoint import checkpoint_jwk, verify_checkpoint_jwks

    jwk = checkpoint_jwk("dharma-gateway", key.public_key())
    assert jwk["kid"] == "dharma-gateway+" + key_id("dharma-gateway", key.public_key()).hex()
    assert (jwk["use"], jwk["alg"], jwk["kty"], jwk["crv"]) == ("dharma-checkpoint", "Ed25519", "OKP", "Ed25519")
    receipt_key = {"kty": "OKP", "crv": "Ed25519", "x": jwk["x"], "kid": "r", "use": "sig", "alg": "Ed25519"}
    note = sign_checkpoint("o", 3, ROOT, key, "dharma-gateway")
    assert verify_checkpoint_jwks(note, {"keys": [receipt_key, jwk]}).size == 3
    with pytest.raises(LedgerError, match="publishes no checkpoint key"):
        verify_checkpoint_jwks(note, {"keys": [receipt_key]})  # a receipt key is never a checkpoint key
    other = checkpoint_jwk("dharma-gateway", Ed25519PrivateKey.generate().public_key())
    with pytest.raises(LedgerError, match="signed by none of the published checkpoint keys"):
        verify_checkpoint_jwks(note, {"keys": [other]})
    with pytest.raises(LedgerError, match="not a well-formed checkpoint key"):
        verify_checkpoint_jwks(note, {"keys": [{**jwk, "x": other["x"]}]})  # kid no longer names its key


def test_a_stored_note_carries_a_stamp_by_the_same_key_that_c2sp_verifiers_skip(key: Ed25519PrivateKey) -> None:
    from audit.checkpoint import CheckpointSigner, read_stamp, stamp_key_id, verify_stamp

    signer = CheckpointSigner(key, "log", "o")
    note, created_at = signer.sign_stored(7, ROOT, 5, time_us=1_767_225_600_123_456)
    plain = signer.sign(7, ROOT)
    assert note.startswith(plain) and created_at == "2026-01-01T00:00:00.123456Z"
    assert verify_checkpoint(note, key.public_key(), "log").size == 7  # the stamp is an unknown key's line to it
    line = note[len(plain):]
    assert line.startswith("\u2014 log ") and line.endswith("\n")
    blob = base64.b64decode(line.split(" ")[2])
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert blob[:4] == hashlib.sha256(b"log\n\xffdharma-checkpoint-stamp/v1" + raw).digest()[:4] == stamp_key_id("log", key.public_key())
    assert int.from_bytes(blob[4:12], "big") == 1_767_225_600_123_456 and int.from_bytes(blob[12:20], "big") == 5
    assert blob[20] == 1  # the stored checkpoint before it is stamped
    key.public_key().verify(blob[21:], b"dharma-checkpoint-stamp/v1\ntime 1767225600123456\nprev 5 stamped\n" + plain.encode())
    stamp = read_stamp(note)
    assert stamp is not None and (stamp.prev, stamp.prev_stamped, stamp.created_at) == (5, True, created_at)
    verify_stamp(stamp, key.public_key(), "log")
    assert read_stamp(plain) is None
    first = read_stamp(signer.sign_stored(7, ROOT, None)[0])
    assert first is not None and (first.prev, first.prev_stamped) == (None, False)
    after_legacy = read_stamp(signer.sign_stored(7, ROOT, 5, prev_stamped=False)[0])
    assert after_legacy is not None and (after_legacy.prev, after_legacy.prev_stamped) == (5, False)


def test_an_edited_stamp_or_note_under_it_does_not_verify(key: Ed25519PrivateKey) -> None:
    from audit.checkpoint import CheckpointSigner, read_stamp, verify_stamp

    note, _ = CheckpointSigner(key, "log", "o").sign_stored(7, ROOT, 5, time_us=1_000)
    plain, stamp_line = note[: note.rstrip("\n").rfind("\n") + 1], note[note.rstrip("\n").rfind("\n") + 1 :]
    blob = bytearray(base64.b64decode(stamp_line.split(" ")[2]))
    blob[19] ^= 1  # prev 5 -> 4
    edited = plain + f"\u2014 log {base64.b64encode(bytes(blob)).decode()}\n"
    signature = base64.b64decode(plain.split("\n")[-2].split(" ")[2])
    forged_sig = plain.replace(base64.b64encode(signature).decode(), base64.b64encode(signature[:-1] + bytes([signature[-1] ^ 1])).decode())
    for bad in (edited, forged_sig + stamp_line):
        stamp = read_stamp(bad)
        assert stamp is not None
        with pytest.raises(LedgerError, match="its stamp by key 'log' does not verify"):
            verify_stamp(stamp, key.public_key(), "log")
    with pytest.raises(LedgerError, match="not by 'other'"):
        verify_stamp(read_stamp(note), key.public_key(), "other")  # type: ignore[arg-type]
