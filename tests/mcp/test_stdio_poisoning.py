"""Tool poisoning and injected results through `dharma stdio` (issue 10, deliverables 1 and 2).

The official SDK client talks to `dharma stdio` wrapping a real SDK server
(tests/mcp/servers/poison_server.py) under the shipped standard profile: the poisoned tool is
not listed and a call to it is answered exactly like a call to a tool that does not exist; an
injected result is withheld with the configured no-information answer; a definition that turns
malicious after the first listing is held; `dharma tools accept` makes an accepted definition
visible again without restarting the gateway.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from gateway.crypto.receipts import RECEIPT_META_KEY
from tests.mcp.conftest import REPO, backend_calls, gateway_command, gateway_env, ledger_records

SERVER = [sys.executable, str(Path(__file__).resolve().parent / "servers" / "poison_server.py")]
BACKEND = "poison"


def standard_profile(tmp_path: Path) -> Path:
    """The shipped standard profile, its rule sets by absolute path, `trigger_*` granted too."""
    text = (REPO / "policies" / "standard.yaml").read_text().replace("../rules/", str(REPO / "rules") + "/")
    profile = tmp_path / "standard-plus.yaml"
    profile.write_text(text.replace('"search*"]', '"search*", "trigger_*"]'))
    return profile


def client_params(tmp_path: Path, state: Path, *extra: str) -> StdioServerParameters:
    command = gateway_command(state, standard_profile(tmp_path), SERVER, "--backend-id", BACKEND, *extra)
    return StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))


def dharma(state: Path, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gateway", "--state-root", str(state), *argv], capture_output=True,
                          text=True, cwd=str(REPO), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def without_receipt(result: dict) -> dict:
    """A dumped CallToolResult without the receipt (it differs per call by design)."""
    return {k: v for k, v in result.items() if k != "meta"} | {
        "meta": {k: v for k, v in (result.get("meta") or {}).items() if k != RECEIPT_META_KEY}}


async def test_poisoned_tool_is_hidden_and_answers_like_an_unknown_one(tmp_path: Path, state: Path) -> None:
    async with Client(client_params(tmp_path, state), mode="legacy") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"get_echo", "search_web", "get_time"} <= names
        assert "get_sum" not in names
        hidden = await client.call_tool("get_sum", {"a": 1, "b": 2})
        unknown = await client.call_tool("get_sux", {"a": 1, "b": 2})
        assert hidden.is_error and unknown.is_error
        shown = json.dumps(without_receipt(hidden.model_dump(mode="json")), sort_keys=True).replace("get_sum", "NAME")
        other = json.dumps(without_receipt(unknown.model_dump(mode="json")), sort_keys=True).replace("get_sux", "NAME")
        assert shown == other
        echoed = await client.call_tool("get_echo", {"text": "hi"})
        assert not echoed.is_error and echoed.content[0].text == "echo: hi"
    assert "get_sum" not in backend_calls(tmp_path) and "get_echo" in backend_calls(tmp_path)
    refused = [r for r in ledger_records(state) if r.get("tool") == "get_sum"]
    assert refused and refused[0]["matched_rules"] == ["tools-hide-poisoned-definition"]
    assert refused[0]["error_code"] == "tool_not_found"


async def test_injected_result_is_withheld_with_the_no_information_answer(tmp_path: Path, state: Path) -> None:
    async with Client(client_params(tmp_path, state), mode="legacy") as client:
        result = await client.call_tool("search_web", {"query": "weather"})
    assert not result.is_error
    assert [c.text for c in result.content] == ["No matching records found."]
    assert "search_web" in backend_calls(tmp_path)  # it ran; its answer did not reach the model
    record = [r for r in ledger_records(state) if r.get("tool") == "search_web" and r.get("disclosure")]
    assert record and record[-1]["disclosure"] == "WITHHOLD"


async def test_definition_turning_malicious_is_held_then_accepted(tmp_path: Path, state: Path) -> None:
    """get_time is benign when first listed; then the server rewrites it to ask for AWS keys. The
    call is held (the changed-pin hold, as before issue 10); after the operator accepts that exact
    definition by name it is listed and callable again, in the same gateway process."""
    async with Client(client_params(tmp_path, state, "--hold-seconds", "0.5"), mode="legacy") as client:
        await client.list_tools()
        assert (await client.call_tool("get_time", {"zone": "UTC"})).content[0].text == "12:00 UTC"
        assert (await client.call_tool("trigger_poison", {})).content[0].text == "poisoned"
        held = await client.call_tool("get_time", {"zone": "UTC"})
        assert held.is_error
        decision = held.meta["dharma.gateway/decision"]
        assert decision["error_code"] == "approval_timeout" and "mcp-hold-changed-tool" in decision["rules"]
        pins = await anyio.to_thread.run_sync(dharma, state, "tools", "pins", "--changed")
        assert "finding: credential_request" in pins and f"dharma tools accept {BACKEND} get_time" in pins
        await anyio.to_thread.run_sync(dharma, state, "tools", "accept", BACKEND, "get_time")
        relisted = {t.name: t for t in (await client.list_tools()).tools}
        assert "aws/credentials" in (relisted["get_time"].description or "")
        assert (await client.call_tool("get_time", {"zone": "UTC"})).content[0].text == "12:00 UTC"
    assert backend_calls(tmp_path).count("get_time") == 2


async def test_accepting_a_poisoned_definition_makes_it_visible(tmp_path: Path, state: Path) -> None:
    async with Client(client_params(tmp_path, state), mode="legacy") as client:
        assert "get_sum" not in {t.name for t in (await client.list_tools()).tools}
        pins = await anyio.to_thread.run_sync(dharma, state, "tools", "pins")
        assert "finding: hidden_instruction at description" in pins and "hidden by the shipped rules until accepted" in pins
        said = await anyio.to_thread.run_sync(dharma, state, "tools", "accept", BACKEND, "get_sum")
        assert "findings included" in said
        assert "get_sum" in {t.name for t in (await client.list_tools()).tools}
        assert (await client.call_tool("get_sum", {"a": 1, "b": 2})).content[0].text == "3"
    rows = [json.loads(line) for line in (await anyio.to_thread.run_sync(dharma, state, "tools", "pins", "--json")).splitlines()]
    assert next(r for r in rows if r["tool"] == "get_sum")["accepted"] is True
