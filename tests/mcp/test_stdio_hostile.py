"""Hostile lines against a real `dharma stdio` (issue 12): after every one of them a `ping` is
answered, the process is still running, and no refused tool reached the server.

The lines are the fixed corpus of tests/fuzz/strategies.py (one per kind of damage, the two
one-line kills first) and seeded mutations of admin_reset calls; `admin_reset` is hidden from the
test principal, so the server's call log must never show it.
"""

from __future__ import annotations

from pathlib import Path

from tests.fuzz.strategies import HOSTILE_LINES, seeded_mutations
from tests.mcp.conftest import backend_calls, ledger_records

#: Lines that must be answered with a JSON-RPC error at this id (null: the id cannot be echoed).
EXPECTED_ERRORS = {
    "deep-array": (None, -32700, "nest deeper than 128 levels"),
    "deep-params": (None, -32700, "(the limit)"),
    "surrogate-id": (None, -32600, "lone surrogate"),
    "surrogate-id-call": (None, -32600, "lone surrogate"),
    "surrogate-argument": (2, -32600, "lone surrogate"),
    "duplicate-in-batch": (None, -32600, "duplicate key"),
    "float-overflow": (None, -32700, "range of a double"),
    "huge-integer-id": (None, -32700, "4300 digits"),
    "bom": (None, -32700, "byte order mark"),
}


async def test_every_hostile_line_is_survived_and_no_refused_tool_runs(raw_gateway, tmp_path: Path, state: Path) -> None:
    gw = await raw_gateway("--max-message-bytes", "4000000")
    await gw.initialize()
    lines = list(HOSTILE_LINES.items()) + [(f"mutation-{i}", line) for i, line in enumerate(seeded_mutations(40))]
    for n, (label, line) in enumerate(lines):
        await gw.send(line)
        if label in EXPECTED_ERRORS:
            rpc_id, code, words = EXPECTED_ERRORS[label]
            while not _is_error(await gw.recv(), rpc_id, code, words):
                pass  # answers to earlier lines may still be arriving (refusals are recorded first)
        await gw.send({"jsonrpc": "2.0", "id": f"ping-{n}", "method": "ping"})
        assert (await gw.response(f"ping-{n}")).get("result") == {}, label
        assert gw.proc.returncode is None, label
    ok = await gw.call("last", "echo", {"text": "still here"})
    assert ok["result"]["content"][0]["text"] == "echo: still here"
    assert "admin_reset" not in backend_calls(tmp_path)
    refused = [r for r in ledger_records(state) if r.get("status") == "blocked"]
    assert len(refused) >= len(EXPECTED_ERRORS)  # every refusal is on the record



def _is_error(message: object, rpc_id: object, code: int, words: str) -> bool:
    return (isinstance(message, dict) and "error" in message and message.get("id") == rpc_id
            and message["error"]["code"] == code and words in message["error"]["message"])
