"""Safe defaults: no published credential outside the demo, `dharma serve` refuses to start
without a named policy, says once what it serves when it starts, and `/v1/tools` says where
MCP upstreams' tools are."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.policy.compile import load_policy
from tests.conftest import REPO, key_digest
from tests.mcp_http.conftest import free_port

DEMO_KEYS = ("demo-reader-key", "demo-operator-key", "demo-clinician-key", "demo-admin-key")
DEMO_PROFILE = REPO / "examples" / "policies" / "demo.yaml"
#: Where the README shows the demo (its keys are part of the example there).
README_EXAMPLE_SECTIONS = ("Quickstart", "From Python")


def _needles() -> dict[str, str]:
    found = {key: key for key in DEMO_KEYS}
    found.update({key_digest(key): f"sha256({key})" for key in DEMO_KEYS})
    return found


def _published_in(text: str) -> list[str]:
    lowered = text.lower()
    return [what for needle, what in _needles().items() if needle in lowered]


def _readme_outside_examples() -> str:
    sections = re.split(r"^(?=## )", (REPO / "README.md").read_text(encoding="utf-8"), flags=re.M)
    return "".join(s for s in sections if not s.startswith(tuple(f"## {name}\n" for name in README_EXAMPLE_SECTIONS)))


def test_no_published_demo_credential_outside_the_demo() -> None:
    """The demo keys (or their digests) would make anyone admin of a server using the file."""
    assert all(d in DEMO_PROFILE.read_text() for d in (key_digest(k) for k in DEMO_KEYS))  # the scan looks for the right strings
    files = [REPO / name for name in ("Makefile", "pyproject.toml")]
    for folder in ("policies", "rules", "gateway", "audit", "docs", "bench"):
        files.extend(p for p in (REPO / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".md", ".toml", ".json"))
    assert len(files) > 50
    leaks = {str(p.relative_to(REPO)): found for p in files if (found := _published_in(p.read_text(encoding="utf-8")))}
    readme = _readme_outside_examples()
    assert "## Configuration" in readme and "## Quickstart" not in readme
    if found := _published_in(readme):
        leaks["README.md outside the example sections"] = found
    assert leaks == {}


def test_shipped_profiles_hold_no_api_keys() -> None:
    for profile in sorted((REPO / "policies").glob("*.yaml")):
        policy = load_policy(profile)
        assert [p.id for p in policy.principals if p.key_digests] == [], profile.name
        assert all(p.local_user for p in policy.principals), profile.name  # only the local user of `dharma stdio`


def _env(state_root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
    return {**env, "DHARMA_STATE_ROOT": str(state_root), **extra}


def test_serve_without_a_policy_refuses_to_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", str(free_port())], cwd=tmp_path,
                         env=_env(state), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "no policy named, so `dharma serve` refuses to start" in run.stderr
    assert "--policy FILE" in run.stderr and "DHARMA_POLICY" in run.stderr and "examples/policies/demo.yaml" in run.stderr
    assert "Traceback" not in run.stderr
    assert not state.exists()  # refused before any key, ledger or approval store was created
    config = tmp_path / "dharma.yaml"
    config.write_text("server: {port: 1}\n")  # a config that names no policy is refused too
    run = subprocess.run([sys.executable, "-m", "gateway", "--config", str(config), "serve"], cwd=tmp_path,
                         env=_env(state), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no policy named" in run.stderr


def _events(lines: list[str], name: str) -> list[dict[str, Any]]:
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found.append(event)
    return found


def test_serve_prints_one_banner_and_v1_tools_names_the_mcp_endpoint(tmp_path: Path) -> None:
    """The real server, the demo's python and MCP upstreams: the banner names the address, the
    policy and version, and each upstream with its tool count; /v1/tools says MCP tools are at /mcp."""
    from examples.demo_backend import backend

    port = free_port()
    config = tmp_path / "dharma.yaml"
    config.write_text(yaml.safe_dump({
        "policy": str(DEMO_PROFILE),
        "python_path": [str(REPO)],
        "log_level": "info",
        "upstreams": [
            {"id": "demo", "type": "python", "target": "examples.demo_backend:backend"},
            {"id": "demo-mcp", "type": "mcp_stdio", "command": sys.executable, "args": ["-m", "examples.demo_mcp_server"],
             "env": {"PYTHONPATH": str(REPO)}},
        ],
    }))
    env = _env(tmp_path / "state", DHARMA_DEMO_SANDBOX=str(tmp_path / "sandbox"))
    server = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config), "serve", "--port", str(port)],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    reader = threading.Thread(target=lambda: [lines.put(line) for line in server.stderr or ()], daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120  # generous: the banner waits for the MCP upstream to list its tools
        while not _events(seen[-1:], "dharma.serving"):
            assert server.poll() is None, "".join(seen)
            seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
        [banner] = _events(seen, "dharma.serving")
        listing = httpx.get(f"http://127.0.0.1:{port}/v1/tools", headers={"X-API-Key": "demo-reader-key"}, timeout=30).json()
        mcp_tools = _mcp_tool_count(f"http://127.0.0.1:{port}/mcp", {"X-API-Key": "demo-admin-key"})
    finally:
        server.terminate()
        server.wait(timeout=30)
        reader.join(timeout=30)  # every line the server wrote, to count the banners
    while not lines.empty():
        seen.append(lines.get())
    policy = load_policy(DEMO_PROFILE)
    assert banner["listen"] == [f"http://127.0.0.1:{port}"]
    assert (banner["policy"], banner["policy_version"], banner["policy_file"]) == ("demo", policy.version, str(DEMO_PROFILE))
    assert banner["upstreams"] == [
        {"id": "demo", "type": "python", "tools": len(backend("demo").tools()), "served_at": "/v1/tools"},
        {"id": "demo-mcp", "type": "mcp_stdio", "tools": mcp_tools, "served_at": "/mcp"},
    ]
    assert mcp_tools > 0
    assert len(_events(seen, "dharma.serving")) == 1  # once, not per request or per session
    assert listing["mcp"]["endpoint"] == "/mcp" and listing["mcp"]["upstreams"] == ["demo-mcp"]
    assert "/v1 serves python and http upstreams only" in listing["mcp"]["note"]
    assert {t["name"] for t in listing["tools"]} == {"read_file", "list_directory", "search"}  # the reader's python tools


def _mcp_tool_count(url: str, headers: dict[str, str]) -> int:
    """Every tool the admin sees over /mcp (the admin tier grants `*`), with the official SDK client."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def count() -> int:
        async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))) as client:
            return len((await client.list_tools()).tools)

    return anyio.run(count)


async def test_banner_reports_an_upstream_it_could_not_count_instead_of_failing(tmp_path: Path) -> None:
    """A missing command or a refused connection is named in the banner; serving goes on."""
    from gateway.config import UpstreamConfig
    from gateway.runtime import count_mcp_tools

    counts = await count_mcp_tools([
        UpstreamConfig(id="gone", type="mcp_stdio", command=str(tmp_path / "no-such-server")),
        UpstreamConfig(id="down", type="mcp_http", url=f"http://127.0.0.1:{free_port()}/mcp"),
    ])
    assert counts["gone"].startswith("unknown: FileNotFoundError")
    assert counts["down"].startswith("unknown: ConnectError")
