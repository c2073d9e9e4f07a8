"""`dharma audit verify|query|checkpoint`: the auditor's commands over the karma ledger.

Verify the ledger (against a checkpoint kept elsewhere, to catch truncation), query it, and sign
checkpoints of its head. The filters themselves are `audit.query`'s; this module maps flags.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

from gateway.cli.common import EXIT_FAILED, EXIT_OK, add_command, add_group, open_keys, out, settings_of
from gateway.core.errors import ConfigError

LEDGER_HELP = "ledger file (default: the one dharma.yaml names, or ledger.db under the state root)"
PASSTHROUGH_STATUS = "forwarded"
"""The status of a record for an MCP method the gateway does not govern, relayed as is."""


def choices() -> dict[str, list[str]]:
    """The values a ledger record can hold, per validated flag: from the code's enums."""
    from gateway.core.call import Effect, Status
    from gateway.core.errors import ErrorCode

    return {
        "decision": [e.value for e in Effect],
        "status": [s.value for s in Status] + [PASSTHROUGH_STATUS],
        "error_code": [c.value for c in ErrorCode],
    }


def _time_arg(text: str) -> str:
    """An RFC 3339 time (or date) for --since/--until; anything else is a usage error, not an empty result."""
    from datetime import datetime

    try:
        datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text!r} (e.g. 2026-11-22T00:00:00Z)") from None
    return text


def _count_arg(text: str) -> int:
    """A --limit: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, not {text!r}")
    return value


def _ledger_path(args: argparse.Namespace) -> Path:
    if args.ledger:
        return Path(args.ledger)
    return settings_of(args).ledger_path


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
                keys = open_keys(args, create=False)
                checkpoint = verify_checkpoint(text, keys.checkpoint_key.public_key(), keys.checkpoint_key_name)
        except LedgerError as exc:
            out(f"FAIL checkpoint {args.checkpoint}: {exc}")
            return EXIT_FAILED
    path = _ledger_path(args)
    with _open_reader(path) as reader:
        started = time.perf_counter()
        report = verify_ledger(reader, checkpoint)
        elapsed = time.perf_counter() - started
    if report.ok:
        rate = f", {report.size / elapsed:,.0f} records/s" if elapsed > 0 and report.size else ""
        out(f"OK {path}: {report.size} records, root {report.root.hex()}, {report.checkpoints_checked} checkpoint(s) matched{rate}")
        with _open_reader(path) as reader:
            return report_outcomes(reader, path, strict=args.strict_outcomes)
    where = f" at seq {report.first_bad_seq}" if report.first_bad_seq is not None else ""
    out(f"FAIL {path}{where}: {report.problem}")
    return EXIT_FAILED


def report_outcomes(reader: Any, path: Path, *, strict: bool) -> int:
    """Say which calls have a decision record and no outcome; fail on them only when `strict`.

    An outcome record that names no decision record of its call always fails (the ledger contradicts itself).
    """
    from audit.verify import check_outcomes

    found = check_outcomes(reader)
    if found.unknown:
        seqs = ", ".join(str(seq) for seq in found.unknown)
        out(f"{'FAIL' if strict else 'NOTE'} {path}: {len(found.unknown)} call(s) with outcome unknown "
            f"(a decision record and no outcome: the gateway stopped mid-call) at seq {seqs}")
    if found.dangling:
        seqs = ", ".join(str(seq) for seq in found.dangling)
        out(f"FAIL {path}: {len(found.dangling)} outcome record(s) name no decision record of their call, at seq {seqs}")
        return EXIT_FAILED
    return EXIT_FAILED if strict and found.unknown else EXIT_OK


def cmd_audit_query(args: argparse.Namespace) -> int:
    from audit.query import call_rows, format_records, query_records

    with _open_reader(_ledger_path(args)) as reader:
        records = query_records(
            reader,
            principal=args.principal,
            tool=args.tool,
            decision=args.decision,
            status=args.status,
            error_code=args.error_code,
            rule=args.rule,
            policy_version=args.policy_version,
            request_id=args.request_id,
            approval_id=args.approval_id,
            since=args.since,
            until=args.until,
        )  # no limit here: it counts the rows shown (streamed, so it still stops early)
        with contextlib.closing(records):  # closed before the reader, also when stdout's reader goes away
            show = "unknown" if args.outcome_unknown else "records" if args.all_records else "calls"
            shown = itertools.islice(call_rows(reader, records, show=show), args.limit)
            for line in format_records(shown, args.format):
                out(line)
    return EXIT_OK


def cmd_audit_checkpoint(args: argparse.Namespace) -> int:
    """Sign the ledger's current head with the checkpoint key and print the note."""
    from audit.checkpoint import sign_checkpoint
    from audit.merkle import root_hash

    keys = open_keys(args, create=False)
    with _open_reader(_ledger_path(args)) as reader:
        size = reader.size()
        root = root_hash(reader.leaf_hashes(size))
    out(sign_checkpoint(args.origin, size, root, keys.checkpoint_key, keys.checkpoint_key_name).rstrip("\n"))
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Add `dharma audit verify|query|checkpoint` to the `dharma` subparsers."""
    audit = add_group(sub, "audit", "verify, query and checkpoint the karma ledger", "audit_command")
    p = add_command(audit, "verify", "recompute the ledger; exit 1 at the first bad record")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--checkpoint", help="a checkpoint kept outside the database (catches truncation)")
    p.add_argument("--no-signature-check", action="store_true", help="use the checkpoint without checking its signature")
    p.add_argument("--strict-outcomes", action="store_true",
                   help="also fail on calls with outcome unknown (a decision record and no outcome), which are reported either way")
    p.set_defaults(func=cmd_audit_verify)

    p = add_command(audit, "query", "list ledger records, oldest first, that match every filter given")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--principal", help="principal id")
    p.add_argument("--tool", help="tool name or glob, e.g. 'read_*' (quote it from the shell)")
    values = choices()
    p.add_argument("--decision", choices=values["decision"], metavar="DECISION", help="one of: " + ", ".join(values["decision"]))
    p.add_argument("--status", choices=values["status"], metavar="STATUS", help="one of: " + ", ".join(values["status"]))
    p.add_argument("--error-code", choices=values["error_code"], metavar="CODE", help="one of: " + ", ".join(values["error_code"]))
    p.add_argument("--rule", help="id of a rule that matched")
    p.add_argument("--policy-version", help="policy version the call was decided under")
    p.add_argument("--request-id", help="one call's request id")
    p.add_argument("--approval-id", help="calls bound to this approval")
    p.add_argument("--since", type=_time_arg, help="RFC 3339 time, e.g. 2026-11-22T00:00:00Z (inclusive)")
    p.add_argument("--until", type=_time_arg, help="RFC 3339 time (exclusive)")
    p.add_argument("--limit", type=_count_arg, help="at most this many records")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--outcome-unknown", action="store_true",
                       help="only decision records no outcome record answers (the gateway stopped mid-call)")
    shown.add_argument("--all-records", action="store_true",
                       help="every record: also the decision records of calls whose outcome is recorded "
                            "(by default a call is one row: its outcome record, or its decision record if the outcome is unknown)")
    p.add_argument("--format", choices=["table", "jsonl", "csv"], default="table",
                   help="table (default), jsonl (one canonical JSON record a line) or csv (every field jsonl has)")
    p.set_defaults(func=cmd_audit_query)

    p = add_command(audit, "checkpoint", "print a signed checkpoint of the ledger's head (keep it elsewhere)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--origin", default="dharma-gateway/karma-ledger", help="checkpoint origin line")
    p.set_defaults(func=cmd_audit_checkpoint)
