"""`dharma audit verify|query|checkpoint|proof|export`: the auditor's commands over the karma ledger.

Verify the ledger (against a checkpoint kept elsewhere, to catch truncation) or an export bundle
(offline, with only the published keys), query it, sign checkpoints of its head, print verified
inclusion and consistency proofs, and export bundles. The filters are `audit.query`'s, the bundle
format `audit.export`'s; this module maps flags.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from gateway.cli.common import (
    COMMANDS, EXIT_FAILED, EXIT_OK, add_command, add_group, open_keys, out, pinned_definitions, settings_of,
)
from gateway.core.errors import ConfigError
from gateway.ledger_access import ledger_location, open_ledger_reader, query_choices

LEDGER_HELP = "ledger file or postgresql:// URL (default: the one dharma.yaml names, or ledger.db under the state root)"

def _time_arg(text: str) -> str:
    """An RFC 3339 time (or date) for --since/--until; anything else is a usage error, not an empty result."""
    from audit.query import check_time

    try:
        return check_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kind_arg(text: str) -> str:
    """A record kind for --kind; anything else is a usage error naming the kinds, not an empty result."""
    from audit.query import check_kind

    try:
        return check_kind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count_arg(text: str) -> int:
    """A --limit: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, not {text!r}")
    return value


def _ledger_path(args: argparse.Namespace) -> Path | str:
    """The ledger to read: --ledger (a file or a postgresql:// URL), else the one dharma.yaml names."""
    from gateway.config import is_ledger_url

    if args.ledger:
        return args.ledger if is_ledger_url(args.ledger) else Path(args.ledger)
    settings = settings_of(args)
    return ledger_location(settings)


def _display(location: Path | str) -> str:
    """The ledger's name for output: a URL loses its password."""
    if isinstance(location, Path):
        return str(location)
    from audit.postgres import display_url

    return display_url(location)


def _read_note(path: str, what: str) -> str:
    """A checkpoint note from a file, or a usage error naming the file."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from None


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from audit.checkpoint import parse_checkpoint, verify_checkpoint_keys
    from audit.errors import LedgerError
    from audit.verify import verify_ledger, write_stamp

    if args.bundle:
        return _verify_bundle(args)
    keys, missing = (None, "") if args.no_signature_check else _checkpoint_keys(args)
    if keys is None and args.checkpoint and not args.no_signature_check:
        raise ConfigError(f"cannot check the signature of {args.checkpoint}: {missing} (pass --jwks FILE, the published JWKS)")
    checkpoint = None
    if args.checkpoint:
        text = _read_note(args.checkpoint, "checkpoint")
        try:
            checkpoint = parse_checkpoint(text) if keys is None else verify_checkpoint_keys(text, keys)
        except LedgerError as exc:
            out(f"FAIL checkpoint {args.checkpoint}: {exc}")
            return EXIT_FAILED
    location = _ledger_path(args)
    with open_ledger_reader(location) as reader:
        path = _display(location)
        if keys is None and not args.no_signature_check and reader.checkpoints():
            raise ConfigError(f"{path} stores signed checkpoints, and no checkpoint key is here to check them ({missing}): "
                              "pass --jwks FILE (the published JWKS), run where the state root holds the keys, or pass "
                              "--no-signature-check")
        started = time.perf_counter()
        report = verify_ledger(reader, checkpoint, keys=keys)
        elapsed = time.perf_counter() - started
    _record_verify(args, location, report, elapsed)
    if report.ok:
        if isinstance(location, Path):  # the verified-stamp reminder sits beside a ledger file
            write_stamp(location, report)
        rate = f", {report.size / elapsed:,.0f} records/s" if elapsed > 0 and report.size else ""
        out(f"OK {path}: {report.size} records, root {report.root.hex()}, {report.checkpoints_checked} checkpoint(s) matched{rate}")
        out(reach_line(path, report, signed=keys is not None))
        with open_ledger_reader(location) as reader:
            return report_outcomes(reader, path, strict=args.strict_outcomes)
    where = f" at seq {report.first_bad_seq}" if report.first_bad_seq is not None else ""
    out(f"FAIL {path}{where}: {report.problem}")
    return EXIT_FAILED


def _record_verify(args: argparse.Namespace, location: Path | str, report: Any, elapsed: float) -> None:
    """Keep this verify's result, pass or fail, where the overview page reads it (`audit.verify_log`)."""
    import getpass

    from audit.verify_log import record_verify
    from gateway.ledger_access import verify_log_path

    if isinstance(location, Path):
        state_root = location.parent
    else:
        try:
            state_root = settings_of(args).state_root
        except ConfigError:
            return  # no settings to say where: the result is printed, not kept
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    record_verify(verify_log_path(location, state_root), report, via="cli", by=user, seconds=elapsed)


