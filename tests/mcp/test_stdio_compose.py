"""A profile that extends a shipped one and declares its own local principal (issue 25, deliver
1): through `dharma stdio` in front of server-everything (pinned, from npm), driven by the official
SDK client, the nearest profile's principal wins: `{id: me, local_user: "*", tier: admin}` over
`policies/standard.yaml` sees the tools only admin is granted (`echo`), where standard alone (its
`local`, tier operator) sees the `get_*` ones but not those."""

from __future__ import annotations

from pathlib import Path

from mcp import Client, StdioServerParameters

from tests.mcp.conftest import REPO, gateway_command, gateway_env, ledger_records

STANDARD = REPO / "policies" / "standard.yaml"


async def listed_and_called(tmp_path: Path, state: Path, policy: Path, server: list[str]) -> tuple[set[str], object]:
    """The tool names `dharma stdio --policy policy` lists, and the result of calling echo through it."""
    command = gateway_command(state, policy, server)
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(REPO), env=gateway_env(tmp_path))
    async with Client(params) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        result = await client.call_tool("echo", {"message": "composed"})
    return names, result


async def test_the_extending_profiles_local_principal_wins_over_stdio(npm_servers, tmp_path: Path, state: Path) -> None:
    server = [str(npm_servers["node"]), str(npm_servers["everything"]), "stdio"]
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"apiVersion: dharma/v1\nkind: Policy\nmetadata: {{name: mine}}\nextends: {STANDARD}\n"
                    "principals:\n  - {id: me, local_user: \"*\", tier: admin}\n")
    names, result = await listed_and_called(tmp_path, state, mine, server)
    assert {"echo", "get-sum", "get-tiny-image"} <= names, names
    assert not result.is_error and "composed" in result.content[0].text  # type: ignore[attr-defined]
    called = [r for r in ledger_records(state) if r["tool"] == "echo" and r.get("kind") != "decision"]
    assert called and called[-1]["principal"] == "me", called
    # The shipped profile alone resolves the same user to its `local` (operator): `get_*` admits the
    # kebab-case get-sum (folded names, docs/policy.md "Tool names"), nothing admits echo.
    other = tmp_path / "other-state"
    other.mkdir()
    names, result = await listed_and_called(tmp_path, other, STANDARD, server)
    assert "get-sum" in names and "echo" not in names, names
    assert result.is_error  # type: ignore[attr-defined]
