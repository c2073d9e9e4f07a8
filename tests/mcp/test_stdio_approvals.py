"""Approvals over MCP stdio: a hold that an approver ends with `dharma approvals approve|deny`
(progress on the client's token meanwhile, naming who decides and where), whatever the client
answers to forms, since the client may be the agent itself; elicitation only where a profile
opts in (`approval.allow_elicitation`); and a client cancel that drops the hold."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from gateway.stores.sqlite_approvals import SqliteApprovalStore
from tests.helpers import AgentAnswers
from tests.mcp.conftest import REPO, backend_calls, gateway_command, gateway_env, ledger_records, test_server_command


DEMO_PROFILE = REPO / "examples" / "policies" / "demo.yaml"
"""policies/standard.yaml plus the demo's published keys (`demo-admin-key`: role admin)."""


def _params(tmp_path: Path, state: Path, policy: Path, *extra: str) -> StdioServerParameters:
    command = gateway_command(state, policy, test_server_command(), *extra)
    return StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))


def _demo_params(tmp_path: Path, state: Path, sandbox: Path, *extra: str) -> StdioServerParameters:
    """`dharma stdio` with the shipped standard profile (and the demo keys) around the demo MCP
    server, whose file tools work in `sandbox`; the local user is the standard profile's `local`
    (tier operator, no approver role)."""
    command = gateway_command(state, DEMO_PROFILE, [sys.executable, "-m", "examples.demo_mcp_server"], *extra)
    return StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO),
                                 env={**gateway_env(tmp_path), "DHARMA_DEMO_SANDBOX": str(sandbox)})


def _victim(tmp_path: Path) -> Path:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (sandbox / "victim.txt").write_text("keep me", encoding="utf-8")
    return sandbox


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_callers_own_accept_releases_nothing_under_the_shipped_profile(
        tmp_path: Path, state: Path, mode: str) -> None:
    # The attack: a client that declares elicitation and accepts every form. The gateway asks it
    # nothing (legacy: no `elicitation/create`; 2026: no `input_required`), holds the call for an
    # approver, and when nobody decides in time says who could have, and where.
    sandbox = _victim(tmp_path)
    agent = AgentAnswers()
    params = _demo_params(tmp_path, state, sandbox, "--hold-seconds", "1.5", "--progress-interval", "0.2")
    async with Client(params, elicitation_callback=agent.accept, mode=mode) as client:
        result = await client.call_tool("delete_file", {"path": "victim.txt"}, progress_callback=agent.progress)
    assert agent.asked == []
    assert (sandbox / "victim.txt").read_text(encoding="utf-8") == "keep me"  # the backend saw nothing
    decision = result.meta["dharma.gateway/decision"]
    approval_id = decision["approval_id"]
    assert result.is_error and decision["error_code"] == "approval_timeout" and approval_id.startswith("apr_")
    text = result.content[0].text
    assert approval_id in text and "role approver or admin" in text
    assert f"`dharma approvals approve {approval_id}` on the machine running this gateway" in text
    assert "this gateway's /ui" not in text  # no HTTP server behind `dharma stdio`
    assert agent.notes and all(approval_id in (n or "") and "approver or admin" in (n or "") for n in agent.notes)
    events = [(r["event"], r["by"], r["via"]) for r in ledger_records(state) if r.get("kind") == "approval"]
    assert events == [("held", "local", "gateway"), ("expired", None, "timeout")]