def _checkpoint_keys(args: argparse.Namespace) -> tuple[list[Any] | None, str]:
    """The checkpoint keys verify trusts: the --jwks file's, else the state root's; (None, why) when there are none."""
    from audit.checkpoint import checkpoint_keys
    from audit.errors import LedgerError
    from gateway.crypto.receipts import load_jwks

    if args.jwks:
        try:
            found = checkpoint_keys(load_jwks(Path(args.jwks)))
        except LedgerError as exc:
            raise ConfigError(f"{args.jwks}: {exc}") from None
        if not found:
            raise ConfigError(f"{args.jwks} publishes no checkpoint key")
        return found, ""
    try:
        keys = open_keys(args, create=False)
    except ConfigError as exc:
        return None, str(exc)
    return [(keys.checkpoint_key_name, keys.checkpoint_key.public_key())], ""


def reach_line(path: str, report: Any, *, signed: bool) -> str:
    """How far the stored checkpoints reach (and what of them is not signed), for `audit verify`."""
    reach = report.reach
    if reach is None:
        return f"NOTE {path}: no checkpoint is stored in the ledger: only one kept elsewhere vouches for its {report.size} records"
    left = f"; records {reach.size + 1}..{report.size} are under none yet" if reach.size < report.size else ""
    how = "" if signed else " without their signatures (--no-signature-check)"
    line = (f"OK {path}: the newest stored checkpoint reaches size {reach.size} of {report.size} (stored "
            f"{reach.created_at}){left}; {reach.count} stored checkpoint(s) checked{how}")
    if reach.unstamped:
        line += (f"\nNOTE {path}: the first {reach.unstamped} stored checkpoint(s) were stored before checkpoints were "
                 "stamped: their time and order are not signed, and one of them deleted leaves no trace")
    return line


def _verify_bundle(args: argparse.Namespace) -> int:
    """`audit verify --bundle F [--jwks F]`: offline, against the published keys."""
    from audit.export import verify_bundle
    from gateway.crypto.receipts import load_jwks

    if args.checkpoint or args.ledger:
        raise ConfigError("--bundle is verified on its own: give --jwks, not --ledger or --checkpoint")
    jwks = load_jwks(Path(args.jwks)) if args.jwks else None
    if not Path(args.bundle).is_file():
        raise ConfigError(f"{args.bundle}: no bundle there")
    report = verify_bundle(Path(args.bundle), jwks)
    if not report.ok:
        out(f"FAIL {report.problem}")
        return EXIT_FAILED
    since = f", consistent with the checkpoint at size {report.since_size}" if report.since_size is not None else ""
    keys = f"{args.jwks}" if args.jwks else "the bundle's own JWKS (pass --jwks with the published keys to trust it)"
    out(f"OK {args.bundle}: {report.size} records of {report.origin}, root {report.root.hex()} signed by a checkpoint "
        f"key in {keys}{since}")
    return EXIT_OK


