"""`dharma audit|approvals|keys|receipt`: the auditor's and approver's commands.

Verify, query and checkpoint the karma ledger, list and decide held calls, print or rotate the
receipt keys, and verify saved receipts offline. Thin, like the rest of `gateway.cli.main` (which
registers these subcommands and maps errors to exit codes): parse, call library functions, print.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from gateway.cli.main import EXIT_FAILED, EXIT_OK, _json_arg, _out, _settings
from gateway.core.errors import ConfigError


def _time_arg(text: str) -> str:
    """An RFC 3339 time (or date) for --since/--until; anything else is a usage error, not an empty result."""
    from datetime import datetime

    try:
        datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text!r} (e.g. 2026-11-22T00:00:00Z)") from None
    return text


def _count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, not {text!r}")
    return value


# ---- auditor -----------------------------------------------------------------------------


def _ledger_path(args: argparse.Namespace) -> Path:
    if args.ledger:
        return Path(args.ledger)
    return _settings(args).ledger_path


def _open_reader(path: Path) -> Any:
    from audit.errors import LedgerError
    from audit.sqlite import SqliteLedgerReader

    if not path.exists():
        raise ConfigError(f"{path}: no ledger there")
    try:
        return SqliteLedgerReader(path)
    except LedgerError as exc:
        raise ConfigError(str(exc)) from None


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from audit.checkpoint import parse_checkpoint, verify_checkpoint
    from audit.errors import LedgerError
    from audit.verify import verify_ledger

    checkpoint = None
    if args.checkpoint:
        try:
            text = Path(args.checkpoint).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{args.checkpoint}: cannot read checkpoint: {exc}") from None
        try:
            if args.no_signature_check:
                checkpoint = parse_checkpoint(text)
            else:
                keys = _keys(args, create=False)
                checkpoint = verify_checkpoint(text, keys.checkpoint_key.public_key(), keys.checkpoint_key_name)
        except LedgerError as exc:
            _out(f"FAIL checkpoint {args.checkpoint}: {exc}")
            return EXIT_FAILED
    path = _ledger_path(args)
    with _open_reader(path) as reader:
        started = time.perf_counter()
        report = verify_ledger(reader, checkpoint)
        elapsed = time.perf_counter() - started
    if report.ok:
        rate = f", {report.size / elapsed:,.0f} records/s" if elapsed > 0 and report.size else ""
        _out(f"OK {path}: {report.size} records, root {report.root.hex()}, {report.checkpoints_checked} checkpoint(s) matched{rate}")
        return EXIT_OK
    where = f" at seq {report.first_bad_seq}" if report.first_bad_seq is not None else ""
    _out(f"FAIL {path}{where}: {report.problem}")
    return EXIT_FAILED


def cmd_audit_query(args: argparse.Namespace) -> int:
    from audit.query import format_records, query_records

    with _open_reader(_ledger_path(args)) as reader:
        records = query_records(
            reader,
            principal=args.principal,
            tool=args.tool,
            decision=args.decision,
            rule=args.rule,
            since=args.since,
            until=args.until,
            limit=args.limit,
        )
        for line in format_records(records, args.format):
            _out(line)
    return EXIT_OK


def cmd_audit_checkpoint(args: argparse.Namespace) -> int:
    """Sign the ledger's current head with the checkpoint key and print the note."""
    from audit.checkpoint import sign_checkpoint
    from audit.merkle import root_hash

    keys = _keys(args, create=False)
    with _open_reader(_ledger_path(args)) as reader:
        size = reader.size()
        root = root_hash(reader.leaf_hashes(size))
    _out(sign_checkpoint(args.origin, size, root, keys.checkpoint_key, keys.checkpoint_key_name).rstrip("\n"))
    return EXIT_OK


# ---- keys and receipts ---------------------------------------------------------------------


def _keys(args: argparse.Namespace, *, create: bool) -> Any:
    from gateway.crypto.receipts import KeyStore

    return KeyStore.open(_settings(args).state_dir, create=create)


def cmd_keys_jwks(args: argparse.Namespace) -> int:
    _out(json.dumps(_keys(args, create=True).jwks(), indent=2))
    return EXIT_OK


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    kid = _keys(args, create=True).rotate()
    _out(f"new active key {kid}; the old key stays in the JWKS")
    return EXIT_OK


def cmd_receipt_verify(args: argparse.Namespace) -> int:
    from gateway.crypto.receipts import ReceiptInvalid, load_jwks, verify_receipt

    saved = _json_arg("@" + args.response, "response file")
    jwks = load_jwks(Path(args.jwks)) if args.jwks else _keys(args, create=False).jwks()
    token, response = _split_receipt(saved)
    if token is None:
        _out(f"FAIL {args.response}: no receipt found (expected `receipt` or result._meta[\"dharma.gateway/receipt\"])")
        return EXIT_FAILED
    request = _json_arg("@" + args.request, "request file") if args.request else None
    try:
        payload = verify_receipt(token, jwks, response=response, request=request)
    except ReceiptInvalid as exc:
        _out(f"FAIL {args.response}: {exc}")
        return EXIT_FAILED
    _out(f"OK receipt by key {payload['kid']} at {payload['time']}: request {payload['request_id']}, ledger seq {payload['ledger']['seq']}")
    return EXIT_OK


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


