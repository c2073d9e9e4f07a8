"""Approvals over HTTP: elicitation when the client declared it (legacy `elicitation/create`,
2026 `input_required` + signed requestState), else a hold with progress until approved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest

from tests.mcp_http.conftest import client, serve_gateway, upstream


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("approve", [True, False])
async def test_approval_through_elicitation(toy_url: str, tmp_path: Path, mode: str, approve: bool) -> None:
    asked: list[str] = []

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": approve})

    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with client(gw.url, "alice-key", mode=mode, elicitation_callback=on_elicit) as c:
            r = await c.call_tool("delete_file", {"path": "/tmp/x"})
    assert asked and "Dharma Gateway" in asked[0] and "delete_file" in asked[0]
    if approve:
        assert not r.is_error and r.content[0].text == "deleted /tmp/x"
    else:
        assert r.is_error and r.meta["dharma.gateway/decision"]["error_code"] == "approval_denied"


async def test_hold_with_progress_until_approved_over_http(toy_url: str, tmp_path: Path) -> None:
    progress: list[str | None] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    # A hold long enough that a loaded machine cannot end it before the approver acts.
    async with serve_gateway(tmp_path, [upstream(toy_url)], hold_seconds=60) as gw:
        async def approve_when_pending() -> None:
            async with httpx.AsyncClient(headers={"X-API-Key": "approver-key"}) as http:
                with anyio.fail_after(30):
                    while not ((pending := (await http.get(gw.base + "/v1/approvals")).json()["approvals"]) and progress):
                        await anyio.sleep(0.1)
                r = await http.post(gw.base + f"/v1/approvals/{pending[0]['id']}:approve")
                assert r.status_code == 200

        async with anyio.create_task_group() as tg:
            tg.start_soon(approve_when_pending)
            async with client(gw.url, "alice-key", mode="legacy") as c:
                r = await c.call_tool("delete_file", {"path": "/tmp/y"}, progress_callback=on_progress)
    assert not r.is_error and r.content[0].text == "deleted /tmp/y"
    assert progress and "waiting for a human" in (progress[0] or "")


async def test_hold_times_out(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)], hold_seconds=0.5) as gw:
        async with client(gw.url, "alice-key", mode="2026-07-28") as c:
            r = await c.call_tool("delete_file", {"path": "/tmp/z"})
    assert r.is_error and r.meta["dharma.gateway/decision"]["error_code"] in ("approval_timeout", "approval_denied")