def report_outcomes(reader: Any, path: str, *, strict: bool) -> int:
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
    from audit.verify import unverified_note

    path = _ledger_path(args)
    with open_ledger_reader(path) as reader:
        if isinstance(path, Path) and (note := unverified_note(path, reader.size())):
            sys.stderr.write(f"dharma: warning: {note}\n")
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
            kind=args.kind,
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
    """Print a signed checkpoint of the ledger's head: the one stored at its size (stamped, so a later
    `audit verify --checkpoint` knows the ledger stored it), else one signed now with the checkpoint key."""
    from audit.errors import LedgerError
    from audit.merkle import root_hash
    from audit.proofs import anchor_checkpoint

    signer = _checkpoint_signer(args)
    with open_ledger_reader(_ledger_path(args)) as reader:
        size = reader.size()
        root = root_hash(reader.leaf_hashes(size))
        try:
            note = signer.sign(size, root) if args.origin else anchor_checkpoint(reader, signer, size, root)
        except LedgerError as exc:
            out(f"FAIL {exc}")
            return EXIT_FAILED
    out(note.rstrip("\n"))
    return EXIT_OK


def _origin(args: argparse.Namespace) -> str:
    from gateway.core.gateway import LEDGER_ORIGIN

    return str(args.origin or LEDGER_ORIGIN)


def _anchor(reader: Any, args: argparse.Namespace, size: int, root: bytes) -> str:
    """The signed checkpoint at `size` (`audit.proofs.anchor_checkpoint`), signed with the checkpoint key if none is stored."""
    from audit.proofs import anchor_checkpoint

    return anchor_checkpoint(reader, _checkpoint_signer(args), size, root)


def _checkpoint_signer(args: argparse.Namespace) -> Any:
    """The checkpoint key as a `CheckpointSigner` (it also vouches for stored checkpoints in proofs)."""
    from audit.checkpoint import CheckpointSigner

    keys = open_keys(args, create=False)
    return CheckpointSigner(keys.checkpoint_key, keys.checkpoint_key_name, _origin(args))


def _tree_size(reader: Any, wanted: int | None, at_least: int) -> int:
    """--size, or the latest stored checkpoint's size when it covers `at_least`, or the ledger's size."""
    from audit.checkpoint import parse_checkpoint

    size = reader.size()
    if wanted is not None:
        if not at_least <= wanted <= size:
            raise ConfigError(f"--size {wanted} must be between {at_least} and the ledger size {size}")
        return wanted
    latest = reader.latest_checkpoint()
    stored = parse_checkpoint(latest).size if latest else 0
    return stored if at_least <= stored <= size else size


def cmd_audit_proof(args: argparse.Namespace) -> int:
    """Print an inclusion or consistency proof as JSON, verified before it is printed."""
    from audit import proofs
    from audit.errors import LedgerError

    signer = _checkpoint_signer(args)
    with open_ledger_reader(_ledger_path(args)) as reader:
        try:
            if args.inclusion is not None:
                seq = args.inclusion
                if not 1 <= seq <= reader.size():
                    raise ConfigError(f"--inclusion {seq}: the ledger has records 1..{reader.size()}")
                doc = proofs.inclusion(reader, seq, _tree_size(reader, args.size, seq), signer)
            else:
                old, size = args.consistency
                if not 0 <= old <= size <= reader.size():
                    raise ConfigError(f"--consistency {old} {size}: need 0 <= OLD <= NEW <= {reader.size()} (the ledger size)")
                doc = proofs.consistency(reader, old, size, signer)
            doc["checkpoint"] = proofs.anchor_checkpoint(reader, signer, doc["tree_size"], bytes.fromhex(doc["root"]))
        except LedgerError as exc:
            out(f"FAIL {exc}")
            return EXIT_FAILED
    out(json.dumps(doc, indent=2))
    return EXIT_OK


