"""C2SP signed-note checkpoints of the karma ledger: sign, parse, verify. No I/O.

    <origin>\\n<size>\\n<base64 root>\\n          the checkpoint body (the signed text)
    \\n
    — <key name> <base64(key id[4] || Ed25519 signature[64])>\\n

key id = SHA-256(key name || 0x0A || 0x01 || public key[32])[:4]. Verifiers skip lines by
other keys (that is how rotation and witness cosignatures coexist), but a line from the
expected key that does not verify rejects the whole note. Keys are passed in; this module
never reads key files.

Published as a JWK (beside the receipt keys in the gateway's JWKS), the checkpoint key is
`{"kty": "OKP", "crv": "Ed25519", "x": …, "kid": "<key name>+<hex key id>", "use":
"dharma-checkpoint", "alg": "Ed25519"}`: the kid is the signed-note verifier name, and the
`use` keeps receipt verifiers (which want `"sig"`) from ever accepting it for a receipt.

A checkpoint a ledger *stores* carries one more line by the same key, its stamp (signature type
0xff followed by `dharma-checkpoint-stamp/v1`, which other verifiers skip as an unknown key):

    — <key name> <base64(stamp key id[4] || time[8] || prev[8] || prev stamped[1] || Ed25519 signature[64])>\n

over `dharma-checkpoint-stamp/v1\n` `time <µs since the epoch>\n` `prev <size> stamped|unstamped\n`
(or `prev none\n`) and the whole note before the stamp line (body and signature). `time` is when it
was stored (the row's `created_at`), `prev` the size of the stored checkpoint before it and whether
that one carries a stamp: so `audit verify` checks a stored row's every column against what the key
signed, a deleted stored checkpoint leaves a `prev` naming a size no row holds, and a stamp removed
from a stored checkpoint is named by the next one's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from audit.errors import LedgerError
from audit.merkle import HASH_SIZE

SIG_PREFIX = "\u2014 "
ED25519_TYPE = b"\x01"
CHECKPOINT_USE = "dharma-checkpoint"
CHECKPOINT_ALG = "Ed25519"
STAMP_HEADER = "dharma-checkpoint-stamp/v1"
STAMP_TYPE = b"\xff" + STAMP_HEADER.encode("ascii")
"""Signed-note signature type of the stamp: 0xff ("no identifier byte assigned") and a long identifier."""
_STAMP_FIELDS = struct.Struct(">QQB")  # µs since the epoch; size of the stored checkpoint before; whether it is stamped
_STAMP_SIZE = _STAMP_FIELDS.size + 64
_NO_PREV = 2**64 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class NoteSignature:
    """One signature line: the key's name, its 4-byte key id and the signature bytes."""

    key_name: str
    key_id: bytes
    signature: bytes


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A parsed checkpoint: the log's origin, its size, its Merkle root and the signatures."""

    origin: str
    size: int
    root: bytes
    signatures: tuple[NoteSignature, ...] = ()
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        """The signed text of the note."""
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode("ascii"), *self.extensions]
        return "".join(line + "\n" for line in lines)

    def text(self) -> str:
        """The whole note again: body, blank line, signature lines."""
        lines = (f"{SIG_PREFIX}{s.key_name} {base64.b64encode(s.key_id + s.signature).decode('ascii')}\n"
                 for s in self.signatures)
        return self.body() + "\n" + "".join(lines)


@dataclass(frozen=True, slots=True)
class CheckpointSigner:
    """What a ledger writer needs to sign checkpoints on its own: the key, its name, the origin."""

    private_key: Ed25519PrivateKey
    key_name: str
    origin: str

    def sign(self, size: int, root: bytes) -> str:
        return sign_checkpoint(self.origin, size, root, self.private_key, self.key_name)

    def sign_stored(self, size: int, root: bytes, prev: int | None, time_us: int | None = None, *,
                    prev_stamped: bool = True) -> tuple[str, str]:
        """A note to store, stamped with the time (now) and the size of the stored checkpoint before it
        (`prev`, None for the first) and whether that one is stamped; returns it with the `created_at`
        to store it with."""
        stamped_at = time.time_ns() // 1000 if time_us is None else time_us
        note = stamp_note(self.sign(size, root), self.private_key, self.key_name, stamped_at, prev,
                          prev is not None and prev_stamped)
        return note, stamp_time(stamped_at)

    def made(self, note: str, size: int, root: bytes) -> bool:
        """Whether `note` is this signer's checkpoint of (size, root) (its origin, a line by its key; unverified)."""
        try:
            cp = parse_checkpoint(note)
        except LedgerError:
            return False
        mine = key_id(self.key_name, self.private_key.public_key())
        return (cp.origin, cp.size, cp.root) == (self.origin, size, root) and any(
            s.key_name == self.key_name and s.key_id == mine for s in cp.signatures)


