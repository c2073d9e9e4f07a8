"""`dharma approvals list|approve|deny`: the approver's commands for held calls."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from gateway.cli.common import EXIT_FAILED, EXIT_OK, add_command, add_group, out, settings_of


def _approvals(args: argparse.Namespace) -> Any:
    from gateway.stores.sqlite_approvals import SqliteApprovalStore

    return SqliteApprovalStore(settings_of(args).approvals_path)


def cmd_approvals_list(args: argparse.Namespace) -> int:
    items = _approvals(args).pending_sync(time.time())
    if args.json:
        for a in items:
            out(json.dumps({"id": a.id, "principal": a.principal, "tool": a.tool, "reason": a.reason, "expires_at": a.expires_at, "arguments": a.arguments_preview}))
        return EXIT_OK
    if not items:
        out("no pending approvals")
    for a in items:
        left = max(0, int(a.expires_at - time.time()))
        out(f"{a.id}  {a.principal} → {a.tool}  ({left}s left)  {a.reason}")
        out(f"    arguments: {a.arguments_preview}")
    return EXIT_OK


def decide(args: argparse.Namespace, approve: bool) -> int:
    store = _approvals(args)
    by = args.by or os.environ.get("USER") or "cli"
    try:
        item = store.decide_sync(args.id, approve=approve, by=by, now=time.time())
    except KeyError:
        out(f"unknown approval {args.id}")
        return EXIT_FAILED
    except ValueError as exc:
        out(str(exc))
        return EXIT_FAILED
    out(f"{item.id} {item.state} by {by}")
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Add `dharma approvals list|approve|deny` to the `dharma` subparsers."""
    approvals = add_group(sub, "approvals", "list, approve or deny held calls", "approvals_command")
    p = add_command(approvals, "list", "list the calls waiting for a decision")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_approvals_list)
    for verb, approve in (("approve", True), ("deny", False)):
        p = add_command(approvals, verb, f"{verb} a held call")
        p.add_argument("id", metavar="ID", help="approval id, as `dharma approvals list` shows it")
        p.add_argument("--by", help="who decides (default: $USER)")
        p.set_defaults(func=lambda a, approve=approve: decide(a, approve))
