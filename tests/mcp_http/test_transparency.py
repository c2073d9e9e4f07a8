"""Transparency: the same session against server-everything directly and through the gateway
(permissive profile) gives the same results for tools, resources, prompts, progress,
elicitation and sampling; only the receipt in `_meta` differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types

from gateway.crypto.receipts import RECEIPT_META_KEY
from tests.conftest import REPO
from tests.mcp_http.conftest import client, serve_gateway, upstream


def dump(value: Any) -> Any:
    d = value.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(d.get("_meta"), dict):
        d["_meta"].pop(RECEIPT_META_KEY, None)
        if not d["_meta"]:
            del d["_meta"]
    return d


async def session(url: str) -> list[Any]:
    log: list[Any] = []

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        log.append(["elicit", params.message])
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "email": "ada@example.com"})

    async def on_sample(ctx: Any, params: Any) -> types.CreateMessageResult:
        log.append(["sample", dump(params)])
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="sampled!"), model="test")

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        log.append(["progress", progress, total])

    async with client(url, None, mode="legacy", elicitation_callback=on_elicit, sampling_callback=on_sample) as c:
        tools = await c.list_tools()
        names = [t.name for t in tools.tools]
        log.append(["tools", [dump(t) for t in tools.tools]])
        log.append(["echo", dump(await c.call_tool("echo", {"message": "hi"}))])
        log.append(["sum", dump(await c.call_tool("get-sum", {"a": 2, "b": 40}))])
        log.append(["progress-call", dump(await c.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                                                             progress_callback=on_progress))])
        if "trigger-elicitation-request" in names:
            log.append(["elicit-call", dump(await c.call_tool("trigger-elicitation-request", {}))])
        if "trigger-sampling-request" in names:
            log.append(["sample-call", dump(await c.call_tool("trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}))])
        resources = await c.list_resources()
        log.append(["resources", dump(resources)])
        if resources.resources:
            log.append(["read", dump(await c.read_resource(resources.resources[0].uri))])
        templates = await c.list_resource_templates()
        log.append(["templates", dump(templates)])
        prompts = await c.list_prompts()
        log.append(["prompts", dump(prompts)])
        simple = [p for p in prompts.prompts if not p.arguments]
        if simple:
            log.append(["prompt", dump(await c.get_prompt(simple[0].name, {}))])
        log.append(["unknown", dump(await c.call_tool("no-such-tool", {}))])
    return log


async def test_server_everything_direct_and_through_the_gateway(everything_url: str, tmp_path: Path) -> None:
    direct = await session(everything_url)
    async with serve_gateway(tmp_path, [upstream(everything_url, "everything")], REPO / "policies" / "permissive.yaml",
                             anonymous_user="tester") as gw:
        through = await session(gw.url)
    kinds = {entry[0] for entry in direct}
    assert {"tools", "echo", "progress-call", "resources", "prompts"} <= kinds
    assert any(e[0] == "progress" for e in direct) and any(e[0] == "elicit" for e in direct)
    assert any(e[0] == "sample" for e in direct)
    assert json.dumps(through, indent=1, sort_keys=True) == json.dumps(direct, indent=1, sort_keys=True)