def checkpoint_to_store(signer: CheckpointSigner, size: int, root: bytes,
                        latest: tuple[int, str] | None) -> tuple[str, str | None]:
    """What a ledger writer does to sign its head (size, root), `latest` being the newest stored
    (size, note): (the note to hand out, the `created_at` to store it with, None: store nothing).

    The stored note of that size when `signer` made it (one stored note a size); a new stamped note
    whose `prev` is `latest`'s size; or, when another key's note holds the size, a plain note not stored.
    """
    if latest is not None and latest[0] == size:
        return (latest[1], None) if signer.made(latest[1], size, root) else (signer.sign(size, root), None)
    if latest is None:
        return signer.sign_stored(size, root, None)
    return signer.sign_stored(size, root, latest[0], prev_stamped=read_stamp(latest[1]) is not None)


class CheckpointSchedule:
    """When a ledger writer signs a checkpoint on its own (shared by the SQLite and PostgreSQL writers).

    A checkpoint is due once the tree grew past the last signed size and `interval` seconds of
    `clock` passed since the last one (or a failed try), and always on close; never when the tree
    did not grow. So every committed record is under a stored signed checkpoint within about
    `interval` seconds.
    """

    def __init__(self, signer: CheckpointSigner | None, interval: float, clock: Callable[[], float],
                 checkpointed_size: int = 0) -> None:
        self.signer = signer
        self.interval = interval
        self._clock = clock
        self.checkpointed_size = checkpointed_size
        self._last = clock()
        self._due_at: float | None = None

    def wait_for(self, size: int) -> float | None:
        """Seconds an idle writer may block before a checkpoint of `size` records falls due; None: no limit."""
        if self.signer is None or size <= self.checkpointed_size:
            return None
        return max(self._last + self.interval - self._clock(), 0.0)

    def due(self, size: int, *, final: bool) -> bool:
        """Whether to sign a checkpoint of `size` records now (`final`: the writer is closing)."""
        if self.signer is None or size <= self.checkpointed_size:
            return False
        now = self._clock()
        if final or now - self._last >= self.interval:
            self._due_at = now
            return True
        return False

    def signed(self, size: int) -> None:
        """A checkpoint of `size` records was stored. The next interval counts from when this one fell
        due (or now, for one signed on request), not from when the store returned."""
        self.checkpointed_size = max(self.checkpointed_size, size)
        self._last = self._clock() if self._due_at is None else self._due_at
        self._due_at = None

    def failed(self) -> None:
        """Signing or storing failed; try again one interval later (the records stay committed)."""
        self._last = self._clock()
        self._due_at = None


