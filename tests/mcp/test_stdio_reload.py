"""`dharma stdio` reloads its policy without a restart: on a rule-file edit and on SIGHUP, each
attempt a ledger record; the waits are for those records and the gateway's log line, never fixed
sleeps."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio

from audit.query import query_records
from audit.sqlite import SqliteLedgerReader
from gateway.policy.compile import load_policy
from tests.mcp.conftest import TEST_RULES

DENY_ECHO = """\
  - id: no-echo-today
    tools: ["echo"]
    effect: deny
    message: echo is switched off
"""


def reloads(state: Path) -> list[dict[str, Any]]:
    path = state / "ledger.db"
    if not path.exists():
        return []
    with SqliteLedgerReader(path) as reader:
        return list(query_records(reader, kind="reload"))


async def wait_for_reload(state: Path, count: int) -> dict[str, Any]:
    with anyio.fail_after(60):
        while len(found := reloads(state)) < count:
            await anyio.sleep(0.05)
    return found[-1]


async def wait_for_serving(log: Path, version: str) -> None:
    """Until the gateway logs that it serves `version`: a reload is in the ledger before it takes
    effect (gateway.reload), so the record alone does not say the new policy answers calls yet."""
    with anyio.fail_after(60):
        while not any(line.get("event") == "policy.reloaded" and line.get("version") == version
                      for line in map(json.loads, (x for x in log.read_text().splitlines() if x.startswith("{")))):
            await anyio.sleep(0.05)


async def test_stdio_reloads_on_file_change_and_sighup(raw_gateway: Any, mcp_policy: Path, state: Path, tmp_path: Path) -> None:
    gw = await raw_gateway()
    await gw.initialize()
    first = await gw.call(1, "echo", {"text": "hi"})
    assert not first["result"].get("isError"), first
    v1 = load_policy(mcp_policy).version

    staged = mcp_policy.parent / ".rules.tmp"
    staged.write_text(TEST_RULES + DENY_ECHO)
    os.replace(staged, mcp_policy.parent / "rules.yaml")  # saved as editors save: never half a file
    v2 = load_policy(mcp_policy).version
    record = await wait_for_reload(state, 1)
    assert (record["trigger"], record["ok"], record["old_version"], record["new_version"]) == ("file", True, v1, v2)
    await wait_for_serving(tmp_path / "gateway0.log", v2)
    refused = await gw.call(2, "echo", {"text": "hi"})
    assert refused["result"]["isError"] and "policy_blocked" in json.dumps(refused), refused

    gw.proc.send_signal(signal.SIGHUP)
    record = await wait_for_reload(state, 2)
    assert (record["trigger"], record["ok"], record["changed"], record["policy_version"]) == ("signal", True, False, v2)
    again = await gw.call(3, "echo", {"text": "hi"})
    assert again["result"]["isError"], "still v2 after a reload of the same files"
