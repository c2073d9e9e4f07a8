"""The corpus backend: a real MCP server on the official `mcp` SDK that serves one case's tools
and scripted results over stdio.

    python tests/corpus/server.py CASE_FILE CASE_ID          # serve one case on stdin/stdout

`tools/list` answers the case's `tools`; once the first `tools/call` has been answered (a case
with `tools_later`, "turns malicious after the first listing"), every later listing answers
`tools_later` instead, and the server sends `notifications/tools/list_changed` with that answer.
`tools/call` answers the next step's scripted `result` whose `call` names the tool (steps are
consumed in order, per tool); a name the case does not list gets the SDK's usual unknown-tool
error, which is what the gateway's probe for a hidden tool asks.

The runner starts it through tests/corpus/zygote.py (forked, the SDK already imported); run by
hand it is an ordinary stdio MCP server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server

if __package__ in (None, ""):  # run as a script: make `tests.corpus` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.corpus.model import Case, CorpusError, find_case  # noqa: E402

CASE_ENV = "CORPUS_CASE"  # "CASE_FILE#CASE_ID", an alternative to the two arguments


def load_case(path: str, case_id: str) -> Case:
    """The case `case_id` of the corpus file `path`, or exit naming what is wrong."""
    try:
        return find_case(Path(path), case_id)
    except CorpusError as exc:
        raise SystemExit(f"corpus server: {exc}") from None


def build(case: Case) -> Server[Any]:
    """An SDK server answering `case`'s listings and scripted calls."""
    first = [types.Tool.model_validate(t) for t in case.tools]
    later = [types.Tool.model_validate(t) for t in case.tools_later] if case.tools_later else None
    pending: dict[str, list[dict[str, Any]]] = {}
    for step in case.steps:
        pending.setdefault(step.call, []).append(step.result)
    state = {"turned": False}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=later if state["turned"] else first)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        listed = {t.name for t in (later if state["turned"] else first)}
        queue = pending.get(params.name)
        if params.name not in listed or not queue:
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"Unknown tool: {params.name}")],
                                        is_error=True)
        result = types.CallToolResult.model_validate(queue.pop(0))
        if later is not None and not state["turned"]:
            state["turned"] = True
            await ctx.session.send_tool_list_changed()
        return result

    return Server(f"corpus-{case.id}", on_list_tools=list_tools, on_call_tool=call_tool)


def serve(case: Case) -> None:
    """Serve `case` on this process's stdin and stdout until the client hangs up."""
    server = build(case)

    async def main() -> None:
        async with stdio_server() as (read, write):
            options = server.create_initialization_options(NotificationOptions(tools_changed=True))
            await server.run(read, write, options)

    anyio.run(main)


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        serve(load_case(argv[0], argv[1]))
        return 0
    if not argv and os.environ.get(CASE_ENV, "").count("#") >= 1:
        case_file, case_id = os.environ[CASE_ENV].rsplit("#", 1)
        serve(load_case(case_file, case_id))
        return 0
    sys.stderr.write(f"usage: server.py CASE_FILE CASE_ID (or {CASE_ENV}=FILE#ID)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
