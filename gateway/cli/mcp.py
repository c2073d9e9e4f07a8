"""`dharma stdio` and `dharma tools pins|accept|grants`: the MCP commands.

`dharma stdio` wraps a stdio MCP server (the agent launches it instead of the server); `dharma
tools` reviews the pinned tool definitions, accepts changed ones and shows which tiers see them.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.cli.common import COMMANDS, EXIT_FAILED, EXIT_OK, add_command, add_group, loop_factory, out, settings_of



def add_parsers(sub: Any) -> None:
    """Add `dharma stdio` and `dharma tools pins|accept` to the `dharma` subparsers."""
    p = add_command(sub, "stdio", COMMANDS["stdio"])
    p.add_argument("--policy", help="policy profile file to load (default: the one dharma.yaml names)")
    p.add_argument("--backend-id", help="name of this server for tool pinning (default: derived from CMD)")
    p.add_argument("--max-message-bytes", type=int, default=16 * 1024 * 1024, help="largest message accepted from the agent")
    p.add_argument("--hold-seconds", type=float, default=50.0, help="how long a call held for approval waits for a human")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress notifications while holding")
    p.add_argument("server", nargs=argparse.REMAINDER, metavar="-- CMD ARGS", help="the MCP server to run, after --")
    p.set_defaults(func=cmd_stdio)

    tools = add_group(sub, "tools", COMMANDS["tools"], "tools_command")
    p = add_command(tools, "pins", "list pinned tool definitions and the ones that changed")
    p.add_argument("--backend", help="only this backend's tools")
    p.add_argument("--changed", action="store_true", help="only tools whose definition changed")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_tools_pins)
    p = add_command(tools, "accept", "pin the changed definition of a tool (or of every changed tool of a backend)")
    p.add_argument("backend", metavar="BACKEND", help="backend id, as `dharma tools pins` shows it")
    p.add_argument("tool", nargs="?", metavar="TOOL", help="tool name (default: every changed tool of BACKEND)")
    p.set_defaults(func=cmd_tools_accept)
    p = add_command(tools, "grants", "which tiers see which pinned tools, under the configured policy")
    p.add_argument("--policy", help="policy profile to judge by (default: the one dharma.yaml names)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=cmd_tools_grants)


def cmd_stdio(args: argparse.Namespace) -> int:
    import anyio

    from gateway.core.errors import ConfigError
    from gateway.transports.mcp_stdio.pipes import piped
    from gateway.transports.mcp_stdio.proxy import serve_stdio

    command = list(args.server)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("dharma stdio needs the server command after --, e.g. dharma stdio -- npx some-mcp-server")

    async def main() -> int:
        return await serve_stdio(
            lambda: settings_of(args),  # read (with the policy) while the server boots
            command,
            backend_id=args.backend_id,
            max_message_bytes=args.max_message_bytes,
            hold_seconds=args.hold_seconds,
            progress_interval=args.progress_interval,
        )

    piped_io = piped(sys.stdin) and piped(sys.stdout)  # an agent's pipes: uvloop; a terminal: asyncio's loop
    return anyio.run(main, backend_options={"loop_factory": loop_factory() if piped_io else None})


def _pin_rows(args: argparse.Namespace, backend: str | None = None) -> list[dict[str, Any]] | None:
    """The pin store's rows (of `backend`, or all); None after saying why they cannot be read."""
    import anyio

    from gateway.runtime import open_pin_store
    from gateway.stores.base import StoreUnavailable

    async def rows_of() -> list[dict[str, Any]]:
        async with open_pin_store(settings_of(args)) as store:
            return await store.list(backend)

    try:
        return anyio.run(rows_of)
    except (StoreUnavailable, ValueError, OSError) as exc:  # ValueError: a pins file that is not one (named)
        out(f"cannot read the pins: {exc}")
        return None


def cmd_tools_pins(args: argparse.Namespace) -> int:
    from gateway.mcp.pins import diff_definitions

    rows = _pin_rows(args, args.backend)
    if rows is None:
        return EXIT_FAILED
    if args.changed:
        rows = [r for r in rows if r["changed"]]
    _add_findings(rows)
    if args.json:
        for row in rows:
            out(json.dumps(row, ensure_ascii=False, sort_keys=True))
        return EXIT_OK
    if not rows:
        out("no pinned tools")
    for row in rows:
        state = "CHANGED" if row["changed"] else "pinned "
        out(f"{state} {row['backend']}  {row['tool']}  {row['digest'][:16]}  since {row['pinned_at']}")
        if row["changed"]:
            for line in diff_definitions(row["definition"], row["seen_definition"]):
                out(f"    {line}")
        for finding in row["findings"]:
            out(f"    finding: {finding['kind']} at {finding['path']}: {finding['excerpt'] or finding['detail']}")
        if row["findings"] and not row["changed"]:
            out("    accepted as it is" if row["accepted"] else "    hidden by the shipped rules until accepted")
        if row["changed"] or (row["findings"] and not row["accepted"]):
            out(f"    accept with: dharma tools accept {row['backend']} {row['tool']}")
    return EXIT_OK


