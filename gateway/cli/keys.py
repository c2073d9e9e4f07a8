"""`dharma keys jwks|rotate` and `dharma receipt verify`: the published keys and offline verification.

The JWKS lists the receipt keys and the ledger-checkpoint key; `receipt verify --ledger` also
checks that the receipt's ledger position and hash are in a ledger file or an export bundle.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gateway.core.errors import ConfigError
from gateway.cli.common import BadJson, COMMANDS, EXIT_FAILED, EXIT_OK, add_command, add_group, json_arg, open_keys, out


def cmd_keys_jwks(args: argparse.Namespace) -> int:
    out(json.dumps(open_keys(args, create=True).jwks(), indent=2))
    return EXIT_OK


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    kid = open_keys(args, create=True).rotate()
    out(f"new active key {kid}; the old key stays in the JWKS")
    return EXIT_OK


def cmd_receipt_verify(args: argparse.Namespace) -> int:
    from gateway.crypto.receipts import ReceiptInvalid, load_jwks, verify_receipt

    jwks = load_jwks(Path(args.jwks)) if args.jwks else open_keys(args, create=False).jwks()
    try:  # a file that could be read two ways (a duplicate `result`) proves nothing: the check fails
        saved = json_arg("@" + args.response, "response file")
        request = json_arg("@" + args.request, "request file") if args.request else None
    except BadJson as exc:
        out(f"FAIL {exc}")
        return EXIT_FAILED
    token, response = _split_receipt(saved)
    if token is None:
        out(f"FAIL {args.response}: no receipt found (expected `receipt` or result._meta[\"dharma.gateway/receipt\"])")
        return EXIT_FAILED
    try:
        payload = verify_receipt(token, jwks, response=response, request=request)
    except ReceiptInvalid as exc:
        out(f"FAIL {args.response}: {exc}")
        return EXIT_FAILED
    where = ""
    if args.ledger:
        try:
            where = _check_in_ledger(Path(args.ledger), payload, jwks)
        except ReceiptInvalid as exc:
            out(f"FAIL {args.response}: {exc}")
            return EXIT_FAILED
    out(f"OK receipt by key {payload['kid']} at {payload['time']}: request {payload['request_id']}, ledger seq {payload['ledger']['seq']}{where}")
    return EXIT_OK


def _check_in_ledger(path: Path, payload: dict[str, Any], jwks: dict[str, Any]) -> str:
    """Find the receipt's record in a ledger file or a bundle (verified first); say where it was found."""
    from audit.errors import LedgerError
    from audit.export import BundleReader, verify_bundle
    from audit.sqlite import SqliteLedgerReader
    from audit.sqlite_files import SQLITE_HEADER
    from gateway.crypto.receipts import ReceiptInvalid, check_receipt_in_ledger

    try:
        with path.open("rb") as fh:
            is_sqlite = fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the ledger: {exc.strerror or exc}") from None
    seq = payload["ledger"]["seq"] if isinstance(payload.get("ledger"), dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ReceiptInvalid(f"the receipt's ledger.seq {seq!r} is not a position")
    try:
        if is_sqlite:
            with SqliteLedgerReader(path) as reader:
                check_receipt_in_ledger(payload, reader.get(seq))
                return f", found in {path}{_under_checkpoint(reader, seq, jwks)}"
        report = verify_bundle(path, jwks)
        if not report.ok:
            raise ReceiptInvalid(f"the bundle does not verify: {report.problem}")
        with BundleReader(path) as bundle:
            check_receipt_in_ledger(payload, bundle.get(seq))
        return f", found in {path} (signed checkpoint at size {report.size})"
    except LedgerError as exc:
        raise ConfigError(str(exc)) from None


def _under_checkpoint(reader: Any, seq: int, jwks: dict[str, Any]) -> str:
    """Prove record `seq` is in the tree of the ledger's latest stored checkpoint (signed by a JWKS key)."""
    from audit import merkle
    from audit.checkpoint import verify_checkpoint_jwks
    from audit.errors import LedgerError
    from gateway.crypto.receipts import ReceiptInvalid

    note = reader.latest_checkpoint()
    if note is None:
        return " (the ledger holds no signed checkpoint yet)"
    try:
        checkpoint = verify_checkpoint_jwks(note, jwks)
    except LedgerError as exc:
        raise ReceiptInvalid(f"the ledger's latest checkpoint: {exc}") from None
    if checkpoint.size < seq:
        return f" (newer than its latest signed checkpoint, at size {checkpoint.size})"
    leaves = reader.leaf_hashes(checkpoint.size)
    proof = merkle.inclusion_proof(leaves, seq - 1)
    if not merkle.verify_inclusion(seq - 1, checkpoint.size, merkle.leaf_hash(reader.get(seq).body), proof, checkpoint.root):
        raise ReceiptInvalid(f"record {seq} is not in the tree the checkpoint at size {checkpoint.size} signed")
    return f", included in its signed checkpoint at size {checkpoint.size}"


def _split_receipt(saved: Any) -> tuple[str | None, Any]:
    """Find the receipt in an HTTP envelope, an MCP result, or a JSON-RPC response."""
    from gateway.crypto.receipts import RECEIPT_META_KEY

    if isinstance(saved, dict) and "envelope_version" in saved:
        body = {k: v for k, v in saved.items() if k != "receipt"}
        return saved.get("receipt"), body
    result = saved.get("result", saved) if isinstance(saved, dict) and "jsonrpc" in saved else saved
    if isinstance(result, dict) and isinstance(result.get("_meta"), dict):
        return result["_meta"].get(RECEIPT_META_KEY), result
    return None, saved



def add_parsers(sub: Any) -> None:
    """Add `dharma keys jwks|rotate` and `dharma receipt verify` to the `dharma` subparsers."""
    keys = add_group(sub, "keys", COMMANDS["keys"], "keys_command")
    add_command(keys, "jwks", "print the public keys (receipt keys and the checkpoint key) as a JWKS").set_defaults(func=cmd_keys_jwks)
    add_command(keys, "rotate", "make a new active key; old ones stay published").set_defaults(func=cmd_keys_rotate)

    receipt = add_group(sub, "receipt", COMMANDS["receipt"], "receipt_command")
    p = add_command(receipt, "verify", "check a saved response's receipt against a JWKS")
    p.add_argument("response", metavar="RESPONSE.json", help="a saved response (HTTP envelope, MCP result or JSON-RPC response)")
    p.add_argument("--jwks", help="a saved JWKS (default: this machine's keys)")
    p.add_argument("--request", help="the request as sent, to check its digest too")
    p.add_argument("--ledger", metavar="L", help="a ledger file or an export bundle: check the receipt's record is in it")
    p.set_defaults(func=cmd_receipt_verify)