def cmd_audit_export(args: argparse.Namespace) -> int:
    """Write a bundle of every record up to a signed checkpoint, with proofs and the public keys."""
    from audit.checkpoint import parse_checkpoint, verify_checkpoint
    from audit.errors import LedgerError
    from audit.merkle import root_hash
    from audit.verify import verify_ledger

    keys = open_keys(args, create=False)
    since = _read_note(args.since_checkpoint, "old checkpoint") if args.since_checkpoint else None
    location = _ledger_path(args)
    with open_ledger_reader(location) as reader:
        try:
            if since is not None:
                try:
                    verify_checkpoint(since, keys.checkpoint_key.public_key(), keys.checkpoint_key_name)
                except LedgerError as exc:
                    raise LedgerError(f"--since-checkpoint {args.since_checkpoint}: {exc}") from None
            note = reader.latest_checkpoint()
            size = reader.size()
            if note is None or parse_checkpoint(note).size < size:
                report = verify_ledger(reader)  # never sign a head the stored checkpoints contradict
                if not report.ok:
                    out(f"FAIL {_display(location)}: {report.problem}; nothing exported")
                    return EXIT_FAILED
                note = _anchor(reader, args, report.size, root_hash(reader.leaf_hashes(report.size)))
            return _write_export(args, reader, note, keys.jwks(), since)
        except LedgerError as exc:
            out(f"FAIL {exc}")
            return EXIT_FAILED