async def test_an_approver_on_the_cli_releases_the_held_call_under_the_shipped_profile(tmp_path: Path, state: Path) -> None:
    sandbox = _victim(tmp_path)
    agent = AgentAnswers()

    async def approve_as_admin() -> None:
        store = SqliteApprovalStore(state / "approvals.db")
        with anyio.fail_after(30):
            while not ((pending := store.pending_sync(time.time())) and agent.notes):
                await anyio.sleep(0.1)
        assert (sandbox / "victim.txt").exists() and agent.asked == []  # held: nothing ran, nobody was asked
        assert f"dharma approvals approve {pending[0].id}" in (agent.notes[0] or "")
        done = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "gateway", "--state-root", str(state), "approvals", "approve", pending[0].id,
             "--policy", str(DEMO_PROFILE), "--api-key", "demo-admin-key"],
            capture_output=True, text=True, cwd=str(REPO)))
        assert done.returncode == 0, done.stdout + done.stderr

    params = _demo_params(tmp_path, state, sandbox, "--hold-seconds", "60", "--progress-interval", "0.2")
    async with Client(params, elicitation_callback=agent.accept, mode="legacy") as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(approve_as_admin)
            result = await client.call_tool("delete_file", {"path": "victim.txt"}, progress_callback=agent.progress)
    assert not result.is_error and result.content[0].text == "deleted victim.txt"
    assert not (sandbox / "victim.txt").exists() and agent.asked == []
    events = [(r["event"], r["by"], r["via"]) for r in ledger_records(state) if r.get("kind") == "approval"]
    assert events == [("held", "local", "gateway"), ("approved", "demo-admin", "cli")]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("approve", [True, False])
async def test_elicitation_asks_the_client_where_the_profile_opts_in(tmp_path: Path, state: Path, elicitation_policy: Path,
                                                                     approve: bool, mode: str) -> None:
    # `approval.allow_elicitation: true`. Legacy: `elicitation/create` with a gateway id.
    # 2026-07-28 (no server→client requests): an `input_required` result with the gateway's sealed
    # requestState; the SDK client retries with the answer (the same code as /mcp).
    asked: list[Any] = []

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"approve": approve})

    async with Client(_params(tmp_path, state, elicitation_policy), elicitation_callback=on_elicit, mode=mode) as client:
        result = await client.call_tool("write_note", {"path": "important/plan.md", "text": "ship it"})
    assert len(asked) == 1
    assert "Dharma Gateway" in asked[0].message and "write_note" in asked[0].message
    if approve:
        assert not result.is_error and result.content[0].text == "wrote 7 characters to important/plan.md"
        assert backend_calls(tmp_path) == ["write_note"]
    else:
        assert result.is_error
        assert result.meta["dharma.gateway/decision"]["error_code"] == "approval_denied"
        assert backend_calls(tmp_path) == []
    everything = ledger_records(state)
    written = [r for r in everything if r["tool"] == "write_note" and r.get("kind") != "approval"]
    decisions = [r["decision"] for r in written if r.get("kind") != "decision"]
    assert decisions[0] == "require_approval" and len(decisions) == 2
    # only the approved retry reached the backend, so only it has a decision record
    assert [r.get("kind") for r in written] == ([None, "decision", "outcome"] if approve else [None, None])
    # the answer is the session's own principal deciding by elicitation (self-approval by nature),
    # recorded distinctly: `via: elicitation`, the caller as the one who decided
    caller = written[0]["principal"]
    assert caller == "local"
    events = [(r["event"], r["by"], r["via"]) for r in everything if r.get("kind") == "approval"]
    assert events == [("held", caller, "gateway"), ("approved" if approve else "denied", caller, "elicitation")]


