"""MCP support: strict JSON-RPC (`jsonrpc`), per-connection state (`session`), MCP governance
shared by the transports (`governance`) and tool pinning (`pins`).

`register_cli` adds `dharma stdio` and `dharma tools pins|accept` to the CLI; it imports
nothing heavy until a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def register_cli(sub: Any, settings_of: Callable[[Any], Any]) -> None:
    """Add the MCP commands to the `dharma` subparsers; `settings_of(args)` loads Settings."""
    p = sub.add_parser("stdio", help="govern a stdio MCP server: dharma stdio [--config F] -- CMD ARGS...")
    p.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="dharma.yaml (default: $DHARMA_CONFIG)")
    p.add_argument("--policy", help="policy profile to load")
    p.add_argument("--backend-id", help="name of this server for tool pinning (default: derived from CMD)")
    p.add_argument("--max-message-bytes", type=int, default=16 * 1024 * 1024, help="largest message accepted from the agent")
    p.add_argument("--hold-seconds", type=float, default=50.0, help="how long a call held for approval waits for a human")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress notifications while holding")
    p.add_argument("server", nargs=argparse.REMAINDER, help="-- CMD ARGS...: the MCP server to run")
    p.set_defaults(func=lambda args: _run_stdio(args, settings_of))

    tools = sub.add_parser("tools", help="review pinned MCP tool definitions").add_subparsers(dest="tools_command", required=True)
    p = tools.add_parser("pins", help="list pinned tool definitions and the ones that changed")
    p.add_argument("--backend")
    p.add_argument("--changed", action="store_true", help="only tools whose definition changed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda args: _run_pins(args, settings_of))
    p = tools.add_parser("accept", help="pin the changed definition of a tool (or of every changed tool of a backend)")
    p.add_argument("backend")
    p.add_argument("tool", nargs="?")
    p.set_defaults(func=lambda args: _run_accept(args, settings_of))


def _run_stdio(args: Any, settings_of: Callable[[Any], Any]) -> int:
    import anyio

    from gateway.core.errors import ConfigError
    from gateway.logging import configure_logging
    from gateway.transports.mcp_stdio.proxy import serve_stdio

    command = list(args.server)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("dharma stdio needs the server command after --, e.g. dharma stdio -- npx some-mcp-server")
    settings = settings_of(args)
    configure_logging(settings.log_level)

    async def main() -> int:
        return await serve_stdio(
            settings,
            command,
            backend_id=args.backend_id,
            max_message_bytes=args.max_message_bytes,
            hold_seconds=args.hold_seconds,
            progress_interval=args.progress_interval,
        )

    return anyio.run(main)


def _run_pins(args: Any, settings_of: Callable[[Any], Any]) -> int:
    from gateway.mcp.pins import PinStore, diff_definitions

    rows = PinStore(settings_of(args).state_dir).list(args.backend)
    if args.changed:
        rows = [r for r in rows if r["changed"]]
    out = sys.stdout
    if args.json:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
        return 0
    if not rows:
        out.write("no pinned tools\n")
    for row in rows:
        state = "CHANGED" if row["changed"] else "pinned "
        out.write(f"{state} {row['backend']}  {row['tool']}  {row['digest'][:16]}  since {row['pinned_at']}\n")
        if row["changed"]:
            for line in diff_definitions(row["definition"], row["seen_definition"]):
                out.write(f"    {line}\n")
            out.write(f"    accept with: dharma tools accept {row['backend']} {row['tool']}\n")
    return 0


def _run_accept(args: Any, settings_of: Callable[[Any], Any]) -> int:
    from gateway.mcp.pins import PinStore

    store = PinStore(settings_of(args).state_dir)
    try:
        accepted = store.accept(args.backend, args.tool)
    except KeyError as exc:
        sys.stdout.write(f"no pin for {exc.args[0]}\n")
        return 1
    if not accepted:
        sys.stdout.write("nothing to accept: no changed definition was seen\n")
        return 0
    for name in accepted:
        sys.stdout.write(f"accepted the new definition of {args.backend} {name}\n")
    return 0