def _add_findings(rows: list[dict[str, Any]]) -> None:
    """Each pin's definition scan (of the changed definition, if one was seen): what
    `tool.findings` holds for it, and whether an operator accepted it as it is."""
    from gateway.stages.sanitizer.instructions import scan_definition

    names: dict[str, list[str]] = {}
    for row in rows:
        names.setdefault(row["backend"], []).append(row["tool"])
    for row in rows:
        current = row["seen_definition"] if row["changed"] else row["definition"]
        found = scan_definition(current, names[row["backend"]]) if isinstance(current, dict) else ()
        row["findings"] = [f.as_cel() for f in found]
        row["accepted"] = not row["changed"] and row.get("accepted_digest") == row["digest"]


def cmd_tools_accept(args: argparse.Namespace) -> int:
    import anyio

    from gateway.mcp.pins import now_stamp
    from gateway.runtime import open_pin_store

    async def accept() -> list[str]:
        async with open_pin_store(settings_of(args)) as store:
            return await store.accept(args.backend, args.tool, now_stamp())

    from gateway.stores.base import StoreUnavailable

    try:
        accepted = anyio.run(accept)
    except (StoreUnavailable, ValueError, OSError) as exc:
        out(f"cannot accept: {exc}")
        return EXIT_FAILED
    except KeyError as exc:
        out(f"no pin for {exc.args[0]}")
        return EXIT_FAILED
    if not accepted:
        out("nothing to accept: no changed definition was seen")
        return EXIT_OK
    for name in accepted:
        out(f"accepted the current definition of {args.backend} {name}" + (" as it is, findings included" if args.tool else ""))
    return EXIT_OK


def cmd_tools_grants(args: argparse.Namespace) -> int:
    """For every pinned tool, as clients see its name (the upstream's `prefix` + its name): the
    tiers that see it (their grants admit it and no visibility rule hides it), the ones among them
    whose calls the tool's sensitivity refuses, and the tools no tier sees."""
    from pathlib import Path

    from gateway.policy.compile import load_policy

    settings = settings_of(args)
    policy = load_policy(Path(args.policy), engine=settings.cel_engine) if args.policy else load_policy(
        settings.policy, extra=list(settings.rules), engine=settings.cel_engine)
    pins = _pin_rows(args)
    if pins is None:
        return EXIT_FAILED
    rows = tool_grants(policy, pins, {u.id: u.prefix or "" for u in settings.upstreams})
    for row in rows:
        if args.json:
            out(json.dumps(row, ensure_ascii=False, sort_keys=True))
            continue
        seen = ", ".join(t + ("(calls refused: sensitivity)" if t in row["refused_tiers"] else "") for t in row["tiers"])
        note = f"  ({row['note']})" if row["note"] else ""
        out(f"{row['backend']}  {row['tool']}  {row['sensitivity']}  {seen or 'NO TIER'}{note}")
    if not rows and not args.json:
        out("no pinned tools: run the gateway in front of a server once (tools/list pins its tools)")
    return EXIT_OK


def tool_grants(policy: Any, pins: list[dict[str, Any]], prefixes: dict[str, str]) -> list[dict[str, Any]]:
    """`dharma tools grants` rows: per pinned tool (its definition as last seen, changed or not), the
    tiers of `policy` that see it, as the gateway would decide for a caller of each tier."""
    from gateway.core.call import Principal
    from gateway.mcp import governance as gov
    from gateway.policy.evaluate import classify
    from gateway.stages.visibility import is_visible

    names: dict[str, set[str]] = {}
    for pin in pins:
        names.setdefault(pin["backend"], set()).add(prefixes.get(pin["backend"], "") + pin["tool"])
    rows = []
    for pin in sorted(pins, key=lambda p: (p["backend"], p["tool"])):
        backend, name = pin["backend"], prefixes.get(pin["backend"], "") + pin["tool"]
        definition = (pin["seen_definition"] if pin["changed"] else pin["definition"]) or {}
        accepted = not pin["changed"] and pin.get("accepted_digest") == pin["digest"]
        info = gov.tool_info({**definition, "name": name}, backend, changed=pin["changed"], accepted=accepted,
                             names=frozenset(names[backend]))
        clash = gov.colliding_names(frozenset(names[backend])).get(name)
        level, _ = classify(policy, name, None)
        tiers = [] if clash else [t for t in policy.tiers if is_visible(policy, Principal(id=f"tier:{t}", tier=t), info)]
        note = f"refused: folds to one name with {clash}" if clash else ("changed since pinned" if pin["changed"] else "")
        rows.append({"backend": backend, "tool": name, "sensitivity": level.value, "tiers": tiers, "note": note,
                     "refused_tiers": [t for t in tiers if level.rank > policy.tiers[t].max_sensitivity.rank]})
    return rows
