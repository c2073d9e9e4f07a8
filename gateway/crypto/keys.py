"""Signing keys: the gateway's Ed25519 receipt and checkpoint keys, and their files on disk.

Key-file layout under ``<state_root>/keys/`` (directory mode 0700, every file mode 0600)::

    active                  one line: the kid of the active receipt key
    receipt-<kid>.pem       the active receipt key, PEM PKCS#8, unencrypted
    retired.json            {"keys": [<public JWK>, ...]} every retired receipt key, newest first;
                            public halves only, never deleted
    checkpoint.pem          the ledger-checkpoint key (a separate Ed25519 key), PEM PKCS#8

Every file is written to a temp file created 0600, fsynced, then renamed into place. First-time
creation links the new file in without clobbering, so two processes racing on an empty state root
agree on one key. On rotation the old private key file is deleted after ``active`` names the new
kid; only its public half survives, in ``retired.json``.

This module owns key-file I/O (``KeyStore``) and the public-JWK helpers; building and verifying
receipts is ``gateway.crypto.receipts``'s job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from audit.canon import canonical_bytes
from audit.checkpoint import checkpoint_jwk
from gateway.core.errors import ConfigError
from gateway.crypto.b64 import Base64urlError, b64url_decode, b64url_encode
from gateway.crypto import strict_json
from gateway.crypto.strict_json import StrictJSONError

__all__ = [
    "CHECKPOINT_KEY_NAME",
    "RECEIPT_ALG",
    "RECEIPT_TYP",
    "ActiveKey",
    "KeyStore",
    "check_x",
    "jwk_thumbprint",
    "read_bytes",
    "validate_jwks",
]

log = structlog.get_logger()

RECEIPT_TYP = "dharma-receipt+jws"
CHECKPOINT_KEY_NAME = "dharma-gateway"

RECEIPT_ALG = "Ed25519"
_KID = re.compile(r"[A-Za-z0-9_-]{43}")  # base64url of a SHA-256, no padding


# --- JWK helpers --------------------------------------------------------------------------------


def jwk_thumbprint(x: str) -> str:
    """Return the RFC 7638 thumbprint (base64url SHA-256) of an Ed25519 OKP JWK with this ``x``."""
    members = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    return b64url_encode(hashlib.sha256(members.encode("ascii")).digest())


def _public_x(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64url_encode(raw)


def _public_jwk(x: str, kid: str) -> dict[str, str]:
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig", "alg": RECEIPT_ALG}


def check_x(x: object) -> str | None:
    """Return ``x`` if it is the canonical base64url of 32 bytes, else None."""
    if not isinstance(x, str) or len(x) != 43:
        return None
    try:
        b64url_decode(x)
    except Base64urlError:
        return None
    return x


# --- key files ----------------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    """Read a key-related file, mapping every OS failure to a ConfigError naming the file."""
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: missing") from exc
    except PermissionError as exc:
        raise ConfigError(f"{path}: permission denied") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{path}: is a directory, not a file") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _load_private_key(path: Path) -> Ed25519PrivateKey:
    data = read_bytes(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # encrypted PEM
        raise ConfigError(f"{path}: not a PEM Ed25519 private key (it is encrypted)") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"{path}: not a PEM Ed25519 private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path}: not a PEM Ed25519 private key ({type(key).__name__})")
    _warn_if_loose(path)
    return key


def _warn_if_loose(path: Path) -> None:
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("keys.permissions_loose", path=str(path), mode=oct(mode))


def _pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_atomic(path: Path, data: bytes, *, clobber: bool = True) -> bool:
    """Write ``data`` to ``path`` via a 0600 temp file and a rename.

    With ``clobber=False`` the file is linked in only if ``path`` does not exist yet, and the
    return value says whether this call created it (False: another writer got there first).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)  # before any content, whatever the umask did
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if clobber:
            os.replace(tmp, path)
            created = True
        else:
            try:
                os.link(tmp, path)
                created = True
            except FileExistsError:
                created = False
            finally:
                tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)
        return created
    except PermissionError as exc:
        raise ConfigError(f"{path}: permission denied") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class ActiveKey:
    """The key receipts are signed with, plus its precomputed protected-header segment."""

    kid: str
    x: str
    private_key: Ed25519PrivateKey
    header_b64: bytes

    @classmethod
    def of(cls, key: Ed25519PrivateKey) -> ActiveKey:
        x = _public_x(key)
        kid = jwk_thumbprint(x)
        header = canonical_bytes({"alg": RECEIPT_ALG, "kid": kid, "typ": RECEIPT_TYP})
        return cls(kid=kid, x=x, private_key=key, header_b64=b64url_encode(header).encode("ascii"))

    def sign(self, payload: Mapping[str, Any]) -> str:
        signing_input = self.header_b64 + b"." + b64url_encode(canonical_bytes(payload)).encode("ascii")
        signature = self.private_key.sign(signing_input)
        return f"{signing_input.decode('ascii')}.{b64url_encode(signature)}"