# ---- approvals ----------------------------------------------------------------------------


def _approvals(args: argparse.Namespace) -> Any:
    from gateway.stores.sqlite_approvals import SqliteApprovalStore

    return SqliteApprovalStore(_settings(args).approvals_path)


def cmd_approvals_list(args: argparse.Namespace) -> int:
    items = _approvals(args).pending_sync(time.time())
    if args.json:
        for a in items:
            _out(json.dumps({"id": a.id, "principal": a.principal, "tool": a.tool, "reason": a.reason, "expires_at": a.expires_at, "arguments": a.arguments_preview}))
        return EXIT_OK
    if not items:
        _out("no pending approvals")
    for a in items:
        left = max(0, int(a.expires_at - time.time()))
        _out(f"{a.id}  {a.principal} → {a.tool}  ({left}s left)  {a.reason}")
        _out(f"    arguments: {a.arguments_preview}")
    return EXIT_OK


def _decide(args: argparse.Namespace, approve: bool) -> int:
    store = _approvals(args)
    by = args.by or os.environ.get("USER") or "cli"
    try:
        item = store.decide_sync(args.id, approve=approve, by=by, now=time.time())
    except KeyError:
        _out(f"unknown approval {args.id}")
        return EXIT_FAILED
    except ValueError as exc:
        _out(str(exc))
        return EXIT_FAILED
    _out(f"{item.id} {item.state} by {by}")
    return EXIT_OK


# ---- parser -------------------------------------------------------------------------------


def add_parsers(sub: Any) -> None:
    """Add `dharma audit`, `dharma approvals` and `dharma keys` to the `dharma` subparsers."""
    audit = sub.add_parser("audit", help="verify and query the karma ledger").add_subparsers(dest="audit_command", required=True)
    p = audit.add_parser("verify", help="recompute the ledger; exit 1 at the first bad record")
    p.add_argument("--ledger")
    p.add_argument("--checkpoint", help="a checkpoint kept outside the database (catches truncation)")
    p.add_argument("--no-signature-check", action="store_true", help="use the checkpoint without checking its signature")
    p.set_defaults(func=cmd_audit_verify)
    p = audit.add_parser("query", help="list records by principal, tool, decision, rule and time")
    p.add_argument("--ledger")
    p.add_argument("--principal")
    p.add_argument("--tool")
    p.add_argument("--decision")
    p.add_argument("--rule")
    p.add_argument("--since", type=_time_arg, help="RFC 3339 time, e.g. 2026-11-22T00:00:00Z (inclusive)")
    p.add_argument("--until", type=_time_arg, help="RFC 3339 time (exclusive)")
    p.add_argument("--limit", type=_count_arg)
    p.add_argument("--format", choices=["table", "jsonl", "csv"], default="table")
    p.set_defaults(func=cmd_audit_query)
    p = audit.add_parser("checkpoint", help="print a signed checkpoint of the ledger's head (keep it elsewhere)")
    p.add_argument("--ledger")
    p.add_argument("--origin", default="dharma-gateway/karma-ledger", help="checkpoint origin line")
    p.set_defaults(func=cmd_audit_checkpoint)

    approvals = sub.add_parser("approvals", help="list, approve or deny held calls").add_subparsers(dest="approvals_command", required=True)
    p = approvals.add_parser("list")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_approvals_list)
    for verb, approve in (("approve", True), ("deny", False)):
        p = approvals.add_parser(verb)
        p.add_argument("id")
        p.add_argument("--by", help="who decides (default: $USER)")
        p.set_defaults(func=lambda a, approve=approve: _decide(a, approve))

    keys = sub.add_parser("keys", help="receipt signing keys").add_subparsers(dest="keys_command", required=True)
    keys.add_parser("jwks", help="print the public keys as a JWKS").set_defaults(func=cmd_keys_jwks)
    keys.add_parser("rotate", help="make a new active key; old ones stay published").set_defaults(func=cmd_keys_rotate)


def add_receipt_parser(sub: Any) -> None:
    """Add `dharma receipt verify` to the `dharma` subparsers."""
    receipt = sub.add_parser("receipt", help="verify signed receipts offline").add_subparsers(dest="receipt_command", required=True)
    p = receipt.add_parser("verify")
    p.add_argument("response", help="a saved response (HTTP envelope, MCP result or JSON-RPC response)")
    p.add_argument("--jwks", help="a saved JWKS (default: this machine's keys)")
    p.add_argument("--request", help="the request as sent, to check its digest too")
    p.set_defaults(func=cmd_receipt_verify)
