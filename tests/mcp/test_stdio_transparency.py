"""Transparency over stdio with real parts: the official `mcp` SDK client against
`@modelcontextprotocol/server-everything` and `server-filesystem` (pinned, from npm), direct
and through `dharma stdio` with the permissive profile, must see the same results (apart from
the receipt in `_meta`); and the shared conformance script `stdio_check.py` must produce
identical transcripts direct and through the gateway, in both protocol eras."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from gateway.crypto.receipts import RECEIPT_META_KEY, verify_receipt
from tests.mcp.conftest import CONFORMANCE, REPO, gateway_command, gateway_env, ledger_records

PERMISSIVE = REPO / "policies" / "permissive.yaml"


def _dump(model: Any) -> Any:
    data = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return _without_receipt(data)


def _without_receipt(data: Any) -> Any:
    if isinstance(data, dict):
        meta = data.get("_meta")
        out = {k: _without_receipt(v) for k, v in data.items() if k != "_meta"}
        if isinstance(meta, dict):
            rest = {k: v for k, v in meta.items() if k != RECEIPT_META_KEY}
            if rest:
                out["_meta"] = rest
        return out
    if isinstance(data, list):
        return [_without_receipt(v) for v in data]
    return data


async def everything_session(server: StdioServerParameters) -> tuple[list[Any], list[str]]:
    """One fixed session; returns what it saw and the receipts it got."""
    seen: list[Any] = []
    receipts: list[str] = []

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        seen.append(("elicit", params.message))
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})

    async def on_sample(ctx: Any, params: Any) -> types.CreateMessageResult:
        seen.append(("sample", [m.content.text for m in params.messages]))
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="42"), model="test")

    async def on_roots(ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///tmp", name="tmp")])

    async with Client(server, elicitation_callback=on_elicit, sampling_callback=on_sample,
                      list_roots_callback=on_roots, mode="auto") as client:
        seen.append(("protocol", client.protocol_version))
        tools = await client.list_tools()
        seen.append(("tools", _dump(tools)))
        for name, args in [
            ("echo", {"message": "hi"}),
            ("get-sum", {"a": 2, "b": 40}),
            ("get-structured-content", {"location": "New York"}),
            ("get-tiny-image", {}),
            ("trigger-elicitation-request", {}),
            ("trigger-sampling-request", {"prompt": "What is 6*7?", "maxTokens": 10}),
            ("no-such-tool", {}),
        ]:
            result = await client.call_tool(name, args)
            seen.append((name, _dump(result)))
            if result.meta and RECEIPT_META_KEY in result.meta:
                receipts.append(result.meta[RECEIPT_META_KEY])
        progress: list[tuple[float, float | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append((done, total))

        result = await client.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                                        progress_callback=on_progress)
        seen.append(("long", _dump(result), progress))
        resources = await client.list_resources()
        seen.append(("resources", _dump(resources)))
        read = await client.read_resource(str(resources.resources[0].uri))
        seen.append(("read", _dump(read)))
        seen.append(("templates", _dump(await client.list_resource_templates())))
        prompts = await client.list_prompts()
        seen.append(("prompts", _dump(prompts)))
        seen.append(("prompt", _dump(await client.get_prompt("simple-prompt", {}))))
        seen.append(("args-prompt", _dump(await client.get_prompt("args-prompt", {"city": "Paris", "state": "TX"}))))
        seen.append(("ping", _dump(await client.send_ping())))
    return seen, receipts


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_server_everything_direct_and_through_the_gateway_agree(npm_servers, tmp_path: Path, state: Path) -> None:
    node, everything = str(npm_servers["node"]), str(npm_servers["everything"])
    direct, none = await everything_session(StdioServerParameters(command=node, args=[everything, "stdio"]))
    assert none == []
    command = gateway_command(state, PERMISSIVE, [node, everything, "stdio"])
    proxied, receipts = await everything_session(
        StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path)))
    assert proxied == direct
    assert len(receipts) == 7  # every tools/call result carries one
    # the receipts verify against the gateway's JWKS and point into the ledger
    from gateway.crypto.receipts import KeyStore

    jwks = KeyStore.open(state, create=False).jwks()
    payload = verify_receipt(receipts[0], jwks)
    records = ledger_records(state)
    assert payload["ledger"]["seq"] in {r["seq"] for r in records}
    # one outcome record per call (its decision record came before it)
    assert [r["tool"] for r in records if r["tool"] and r.get("kind") != "decision"][:3] == ["echo", "get-sum", "get-structured-content"]


async def test_server_filesystem_through_the_gateway(npm_servers, tmp_path: Path, state: Path) -> None:
    root = tmp_path / "fsroot"
    root.mkdir()
    (root / "hello.txt").write_text("hello\n")
    node, fs = str(npm_servers["node"]), str(npm_servers["filesystem"])
    profile = tmp_path / "standard-fs.yaml"
    text = (REPO / "policies" / "standard.yaml").read_text().replace("../rules/", str(REPO / "rules") + "/")
    marker = "    tier: operator\n"
    text = text.replace(marker, marker + f'    claims: {{fs_roots: ["{root}"]}}\n', 1)
    profile.write_text(text)
    command = gateway_command(state, profile, [node, fs, str(root)])
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))
    async with Client(params, mode="auto") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"read_text_file", "write_file", "list_directory"} <= names
        read = await client.call_tool("read_text_file", {"path": str(root / "hello.txt")})
        assert not read.is_error and read.structured_content == {"content": "hello\n"}
        assert RECEIPT_META_KEY in (read.meta or {})
        # the shipped filesystem rules refuse traversal before the server sees it
        traversal = await client.call_tool("read_text_file", {"path": str(root / ".." / ".." / "etc" / "passwd")})
        assert traversal.is_error
        assert traversal.meta["dharma.gateway/decision"]["error_code"] == "policy_blocked"
        outside = await client.call_tool("list_directory", {"path": "/etc"})
        assert outside.is_error and "outside the allowed roots" in outside.content[0].text
        listed = await client.call_tool("list_directory", {"path": str(root)})
        assert not listed.is_error and "hello.txt" in listed.content[0].text


@pytest.mark.skipif(not (CONFORMANCE / "stdio_check.py").exists(), reason="../shared/conformance/stdio_check.py is not present")
async def test_stdio_check_transcripts_are_identical(tmp_path: Path, state: Path) -> None:
    script = CONFORMANCE / "stdio_check.py"
    fixture = [sys.executable, str(CONFORMANCE / "fixture_server.py"), "--stdio"]

    def run(*command: str) -> str:
        done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "t.txt"), *command],
                              capture_output=True, text=True, timeout=120, cwd=str(REPO),
                              env={**__import__("os").environ, **gateway_env(tmp_path)})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    direct = await anyio.to_thread.run_sync(lambda: run("--", *fixture))
    proxied = await anyio.to_thread.run_sync(lambda: run("--", *gateway_command(state, PERMISSIVE, fixture)))
    assert proxied == direct
    assert "[2026] protocol 2026-07-28" in direct and "[2025] protocol" in direct
