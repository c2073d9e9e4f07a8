"""`dharma approvals list|approve|deny`: the approver's commands for held calls."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway.cli.common import COMMANDS, EXIT_FAILED, EXIT_OK, UsageError, add_command, add_group, out, settings_of


@contextlib.asynccontextmanager
async def approval_store(settings: Any) -> AsyncIterator[Any]:
    """The store the gateway uses (`runtime.open_approvals`: PostgreSQL with `ledger.url`, else approvals.db)."""
    from gateway.runtime import open_approvals

    store = await open_approvals(settings)
    try:
        yield store
    finally:
        close = getattr(store, "aclose", None)
        if close is not None:
            await close()


async def pending(settings: Any) -> list[Any]:
    async with approval_store(settings) as store:
        return await store.pending(time.time())  # type: ignore[no-any-return]


def cmd_approvals_list(args: argparse.Namespace) -> int:
    import anyio

    items = anyio.run(pending, settings_of(args))
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


def os_user() -> str:
    """The OS account running this process (from the process's uid, not from $USER)."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        import getpass

        return getpass.getuser()


def approver_of(args: argparse.Namespace, policy: Any) -> Any:
    """The principal deciding: the one `--api-key` names, else the OS user's (`local_user`).

    Raises UsageError when the policy maps neither to a principal with role approver or admin.
    """
    from gateway.core.call import Credentials
    from gateway.stages.authenticate import authenticate

    key = args.api_key or os.environ.get("DHARMA_API_KEY")
    credentials = Credentials(api_key=key) if key else Credentials(local_user=os_user())
    who = "the given API key" if key else f"OS user {credentials.local_user!r}"
    principal = authenticate(policy, credentials)
    if principal is None:
        raise UsageError(f"{who} is not a principal of policy {policy.name} (give --api-key, or map the user with local_user)")
    if not {"approver", "admin"} & set(principal.roles):
        raise UsageError(f"{who} is principal {principal.id}, which has no role approver or admin, so it may not decide approvals")
    return principal


async def record_in_ledger(settings: Any, store: Any) -> str:
    """Copy the store's unrecorded approval events into the SQLite ledger when no gateway holds it.

    A running gateway holds the ledger's one writer lock and records them itself (while the call
    waits, when it is retried, or at shutdown), so a held lock is not an error.
    """
    from audit.errors import LedgerError, LedgerLocked
    from audit.sqlite import SqliteLedger
    from gateway.stages.approval import ApprovalRecorder

    if settings.ledger.url is not None:
        return "the gateway records it in the karma ledger"
    try:
        ledger = await SqliteLedger.open(settings.ledger_path, synchronous=settings.ledger.synchronous)
    except LedgerLocked:
        return "the running gateway records it in the karma ledger"
    except LedgerError as exc:
        return f"not yet in the karma ledger ({exc}); the gateway records it when it next runs"
    try:
        await ApprovalRecorder(store, ledger).sync()
    finally:
        await ledger.aclose()
    return "recorded in the karma ledger"


async def wake_holders(settings: Any, approval_id: str) -> str:
    """Publish the wake-up over Redis when `redis.url` is set, so the replica holding the call
    looks at once; without Redis the holder sees the decision at its next safety poll."""
    if settings.redis.url is None:
        return ""
    from gateway.runtime import open_approval_signals

    signals = open_approval_signals(settings)
    try:
        await signals.notify(approval_id)
    finally:
        await signals.aclose()
    return "; the replica holding the call was woken over Redis"


async def decide_async(args: argparse.Namespace, settings: Any, policy: Any, principal: Any, approve: bool) -> int:
    from gateway.stages.approval import approver_refusal

    async with approval_store(settings) as store:
        current = await store.get(args.id)
        if current is None:
            out(f"unknown approval {args.id}")
            return EXIT_FAILED
        refusal = approver_refusal(policy, current, by=principal.id, approve=approve, via="cli")
        if refusal is not None:
            sys.stderr.write(f"dharma: {refusal}\n")
            return EXIT_FAILED
        try:
            item = await store.decide(args.id, approve=approve, by=principal.id, now=time.time(), via="cli",
                                      reason=args.reason or "")
        except ValueError as exc:
            out(str(exc))
            return EXIT_FAILED
        where = await record_in_ledger(settings, store)
    woken = await wake_holders(settings, args.id)
    out(f"{item.id} {item.state} by {principal.id} ({where}{woken})")
    return EXIT_OK


def decide(args: argparse.Namespace, approve: bool) -> int:
    """Decide a held call as the CLI user's principal (never free text); self-approval only where allowed."""
    import anyio

    from gateway.policy.compile import load_policy

    settings = settings_of(args)
    policy = load_policy(settings.policy, extra=list(settings.rules), engine=settings.cel_engine)
    principal = approver_of(args, policy)
    return anyio.run(decide_async, args, settings, policy, principal, approve)  # type: ignore[no-any-return]



def add_parsers(sub: Any) -> None:
    """Add `dharma approvals list|approve|deny` to the `dharma` subparsers."""
    approvals = add_group(sub, "approvals", COMMANDS["approvals"], "approvals_command")
    p = add_command(approvals, "list", "list the calls waiting for a decision")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_approvals_list)
    for verb, approve in (("approve", True), ("deny", False)):
        p = add_command(approvals, verb, f"{verb} a held call")
        p.add_argument("id", metavar="ID", help="approval id, as `dharma approvals list` shows it")
        p.add_argument("--policy", type=Path, help="the policy that says who may decide (default: the gateway's, "
                       "from --config or $DHARMA_POLICY)")
        p.add_argument("--api-key", metavar="KEY", help="decide as the principal this key names (default: $DHARMA_API_KEY, "
                       "else the OS user's principal by local_user); it needs role approver or admin")
        p.add_argument("--reason", help="why, recorded with the decision in the karma ledger")
        p.set_defaults(func=lambda a, approve=approve: decide(a, approve))