class KeyStore:
    """The gateway's signing keys under ``<state_root>/keys/``: receipt keys and the checkpoint key.

    Open it once at startup; signing then touches no file. Not for concurrent rotation from
    several processes (rotation is an operator action); concurrent first-time creation is safe.
    """

    def __init__(
        self,
        directory: Path,
        active: Ed25519PrivateKey,
        retired: list[dict[str, str]],
        checkpoint_key: Ed25519PrivateKey,
        checkpoint_key_name: str = CHECKPOINT_KEY_NAME,
    ) -> None:
        self.directory = directory
        self._active = ActiveKey.of(active)
        self._retired = retired
        self.checkpoint_key = checkpoint_key
        self.checkpoint_key_name = checkpoint_key_name

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, state_root: Path, *, create: bool = True) -> KeyStore:
        """Load the keys under ``<state_root>/keys/``, creating any that are missing if ``create``.

        Raises:
            ConfigError: a key file is missing (with ``create=False``), unreadable or corrupt.
        """
        directory = Path(state_root) / "keys"
        if create:
            try:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"{directory}: cannot create: {exc.strerror or exc}") from exc
        if not directory.is_dir():
            raise ConfigError(f"{directory}: missing (no keys; run with key creation enabled)")
        _warn_if_loose(directory)
        try:
            active = cls._open_active(directory, create=create)
            retired = cls._read_retired(directory / "retired.json")
            checkpoint = cls._open_checkpoint(directory / "checkpoint.pem", create=create)
        except PermissionError as exc:  # e.g. stat() inside an unsearchable directory
            raise ConfigError(f"{exc.filename or directory}: permission denied") from exc
        store = cls(directory, active, retired, checkpoint)
        log.info("keys.opened", kid=store.kid, retired=len(retired), directory=str(directory))
        return store

    @staticmethod
    def _open_active(directory: Path, *, create: bool) -> Ed25519PrivateKey:
        active_file = directory / "active"
        if create and not active_file.exists():
            key = Ed25519PrivateKey.generate()
            kid = jwk_thumbprint(_public_x(key))
            _write_atomic(directory / f"receipt-{kid}.pem", _pem(key), clobber=False)
            if _write_atomic(active_file, f"{kid}\n".encode("ascii"), clobber=False):
                log.info("keys.created", kid=kid, use="receipt")
                return key
            (directory / f"receipt-{kid}.pem").unlink(missing_ok=True)  # lost the race
        raw = read_bytes(active_file)
        kid = raw.decode("ascii", errors="replace").strip()
        if not _KID.fullmatch(kid):
            raise ConfigError(f"{active_file}: does not name a key id (expected a 43-char kid)")
        path = directory / f"receipt-{kid}.pem"
        if not path.exists() and not path.is_symlink():
            raise ConfigError(f"{path}: missing (named as the active key by {active_file})")
        key = _load_private_key(path)
        actual = jwk_thumbprint(_public_x(key))
        if actual != kid:
            raise ConfigError(f"{path}: holds the key with kid {actual}, not the one its name says")
        return key

    @staticmethod
    def _read_retired(path: Path) -> list[dict[str, str]]:
        if not path.exists() and not path.is_symlink():
            return []
        try:
            doc = strict_json.loads(read_bytes(path))
        except StrictJSONError as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from None
        try:
            keys = validate_jwks(doc, require_thumbprint=True)["keys"]
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        return [_public_jwk(k["x"], k["kid"]) for k in keys]

    @staticmethod
    def _open_checkpoint(path: Path, *, create: bool) -> Ed25519PrivateKey:
        if create and not path.exists() and not path.is_symlink():
            key = Ed25519PrivateKey.generate()
            if _write_atomic(path, _pem(key), clobber=False):
                log.info("keys.created", use="checkpoint")
                return key
        return _load_private_key(path)

    # -- receipt keys ----------------------------------------------------------------------------

    @property
    def active(self) -> ActiveKey:
        """The active receipt key as one snapshot (its kid and signing key always agree)."""
        return self._active

    @property
    def kid(self) -> str:
        """The RFC 7638 thumbprint of the active receipt key."""
        return self._active.kid

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        """Return the public JWKS: the active receipt key first, every retired one newest first,
        then the checkpoint key (kid `<key name>+<hex key id>`, use `dharma-checkpoint`, so a
        receipt verifier never takes it for a receipt key; see `audit.checkpoint`)."""
        active = self._active
        keys = [_public_jwk(active.x, active.kid)]
        keys.extend(dict(k) for k in self._retired if k["kid"] != active.kid)
        keys.append(checkpoint_jwk(self.checkpoint_key_name, self.checkpoint_key.public_key()))
        return {"keys": keys}

    def sign(self, payload: Mapping[str, Any]) -> str:
        """Return a compact JWS over ``canonical_bytes(payload)`` with the active receipt key."""
        return self._active.sign(payload)

    def rotate(self) -> str:
        """Make a new active receipt key, retire the old one (kept in the JWKS), return the new kid.

        Order: write the new key, publish the old public key in ``retired.json``, switch
        ``active``, delete the old private key. A crash at any point leaves a loadable store.
        """
        old = self._active
        key = Ed25519PrivateKey.generate()
        new = ActiveKey.of(key)
        _write_atomic(self.directory / f"receipt-{new.kid}.pem", _pem(key))
        retired = [_public_jwk(old.x, old.kid)]
        retired.extend(k for k in self._retired if k["kid"] not in (old.kid, new.kid))
        doc = json.dumps({"keys": retired}, indent=2) + "\n"
        _write_atomic(self.directory / "retired.json", doc.encode("ascii"))
        _write_atomic(self.directory / "active", f"{new.kid}\n".encode("ascii"))
        self._retired = retired
        self._active = new
        with contextlib.suppress(OSError):
            (self.directory / f"receipt-{old.kid}.pem").unlink()
        log.info("keys.rotated", kid=new.kid, retired_kid=old.kid)
        return new.kid

    # -- checkpoint key --------------------------------------------------------------------------

    def checkpoint_public_key_bytes(self) -> bytes:
        """Return the raw 32-byte public key of the ledger-checkpoint key."""
        return self.checkpoint_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )


# --- JWKS documents -----------------------------------------------------------------------------


def validate_jwks(doc: object, *, require_thumbprint: bool = False) -> dict[str, Any]:
    """Check the shape of a JWKS document; raise ValueError saying what is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError("not a JWKS (expected an object with a 'keys' list)")
    for i, jwk in enumerate(doc["keys"]):
        if not isinstance(jwk, dict):
            raise ValueError(f"keys[{i}] is not an object")
        kid = jwk.get("kid")
        if not isinstance(kid, str) or not kid:
            raise ValueError(f"keys[{i}] has no kid")
        if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519":
            x = check_x(jwk.get("x"))
            if x is None:
                raise ValueError(f"keys[{i}] (kid {kid}) has a malformed 'x'")
            if require_thumbprint and jwk_thumbprint(x) != kid:
                raise ValueError(f"keys[{i}] kid {kid} is not the thumbprint of its key")
        elif require_thumbprint:
            raise ValueError(f"keys[{i}] (kid {kid}) is not an Ed25519 OKP key")
    return doc
