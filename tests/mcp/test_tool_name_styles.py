"""Tool globs match real tool names whatever their style (issue 25): the shipped tiers' `get_*`
admit server-everything's kebab-case `get-sum`; a catalog where two tools fold to one name is
refused for both; `dharma tools grants` says which tiers see which pinned tools.

Real parts: `dharma stdio` launched as an agent launches it, the official SDK client, the pinned npm
server-everything and an SDK-built server with a clashing catalog, the shipped standard profile.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mcp import Client, StdioServerParameters

from tests.mcp.conftest import PY, REPO, backend_calls, gateway_command, gateway_env

CLASH_SERVER = Path(__file__).resolve().parent / "servers" / "clash_server.py"


def standard_as(tmp_path: Path, tier: str) -> Path:
    """The shipped standard profile, its rule sets by absolute path, the local user in `tier`."""
    text = (REPO / "policies" / "standard.yaml").read_text().replace("../rules/", str(REPO / "rules") + "/")
    marker = '    local_user: "*"            # whoever runs `dharma stdio` on this machine\n    tier: operator\n'
    assert marker in text
    profile = tmp_path / f"standard-{tier}.yaml"
    profile.write_text(text.replace(marker, marker.replace("tier: operator", f"tier: {tier}")))
    return profile


def grants(state: Path, profile: Path) -> dict[str, dict]:
    run = subprocess.run([PY, "-m", "gateway", "--state-root", str(state), "tools", "grants", "--policy", str(profile),
                          "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    return {row["tool"]: row for row in map(json.loads, run.stdout.splitlines())}


async def test_reader_sees_kebab_case_get_tools_of_server_everything(npm_servers, tmp_path: Path, state: Path) -> None:
    profile = standard_as(tmp_path, "reader")
    command = gateway_command(state, profile, [str(npm_servers["node"]), str(npm_servers["everything"]), "stdio"])
    server = StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))
    async with Client(server) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        result = await client.call_tool("get-sum", {"a": 2, "b": 40})
        hidden = await client.call_tool("trigger-long-running-operation", {"duration": 0.1, "steps": 1})
    assert {"get-sum", "get-tiny-image"} <= names  # `get_*` of the reader tier, folded
    assert "trigger-long-running-operation" not in names and "echo" not in names
    assert not result.is_error and "42" in json.dumps(result.model_dump(mode="json"))
    assert hidden.is_error
    rows = grants(state, profile)
    assert {"reader", "operator", "admin"} <= set(rows["get-sum"]["tiers"])
    assert rows["trigger-long-running-operation"]["tiers"] == ["admin"]
    assert rows["echo"]["tiers"] == ["admin"]


async def test_a_catalog_whose_names_fold_to_one_is_refused_for_both(tmp_path: Path, state: Path) -> None:
    profile = standard_as(tmp_path, "reader")
    command = gateway_command(state, profile, [PY, str(CLASH_SERVER)])
    server = StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))
    async with Client(server) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        snake = await client.call_tool("get_total", {"a": 5, "b": 3})
        kebab = await client.call_tool("get-total", {"a": 5, "b": 3})
        unknown = await client.call_tool("get-nothing", {})
        echo = await client.call_tool("get-echo", {"text": "hi"})
    assert names == {"get-echo"}
    assert snake.is_error and kebab.is_error and not echo.is_error
    text = lambda r: " ".join(c.text for c in r.content if getattr(c, "text", None))  # noqa: E731
    assert text(snake) == text(unknown).replace("get-nothing", "get_total")  # refused exactly like an unknown tool
    assert backend_calls(tmp_path) == ["get-echo"]
    rows = grants(state, profile)
    assert rows["get_total"]["tiers"] == [] and "get-total" in rows["get_total"]["note"]
    assert rows["get-echo"]["tiers"][:1] == ["reader"]
    run = subprocess.run([PY, "-m", "gateway", "--state-root", str(state), "tools", "grants", "--policy", str(profile)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "get_total" in run.stdout and "NO TIER" in run.stdout and "folds to one name" in run.stdout