async def test_hold_until_approved_by_the_cli_with_progress(tmp_path: Path, state: Path, mcp_policy: Path) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async def approve_when_pending() -> None:
        store = SqliteApprovalStore(state / "approvals.db")
        with anyio.fail_after(20):
            while not (pending := store.pending_sync(time.time())):
                await anyio.sleep(0.1)
        done = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "gateway", "--state-root", str(state), "approvals", "approve", pending[0].id,
             "--policy", str(mcp_policy), "--api-key", "operator-key"],
            capture_output=True, text=True, cwd=str(REPO)))
        assert done.returncode == 0, done.stderr
        assert "approved by operator" in done.stdout

    # a human operator (role approver, by API key) decides for the agent's principal `local`
    text = mcp_policy.read_text()
    local = '  - {id: local, local_user: "*", tier: agent}\n'
    assert local in text
    digest = hashlib.sha256(b"operator-key").hexdigest()
    mcp_policy.write_text(text.replace(local, local + f"  - {{id: operator, api_key_sha256: {digest}, tier: agent, roles: [approver]}}\n"))

    params = _params(tmp_path, state, mcp_policy, "--hold-seconds", "20", "--progress-interval", "0.2")
    async with Client(params, mode="legacy") as client:  # no elicitation declared
        async with anyio.create_task_group() as tg:
            tg.start_soon(approve_when_pending)
            result = await client.call_tool("write_note", {"path": "important/a.md", "text": "abc"},
                                            progress_callback=on_progress)
    assert not result.is_error and result.content[0].text == "wrote 3 characters to important/a.md"
    assert progress and "waiting for a human to approve apr_" in (progress[0][1] or "")
    assert backend_calls(tmp_path) == ["write_note"]
    events = [(r["event"], r["by"], r["via"]) for r in ledger_records(state) if r.get("kind") == "approval"]
    assert events == [("held", "local", "gateway"), ("approved", "operator", "cli")]


async def test_hold_times_out_without_a_decision(raw_gateway, tmp_path: Path) -> None:
    gw = await raw_gateway("--hold-seconds", "0.3")
    await gw.initialize()
    answer = await gw.call(1, "write_note", {"path": "important/b.md", "text": "x"})
    assert answer["result"]["_meta"]["dharma.gateway/decision"]["error_code"] == "approval_timeout"
    assert backend_calls(tmp_path) == []


async def test_client_cancel_drops_the_hold(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway("--hold-seconds", "30", "--progress-interval", "0.1")
    await gw.initialize()
    await gw.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
        "name": "write_note", "arguments": {"path": "important/c.md", "text": "x"}, "_meta": {"progressToken": "tok"}}})
    first = await gw.recv()
    assert first["method"] == "notifications/progress" and first["params"]["progressToken"] == "tok"
    await gw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5, "reason": "user abort"}})
    # A later call's answer is the signal that the cancel was handled (stdin is read in order).
    assert (await gw.call(6, "echo", {"text": "next"}))["result"]["content"][0]["text"] == "echo: next"
    assert not [m for m in gw.seen if m.get("id") == 5]  # no answer to a cancelled request
    store = SqliteApprovalStore(state / "approvals.db")
    with anyio.fail_after(20):  # the hold (and its approval) is gone
        while store.pending_sync(time.time()):
            await anyio.sleep(0.05)
    assert backend_calls(tmp_path) == ["echo"]


async def test_2026_request_state_is_bound_to_the_call(raw_gateway, tmp_path: Path, elicitation_policy: Path) -> None:
    gw = await raw_gateway(policy=elicitation_policy)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    args = {"path": "important/plan.md", "text": "ship it"}
    first = await gw.call(1, "write_note", args, _meta=meta)
    state = first["result"]["requestState"]
    assert first["result"]["resultType"] == "input_required" and state.startswith("dgw1.")
    answer = {"dharma.gateway/approval": {"action": "accept", "content": {"approve": True}}}
    other = await gw.call(2, "write_note", {**args, "text": "other"}, _meta=meta, requestState=state, inputResponses=answer)
    assert other["error"]["code"] == -32602 and "different call" in other["error"]["message"]
    forged = state[:-1] + ("1" if state.endswith("0") else "0")
    tampered = await gw.call(3, "write_note", args, _meta=meta, requestState=forged, inputResponses=answer)
    assert tampered["error"]["code"] == -32602
    assert backend_calls(tmp_path) == []
    done = await gw.call(4, "write_note", args, _meta=meta, requestState=state, inputResponses=answer)
    assert done["result"]["content"][0]["text"] == "wrote 7 characters to important/plan.md"
    assert backend_calls(tmp_path) == ["write_note"]
