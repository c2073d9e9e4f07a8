"""Attack tests over stdio (issue 3, item 6): each fails if the bypass works.

`dharma stdio` runs as a subprocess around our SDK-built test server; the tests speak raw
JSON-RPC lines (the SDK client cannot send batches, duplicate keys or notifications that
should be requests), and check what reached the backend through the server's call log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from gateway.crypto.receipts import RECEIPT_META_KEY
from tests.mcp.conftest import REPO, backend_calls, gateway_command, gateway_env, ledger_records, test_server_command


def _strip_receipt(result: dict) -> dict:
    meta = {k: v for k, v in (result.get("_meta") or {}).items() if k != RECEIPT_META_KEY}
    out = {k: v for k, v in result.items() if k != "_meta"}
    if meta:
        out["_meta"] = meta
    return out


async def test_batch_smuggling_a_call_is_refused_outside_2025_03_26(raw_gateway, tmp_path: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize("2025-11-25")
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "admin_reset", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]
    await gw.send(batch)
    answer = await gw.recv()
    assert answer["error"]["code"] == -32600 and "batch" in answer["error"]["message"]
    assert answer["id"] is None
    assert "admin_reset" not in backend_calls(tmp_path)
    # the connection survives
    assert (await gw.call(3, "echo", {"text": "still here"}))["result"]["content"][0]["text"] == "echo: still here"


async def test_batch_on_2025_03_26_governs_each_element(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway()
    init = await gw.initialize("2025-03-26")
    assert init["result"]["protocolVersion"] == "2025-03-26"
    await gw.send([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "a"}}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "admin_reset", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "write_note", "arguments": {"path": "../x", "text": "t"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 1}},
    ])
    answers = await gw.recv()
    assert isinstance(answers, list)
    by_id = {a["id"]: a for a in answers}
    assert set(by_id) == {1, 2, 3, 4}
    assert by_id[1]["result"]["content"][0]["text"] == "echo: a"
    assert by_id[2]["result"]["isError"] is True and "Unknown tool: admin_reset" in by_id[2]["result"]["content"][0]["text"]
    denied = by_id[3]["result"]
    assert denied["isError"] is True and denied["_meta"]["dharma.gateway/decision"]["error_code"] == "policy_blocked"
    assert by_id[4]["result"] == {}
    assert backend_calls(tmp_path) == ["echo"]
    tools = [r["tool"] for r in ledger_records(state)]
    assert {"echo", "admin_reset", "write_note"} <= set(tools)


@pytest.mark.parametrize("payload", [
    b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","name":"admin_reset","arguments":{}}}',
    b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"admin_reset","arguments":{"text":"a","text":"b"}}}',
    b'{"jsonrpc":"2.0","id":7,"method":"tools/call","method":"ping","params":{"name":"admin_reset"}}',
])
async def test_duplicate_keys_are_rejected(raw_gateway, tmp_path: Path, payload: bytes) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    await gw.send(payload)
    answer = await gw.response(7)
    assert answer["error"]["code"] == -32600 and "duplicate key" in answer["error"]["message"]
    assert backend_calls(tmp_path) == []


@pytest.mark.parametrize("name", [
    "Echo",          # case
    "ECHO",
    "ｅｃｈｏ",       # fullwidth: NFKC folds it to "echo"
    "еcho",          # Cyrillic е
    "get_weathеr",   # Cyrillic е inside
    "echo\u200b",    # zero-width space
])
async def test_lookalike_tool_names_are_unknown(raw_gateway, tmp_path: Path, name: str) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    unknown = await gw.call(1, "no_such_tool_at_all", {"text": "x"})
    answer = await gw.call(2, name, {"text": "x", "city": "x"})
    assert answer["result"]["isError"] is True
    assert answer["result"]["content"][0]["text"] == f"Unknown tool: {name}"
    # the same answer an unknown name gets, apart from the name and the receipt
    expected = json.loads(json.dumps(_strip_receipt(unknown["result"])).replace("no_such_tool_at_all", name))
    assert _strip_receipt(answer["result"]) == expected
    assert backend_calls(tmp_path) == []


async def test_hidden_tool_answers_exactly_like_an_unknown_one(raw_gateway, tmp_path: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    await gw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    listed = await gw.response(1)
    names = [t["name"] for t in listed["result"]["tools"]]
    assert "admin_reset" not in names and "echo" in names
    hidden = await gw.call(2, "admin_reset", {})
    unknown = await gw.call(3, "admin_resex", {})
    hidden_bytes = json.dumps(_strip_receipt(hidden["result"]), sort_keys=True).replace("admin_reset", "NAME")
    unknown_bytes = json.dumps(_strip_receipt(unknown["result"]), sort_keys=True).replace("admin_resex", "NAME")
    assert hidden_bytes == unknown_bytes
    assert RECEIPT_META_KEY in hidden["result"]["_meta"] and RECEIPT_META_KEY in unknown["result"]["_meta"]
    assert "admin_reset" not in backend_calls(tmp_path)


async def test_tools_call_as_a_notification_is_never_forwarded(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    await gw.send({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "sneaky"}}})
    await gw.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
    first = await gw.recv()  # a notification gets no answer: the first line out answers the later ping
    assert first.get("id") == "after" and "result" in first, first
    assert (await gw.call(2, "echo", {"text": "ok"}))["result"]["content"][0]["text"] == "echo: ok"
    assert [m.get("id") for m in gw.seen] == ["init", "after", 2]  # nothing answered it later either
    assert backend_calls(tmp_path) == ["echo"]  # only the governed call
    assert any(r.get("method") == "tools/call" and r["status"] == "blocked" and r["tool"] == "" for r in ledger_records(state))


@pytest.mark.parametrize("notify", [True, False])
async def test_rug_pull_between_list_and_call_is_held_by_standard(raw_gateway, tmp_path: Path, state: Path, notify: bool) -> None:
    """The backend changes get_weather's description after it was listed and called once."""
    standard = REPO / "policies" / "standard.yaml"
    profile = tmp_path / "standard-plus.yaml"
    text = standard.read_text().replace("../rules/", str(REPO / "rules") + "/")
    text = text.replace('"search*"]', '"search*", "trigger_*"]')
    profile.write_text(text)
    gw = await raw_gateway("--hold-seconds", "0.5", policy=profile)
    await gw.initialize()
    await gw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    await gw.response(1)
    assert (await gw.call(2, "get_weather", {"city": "Lisbon"}))["result"]["content"][0]["text"] == "sunny in Lisbon"
    assert (await gw.call(3, "trigger_change", {"notify": notify}))["result"]["content"][0]["text"] == "changed"
    if not notify:  # a silent change shows when the client lists again
        await gw.send({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        relisted = await gw.response(4)
        weather = next(t for t in relisted["result"]["tools"] if t["name"] == "get_weather")
        assert "id_rsa" in weather["description"]
    held = await gw.call(5, "get_weather", {"city": "Lisbon"})
    result = held["result"]
    assert result["isError"] is True
    decision = result["_meta"]["dharma.gateway/decision"]
    assert decision["error_code"] == "approval_timeout"
    assert "mcp-hold-changed-tool" in decision["rules"]
    assert backend_calls(tmp_path).count("get_weather") == 1
    records = ledger_records(state)
    assert any(r["tool"] == "get_weather" and r["decision"] == "require_approval" for r in records)


async def test_sdk_client_sees_refusals_as_tool_errors(tmp_path: Path, state: Path, mcp_policy: Path) -> None:
    command = gateway_command(state, mcp_policy, test_server_command())
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))
    async with Client(params, mode="legacy") as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "admin_reset" not in names and "echo" in names
        denied = await client.call_tool("write_note", {"path": "../../etc/passwd", "text": "x"})
        assert denied.is_error
        assert "path leaves the notes folder" in denied.content[0].text
        assert denied.meta["dharma.gateway/decision"]["error_code"] == "policy_blocked"
        assert denied.meta["dharma.gateway/decision"]["retryable"] is False
        report = await client.call_tool("get_report", {"title": "q3"})  # redacted, still schema-valid
        assert not report.is_error
        assert report.structured_content == {"title": "q3", "secret": "[REDACTED]"}
        assert "sk_live" not in json.dumps([c.model_dump() for c in report.content])
    assert "write_note" not in backend_calls(tmp_path)


async def test_task_augmented_calls_to_held_or_redacted_tools_are_refused(raw_gateway, tmp_path: Path) -> None:
    # 2025-11-25 `params.task`: the result would come later from tasks/result, past governance.
    gw = await raw_gateway()
    await gw.initialize("2025-11-25")
    task = {"ttl": 60000}
    redacted = await gw.call(1, "get_report", {"title": "q3"}, task=task)
    held = await gw.call(2, "write_note", {"path": "important/plan.md", "text": "x"}, task=task)
    for answer in (redacted, held):
        result = answer["result"]
        assert result["isError"] is True and "as a task" in result["content"][0]["text"]
        assert result["_meta"]["dharma.gateway/decision"]["error_code"] == "policy_blocked"
        assert "dharma.gateway/receipt" in result["_meta"]
    hidden = await gw.call(3, "admin_reset", {}, task=task)  # hidden stays indistinguishable from unknown
    assert "as a task" not in json.dumps(hidden)
    assert backend_calls(tmp_path) == []
    plain = await gw.call(4, "get_report", {"title": "q3"})  # without `task` the call is governed as usual
    assert plain["result"].get("isError") is not True and backend_calls(tmp_path) == ["get_report"]