def _write_export(args: argparse.Namespace, reader: Any, note: str, jwks: dict[str, Any], since: str | None) -> int:
    """Write to --out through a temp file renamed into place (a failed export leaves no half file)."""
    from audit.export import write_bundle

    if not args.out:
        write_bundle(reader, sys.stdout, checkpoint=note, jwks=jwks, since=since)
        return EXIT_OK
    target = Path(args.out)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            summary = write_bundle(reader, fh, checkpoint=note, jwks=jwks, since=since)
        os.replace(tmp, target)
    except OSError as exc:
        raise ConfigError(f"{target}: cannot write the export: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    since_text = f", with a consistency proof from size {summary.since_size}" if summary.since_size is not None else ""
    out(f"exported {summary.size} records to {target}, root {summary.root.hex()}{since_text}")
    return EXIT_OK


def cmd_audit_migrate(args: argparse.Namespace) -> int:
    """Copy a SQLite ledger into an empty PostgreSQL one, bytes unchanged, and verify the copy."""
    from audit.errors import LedgerError
    from gateway.config import is_ledger_url

    source = Path(args.source.removeprefix("sqlite://")) if not is_ledger_url(args.source) else None
    if source is None or not is_ledger_url(args.destination):
        raise ConfigError("audit migrate copies a SQLite ledger (sqlite:///path or a path) into a postgresql:// URL")
    with open_ledger_reader(source) as reader:
        from audit.postgres import migrate_ledger

        try:
            report = migrate_ledger(reader, str(source), args.destination)
        except LedgerError as exc:
            out(f"FAIL {exc}")
            return EXIT_FAILED
    out(f"OK {source} -> {_display(args.destination)}: {report.size} records, root {report.root.hex()}")
    return EXIT_OK


def cmd_audit_grant(args: argparse.Namespace) -> int:
    """Grant the ledger's writer and auditor roles their privileges on PostgreSQL (run as the ledger's owner).
    A refused role or an unreachable server is a usage error (exit 2), raised as LedgerError."""
    from gateway.config import is_ledger_url

    if not is_ledger_url(args.url):
        raise ConfigError(f"audit grant takes the PostgreSQL ledger's postgresql:// URL (as its owner), not {args.url!r}")
    if args.writer is None and not args.reader:
        raise ConfigError("audit grant needs --writer ROLE, --reader ROLE or both")
    from audit.postgres import grant_roles
    from gateway.stores.postgres_approvals import grant_roles as grant_approval_roles

    for line in grant_roles(args.url, writer=args.writer, readers=args.reader):
        out(line)
    for line in grant_approval_roles(args.url, writer=args.writer, readers=args.reader):
        out(line)
    out(f"OK {_display(args.url)}: the ledger and its approvals are insert-only by privileges as well as by triggers")
    return EXIT_OK



def _call_rows(args: argparse.Namespace) -> Any:
    """The ledger's calls between --since and --until, oldest first, one row each (a generator over an open reader)."""
    from audit.query import call_rows, query_records

    location = _ledger_path(args)
    with open_ledger_reader(location) as reader:
        records = query_records(reader, since=args.since, until=args.until)
        with contextlib.closing(records):
            yield from call_rows(reader, records, show="calls")


def cmd_replay(args: argparse.Namespace) -> int:
    """Re-decide the recorded calls under the candidate policy (--policy) and print what would change."""
    import anyio

    from gateway.policy.compile import load_policy
    from gateway.policy.replay import replay

    policy = load_policy(Path(args.policy), engine=args.engine)
    pins = pinned_definitions(args)
    report = anyio.run(replay, policy, _call_rows(args), pins)
    if args.format == "json":
        out(json.dumps({"policy": policy.name, "policy_version": policy.version, **report.as_json()}, indent=2))
    else:
        for line in report.lines(f"replay under {policy.name} ({policy.version})"):
            out(line)
    return EXIT_OK


def cmd_audit_shadow(args: argparse.Namespace) -> int:
    """What shadow (audit-mode) rules would have done to live traffic, from the recorded decisions."""
    from gateway.core.call import Mode
    from gateway.core.errors import PolicyErrors
    from gateway.policy.compile import load_policy
    from gateway.policy.replay import shadow_report

    shadow: set[str] | None = None
    try:  # the current policy says which rules are shadows; without it every matched rule is named
        policy = load_policy(settings_of(args).policy)
        shadow = {r.id for r in policy.all_rules() if r.mode is not Mode.ENFORCE}
    except (PolicyErrors, ConfigError, OSError):
        shadow = None
    report = shadow_report(_call_rows(args), shadow)
    if args.format == "json":
        out(json.dumps(report.as_json(), indent=2))
    else:
        for line in report.lines("shadow rules"):
            out(line)
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Add `dharma audit …` and `dharma replay` to the `dharma` subparsers."""
    p = add_command(sub, "replay", COMMANDS["replay"],
                    epilog="Nothing is forwarded or written. Rate limits are simulated over the replayed calls at their "
                           "recorded times; session history is rebuilt from the replay's own decisions; a call the "
                           "candidate would hold for approval counts as would-hold.")
    p.add_argument("--policy", required=True, help="the candidate policy profile")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--since", type=_time_arg, help="RFC 3339 time, e.g. 2026-11-22T00:00:00Z (inclusive)")
    p.add_argument("--until", type=_time_arg, help="RFC 3339 time (exclusive)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or json")
    p.add_argument("--engine", choices=("cel-python", "common-expression-language"), help="CEL engine (default: the fastest installed)")
    p.set_defaults(func=cmd_replay)

    audit = add_group(sub, "audit", COMMANDS["audit"], "audit_command")
    p = add_command(audit, "verify", "recompute the ledger; exit 1 at the first bad record")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--checkpoint", help="a checkpoint kept outside the database (catches truncation)")
    p.add_argument("--no-signature-check", action="store_true",
                   help="check the checkpoints (--checkpoint and the stored ones) without their signatures")
    p.add_argument("--bundle", help="verify an export bundle offline instead of a ledger")
    p.add_argument("--jwks", help="the published JWKS to check checkpoints against (the bundle's, or the stored ones "
                                  "and --checkpoint; default for a ledger: the state root's checkpoint key)")
    p.add_argument("--strict-outcomes", action="store_true",
                   help="also fail on calls with outcome unknown (a decision record and no outcome), which are reported either way")
    p.set_defaults(func=cmd_audit_verify)

    _add_query_parser(audit)

    p = add_command(audit, "shadow", "what shadow (mode: audit) rules would have denied or held, per rule and principal")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--since", type=_time_arg, help="RFC 3339 time (inclusive)")
    p.add_argument("--until", type=_time_arg, help="RFC 3339 time (exclusive)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or json")
    p.set_defaults(func=cmd_audit_shadow)

    _add_checkpoint_parsers(audit)

    p = add_command(audit, "migrate", "copy a SQLite ledger into an empty PostgreSQL one and verify the copy")
    p.add_argument("source", help="the SQLite ledger: sqlite:///path/ledger.db or a path")
    p.add_argument("destination", help="an empty PostgreSQL database: postgresql://user@host:port/db")
    p.set_defaults(func=cmd_audit_migrate)

    p = add_command(audit, "grant", "PostgreSQL: give the gateway's role append-only and auditors read-only privileges")
    p.add_argument("url", help="the ledger's postgresql:// URL, connecting as the tables' owner (or a superuser)")
    p.add_argument("--writer", metavar="ROLE",
                   help="the role the gateway connects as: SELECT and INSERT, UPDATE of the head row only; created if missing")
    p.add_argument("--reader", metavar="ROLE", action="append", default=[],
                   help="an auditor's role: SELECT only; repeat for several; created if missing")
    p.set_defaults(func=cmd_audit_grant)


def _add_query_parser(audit: Any) -> None:
    """`dharma audit query` and its filters."""
    p = add_command(audit, "query", "list ledger records, oldest first, that match every filter given")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--principal", help="principal id")
    p.add_argument("--tool", help="tool name or glob, e.g. 'read_*' (quote it from the shell)")
    values = query_choices()
    p.add_argument("--decision", choices=values["decision"], metavar="DECISION", help="one of: " + ", ".join(values["decision"]))
    p.add_argument("--status", choices=values["status"], metavar="STATUS", help="one of: " + ", ".join(values["status"]))
    p.add_argument("--error-code", choices=values["error_code"], metavar="CODE", help="one of: " + ", ".join(values["error_code"]))
    p.add_argument("--rule", help="id of a rule that matched")
    p.add_argument("--policy-version", help="policy version the call was decided under")
    p.add_argument("--request-id", help="one call's request id")
    p.add_argument("--approval-id", help="calls bound to this approval")
    p.add_argument("--kind", type=_kind_arg, metavar="KIND",
                   help="only records of this kind, e.g. `reload` (every policy reload attempt), `approval` or "
                        "`refusal` (requests the HTTP auth layer refused, counted per source and reason)")
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


def _add_checkpoint_parsers(audit: Any) -> None:
    """`dharma audit checkpoint`, `proof` and `export`: what an auditor keeps or takes away."""
    p = add_command(audit, "checkpoint", "print a signed checkpoint of the ledger's head (keep it elsewhere)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--origin", help="checkpoint origin line (default: the gateway's, dharma-gateway/karma-ledger)")
    p.set_defaults(func=cmd_audit_checkpoint)

    p = add_command(audit, "proof", "print a verified inclusion or consistency proof (JSON) and its checkpoint")
    p.add_argument("--ledger", help=LEDGER_HELP)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--inclusion", type=_count_arg, metavar="SEQ", help="prove record SEQ is in the tree")
    which.add_argument("--consistency", type=_count_arg, nargs=2, metavar=("OLD", "NEW"),
                       help="prove the tree of OLD records is a prefix of the tree of NEW")
    p.add_argument("--size", type=_count_arg, metavar="N", help="with --inclusion: the tree size (default: the latest checkpoint's)")
    p.add_argument("--origin", help="origin line if a checkpoint must be signed (default: the gateway's)")
    p.set_defaults(func=cmd_audit_proof)

    p = add_command(audit, "export", "write a self-contained bundle an auditor verifies offline (audit verify --bundle)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--out", help="bundle file to write (default: stdout)")
    p.add_argument("--since-checkpoint", metavar="F", help="an older checkpoint the auditor holds: add the consistency proof from it")
    p.add_argument("--origin", help="origin line if a checkpoint must be signed (default: the gateway's)")
    p.set_defaults(func=cmd_audit_export)