def key_id(key_name: str, public_key: Ed25519PublicKey) -> bytes:
    """Return the signed-note key id of an Ed25519 key under `key_name`."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(key_name.encode("utf-8") + b"\n" + ED25519_TYPE + raw).digest()[:4]


def sign_checkpoint(
    origin: str, size: int, root: bytes, private_key: Ed25519PrivateKey, key_name: str
) -> str:
    """Return the signed note for the tree head (origin, size, root)."""
    _check_key_name(key_name)
    if not origin or _has_control(origin):
        raise LedgerError(f"checkpoint origin {origin!r} must be one non-empty line")
    if size < 0 or len(root) != HASH_SIZE:
        raise LedgerError(f"cannot sign a checkpoint at size {size} with a {len(root)}-byte root")
    body = Checkpoint(origin, size, root).body()
    signature = private_key.sign(body.encode("utf-8"))
    blob = base64.b64encode(key_id(key_name, private_key.public_key()) + signature).decode("ascii")
    return f"{body}\n{SIG_PREFIX}{key_name} {blob}\n"


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse a signed-note checkpoint without checking any signature.

    Raises:
        LedgerError: the text is not a well-formed checkpoint note.
    """
    body, signatures = _split_note(text)
    lines = body[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise LedgerError("checkpoint body must have origin, size and root lines, none empty")
    origin, size_text, root_text, *extensions = lines
    if not size_text.isascii() or not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise LedgerError(f"checkpoint size {size_text!r} is not a decimal number")
    root = _b64(root_text, "checkpoint root")
    if len(root) != HASH_SIZE:
        raise LedgerError(f"checkpoint root is {len(root)} bytes, expected {HASH_SIZE}")
    return Checkpoint(origin, int(size_text), root, signatures, tuple(extensions))


def verify_checkpoint(text: str, public_key: Ed25519PublicKey, key_name: str) -> Checkpoint:
    """Parse `text` and check its signature by (`key_name`, `public_key`).

    Raises:
        LedgerError: malformed note, no signature by that key, or a signature that fails.
    """
    checkpoint = parse_checkpoint(text)
    wanted = key_id(key_name, public_key)
    mine = [s for s in checkpoint.signatures if s.key_name == key_name and s.key_id == wanted]
    where = f"checkpoint for {checkpoint.origin} at size {checkpoint.size}"
    if not mine:
        raise LedgerError(f"{where} has no signature by key {key_name!r} (key id {wanted.hex()})")
    signed = text[: text.rfind("\n\n") + 1].encode("utf-8")
    for sig in mine:
        try:
            public_key.verify(sig.signature, signed)
        except InvalidSignature:
            raise LedgerError(f"{where}: the signature by key {key_name!r} does not verify") from None
    return checkpoint


@dataclass(frozen=True, slots=True)
class Stamp:
    """The stamp that ends a stored note (unverified until `verify_stamp`): when it was stored
    (microseconds since the epoch), the size of the stored checkpoint before it (None: the first)
    and whether that one carries a stamp."""

    time_us: int
    prev: int | None
    prev_stamped: bool
    key_name: str
    key_id: bytes
    signature: bytes
    message: bytes

    @property
    def created_at(self) -> str:
        """The `created_at` a writer stores with the note."""
        return stamp_time(self.time_us)


def stamp_key_id(key_name: str, public_key: Ed25519PublicKey) -> bytes:
    """The key id of `public_key`'s stamps: as `key_id`, with the stamp's signature type."""
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(key_name.encode("utf-8") + b"\n" + STAMP_TYPE + raw).digest()[:4]


def stamp_time(time_us: int) -> str:
    """A stamp's time as RFC 3339 UTC with microseconds, the form writers store in `created_at` (a time
    past year 9999 is no such time, and says so)."""
    try:
        return (_EPOCH + timedelta(microseconds=time_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except OverflowError:
        return f"{time_us} microseconds after 1970 (past year 9999)"


def _stamp_message(prefix: str, time_us: int, prev: int | None, prev_stamped: bool) -> bytes:
    before = "none" if prev is None else f"{prev} {'stamped' if prev_stamped else 'unstamped'}"
    return f"{STAMP_HEADER}\ntime {time_us}\nprev {before}\n{prefix}".encode("utf-8")


def stamp_note(note: str, private_key: Ed25519PrivateKey, key_name: str, time_us: int, prev: int | None,
               prev_stamped: bool) -> str:
    """`note` with its stamp line appended (see the module docstring)."""
    if not 0 <= time_us < _NO_PREV or (prev is not None and not 0 <= prev < _NO_PREV):
        raise LedgerError(f"cannot stamp a checkpoint with time {time_us} and prev {prev}")
    signature = private_key.sign(_stamp_message(note, time_us, prev, prev_stamped))
    fields = _STAMP_FIELDS.pack(time_us, _NO_PREV if prev is None else prev, int(prev_stamped))
    blob = base64.b64encode(stamp_key_id(key_name, private_key.public_key()) + fields + signature).decode("ascii")
    return f"{note}{SIG_PREFIX}{key_name} {blob}\n"


def read_stamp(text: str) -> Stamp | None:
    """The stamp of a well-formed note (`parse_checkpoint` accepted it): its last signature line when
    that has a stamp's length and form and follows another signature line; None otherwise. Not verified."""
    cut = text.rfind("\n\n") + 2
    last = text.rfind("\n", cut, len(text) - 1) + 1
    if last <= cut:
        return None
    line = _parse_signature(text[last:-1])
    if len(line.signature) != _STAMP_SIZE:
        return None
    time_us, prev, flag = _STAMP_FIELDS.unpack(line.signature[: _STAMP_FIELDS.size])
    prev_size = None if prev == _NO_PREV else prev
    if flag > 1 or (prev_size is None and flag):  # not as `stamp_note` writes it: no stamp
        return None
    prev_stamped = flag == 1
    return Stamp(time_us, prev_size, prev_stamped, line.key_name, line.key_id, line.signature[_STAMP_FIELDS.size :],
                 _stamp_message(text[:last], time_us, prev_size, prev_stamped))


def verify_stamp(stamp: Stamp, public_key: Ed25519PublicKey, key_name: str, stamp_id: bytes | None = None) -> None:
    """Check that (`key_name`, `public_key`) made `stamp` (`stamp_id`: its `stamp_key_id`, if the caller has it).

    Raises:
        LedgerError: the stamp is another key's, or its signature does not verify.
    """
    wanted = stamp_key_id(key_name, public_key) if stamp_id is None else stamp_id
    if stamp.key_name != key_name or stamp.key_id != wanted:
        raise LedgerError(f"its stamp is by key {stamp.key_name!r} (stamp key id {stamp.key_id.hex()}), not by {key_name!r}")
    try:
        public_key.verify(stamp.signature, stamp.message)
    except InvalidSignature:
        raise LedgerError(f"its stamp by key {key_name!r} does not verify") from None


def _split_note(text: str) -> tuple[str, tuple[NoteSignature, ...]]:
    if not isinstance(text, str) or not text.endswith("\n"):
        raise LedgerError("checkpoint note must be text ending in a newline")
    cut = text.rfind("\n\n")
    if cut < 0:
        raise LedgerError("checkpoint note has no blank line before its signatures")
    body, sig_block = text[: cut + 1], text[cut + 2 :]
    if _has_control(body.replace("\n", "")):
        raise LedgerError("checkpoint body contains control characters")
    sig_lines = sig_block[:-1].split("\n") if sig_block else []
    if not sig_lines:
        raise LedgerError("checkpoint note has no signature lines")
    return body, tuple(_parse_signature(line) for line in sig_lines)


def _parse_signature(line: str) -> NoteSignature:
    if not line.startswith(SIG_PREFIX):
        raise LedgerError(f"checkpoint signature line {line[:40]!r} does not start with '{SIG_PREFIX}'")
    name, sep, blob_text = line[len(SIG_PREFIX) :].partition(" ")
    if not sep or not name or " " in blob_text:
        raise LedgerError(f"checkpoint signature line {line[:40]!r} is not '— <name> <base64>'")
    blob = _b64(blob_text, f"signature by {name!r}")
    if len(blob) < 5:
        raise LedgerError(f"checkpoint signature by {name!r} is too short")
    return NoteSignature(name, blob[:4], blob[4:])


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise LedgerError(f"{what} is not valid base64") from None


def _check_key_name(name: str) -> None:
    if not name or "+" in name or any(c.isspace() for c in name) or _has_control(name):
        raise LedgerError(f"key name {name!r} must be non-empty, without spaces or '+'")


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _has_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


def checkpoint_jwk(key_name: str, public_key: Ed25519PublicKey) -> dict[str, str]:
    """Return the public JWK that publishes the checkpoint key (see the module docstring)."""
    _check_key_name(key_name)
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    kid = f"{key_name}+{key_id(key_name, public_key).hex()}"
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": CHECKPOINT_USE, "alg": CHECKPOINT_ALG}


def checkpoint_keys(jwks: object) -> list[tuple[str, Ed25519PublicKey]]:
    """The (key name, public key) of every checkpoint key a JWKS publishes.

    Raises:
        LedgerError: a checkpoint JWK is malformed or its kid does not match its key.
    """
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(keys, list):
        raise LedgerError("JWKS has no 'keys' list")
    found: list[tuple[str, Ed25519PublicKey]] = []
    for i, jwk in enumerate(keys):
        if not isinstance(jwk, dict) or jwk.get("use") != CHECKPOINT_USE:
            continue
        kid = jwk.get("kid")
        name, _, _ = str(kid).rpartition("+")
        x = jwk.get("x")
        try:
            raw = base64.urlsafe_b64decode(str(x) + "=" * (-len(str(x)) % 4))
            public_key = Ed25519PublicKey.from_public_bytes(raw)
        except (ValueError, binascii.Error):
            raise LedgerError(f"JWKS keys[{i}] (kid {kid!r}): 'x' is not an Ed25519 public key") from None
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or not name or checkpoint_jwk(name, public_key)["kid"] != kid:
            raise LedgerError(f"JWKS keys[{i}] (kid {kid!r}) is not a well-formed checkpoint key: kid must be "
                              "'<key name>+<hex key id>' of its Ed25519 key")
        found.append((name, public_key))
    return found


def verify_checkpoint_jwks(text: str, jwks: object) -> Checkpoint:
    """Check a checkpoint against the checkpoint keys a JWKS publishes; one must have signed it.

    Raises:
        LedgerError: no checkpoint key in the JWKS, none of them signed the note, or a signature fails.
    """
    keys = checkpoint_keys(jwks)
    if not keys:
        raise LedgerError(f"the JWKS publishes no checkpoint key (no key with use {CHECKPOINT_USE!r})")
    return verify_checkpoint_keys(text, keys, "published")


def verify_checkpoint_keys(text: str, keys: Sequence[tuple[str, Ed25519PublicKey]], which: str = "known") -> Checkpoint:
    """Check a checkpoint against known checkpoint keys (name, public key); one must have signed it.

    Raises:
        LedgerError: none of them signed the note, or a signature fails.
    """
    checkpoint = parse_checkpoint(text)
    for name, public_key in keys:
        wanted = key_id(name, public_key)
        if any(s.key_name == name and s.key_id == wanted for s in checkpoint.signatures):
            return verify_checkpoint(text, public_key, name)
    kids = ", ".join(f"{name}+{key_id(name, pk).hex()}" for name, pk in keys)
    raise LedgerError(f"checkpoint for {checkpoint.origin} at size {checkpoint.size} is signed by none of the "
                      f"{which} checkpoint keys ({kids or 'none'})")
