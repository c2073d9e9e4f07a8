"""Approvals over HTTP: a hold with progress (naming who decides and where: /ui/approvals, the
CLI, POST /v1/approvals/ID:approve) until an approver or admin decides, whatever the client
answers to forms (it may be the agent itself); elicitation (legacy `elicitation/create`, 2026
`input_required` + signed requestState) only where the profile opts in."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
import yaml

from tests.conftest import REPO, key_digest
from tests.helpers import AgentAnswers
from tests.mcp.conftest import ledger_records
from tests.mcp_http.conftest import client, serve_gateway, upstream, write_profile

STRICT = REPO / "policies" / "strict.yaml"


def _strict_profile(directory: Path) -> Path:
    """The shipped strict profile with two callers: alice (tier operator: may delete, no role) and
    an approver (role approver); only principals may be added to a profile that extends it."""
    directory.mkdir()
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "dharma/v1", "kind": "Policy", "metadata": {"name": "strict-callers"}, "extends": str(STRICT),
        "principals": [{"id": "alice", "api_key_sha256": key_digest("alice-key"), "tier": "operator"},
                       {"id": "approver", "api_key_sha256": key_digest("approver-key"), "tier": "reader",
                        "roles": ["approver"]}]}), encoding="utf-8")
    return path


def _demo_upstream(sandbox: Path) -> dict[str, Any]:
    """The demo MCP server over stdio, its file tools working in `sandbox` (the `make run` backend)."""
    sandbox.mkdir()
    (sandbox / "victim.txt").write_text("keep me", encoding="utf-8")
    return {"id": "demo", "type": "mcp_stdio", "command": sys.executable, "args": ["-m", "examples.demo_mcp_server"],
            "env": {"PYTHONPATH": str(REPO), "DHARMA_DEMO_SANDBOX": str(sandbox)}}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("approve", [True, False])
async def test_approval_through_elicitation_where_the_profile_opts_in(toy_url: str, tmp_path: Path, mode: str, approve: bool) -> None:
    asked: list[str] = []

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": approve})

    policy = write_profile(tmp_path / "policy", approval={"allow_elicitation": ["user"]})  # alice's tier opts in
    async with serve_gateway(tmp_path, [upstream(toy_url)], policy) as gw:
        async with client(gw.url, "alice-key", mode=mode, elicitation_callback=on_elicit) as c:
            r = await c.call_tool("delete_file", {"path": "/tmp/x"})
    assert asked and "Dharma Gateway" in asked[0] and "delete_file" in asked[0]
    if approve:
        assert not r.is_error and r.content[0].text == "deleted /tmp/x"
    else:
        assert r.is_error and r.meta["dharma.gateway/decision"]["error_code"] == "approval_denied"
    # recorded distinctly: the caller itself decided, by elicitation
    events = [(e["event"], e["by"], e["via"]) for e in ledger_records(tmp_path / "state") if e.get("kind") == "approval"]
    assert events == [("held", "alice", "gateway"), ("approved" if approve else "denied", "alice", "elicitation")]


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


async def test_strict_profile_holds_for_an_approver_whatever_the_client_answers(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    agent = AgentAnswers()
    async with serve_gateway(tmp_path, [_demo_upstream(sandbox)], _strict_profile(tmp_path / "policy"), hold_seconds=60) as gw:
        async def approve_when_pending() -> None:
            async with httpx.AsyncClient(headers={"X-API-Key": "approver-key"}) as http:
                with anyio.fail_after(30):
                    while not ((pending := (await http.get(gw.base + "/v1/approvals")).json()["approvals"]) and agent.notes):
                        await anyio.sleep(0.1)
                approval_id = pending[0]["id"]
                assert (sandbox / "victim.txt").exists() and agent.asked == []  # held: nothing ran, nobody was asked
                note = agent.notes[0] or ""
                assert approval_id in note and "role approver or admin" in note
                assert "/ui/approvals" in note and f"POST /v1/approvals/{approval_id}:approve" in note
                assert f"dharma approvals approve {approval_id}" in note
                r = await http.post(gw.base + f"/v1/approvals/{approval_id}:approve")
                assert r.status_code == 200, r.text

        async with anyio.create_task_group() as tg:
            tg.start_soon(approve_when_pending)
            async with client(gw.url, "alice-key", mode="legacy", elicitation_callback=agent.accept) as c:
                r = await c.call_tool("delete_file", {"path": "victim.txt"}, progress_callback=agent.progress)
    assert not r.is_error and r.content[0].text == "deleted victim.txt"
    assert not (sandbox / "victim.txt").exists() and agent.asked == []
    events = [(e["event"], e["by"], e["via"]) for e in ledger_records(tmp_path / "state") if e.get("kind") == "approval"]
    assert events == [("held", "alice", "gateway"), ("approved", "approver", "http")]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_strict_profile_answer_names_the_approval_and_who_decides_where(tmp_path: Path, mode: str) -> None:
    sandbox = tmp_path / "sandbox"
    agent = AgentAnswers()
    async with serve_gateway(tmp_path, [_demo_upstream(sandbox)], _strict_profile(tmp_path / "policy"), hold_seconds=1) as gw:
        async with client(gw.url, "alice-key", mode=mode, elicitation_callback=agent.accept) as c:
            r = await c.call_tool("delete_file", {"path": "victim.txt"})
    assert agent.asked == [] and (sandbox / "victim.txt").read_text(encoding="utf-8") == "keep me"
    decision = r.meta["dharma.gateway/decision"]
    approval_id = decision["approval_id"]
    assert r.is_error and decision["error_code"] == "approval_timeout"
    text = r.content[0].text
    assert approval_id in text and "role approver or admin" in text and "It was held 1s for a human" in text
    assert "this gateway's /ui/approvals page" in text and f"POST /v1/approvals/{approval_id}:approve" in text
    events = [(e["event"], e["by"], e["via"]) for e in ledger_records(tmp_path / "state") if e.get("kind") == "approval"]
    assert events == [("held", "alice", "gateway"), ("expired", None, "timeout")]
