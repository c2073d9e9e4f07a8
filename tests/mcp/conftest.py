"""Fixtures for the MCP tests: the real npm servers (installed once into a cache directory),
our own SDK-built test server, a small test profile, and `dharma stdio` launched as the agent
would launch it (a subprocess speaking JSON-RPC lines), driven either by the official `mcp`
SDK client or by raw lines for the attack and bad-input cases."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from tests.conftest import CONFORMANCE

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TEST_SERVER = Path(__file__).resolve().parent / "servers" / "py_server.py"
CACHE = Path(os.environ.get("DHARMA_TEST_CACHE") or Path.home() / ".cache" / "dharma-test") / "npm"
NPM_PACKAGES = {
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
}

TEST_PROFILE = """\
apiVersion: dharma/v1
kind: Policy
metadata: {name: mcp-test}
principals:
  - {id: local, local_user: "*", tier: agent}
tiers:
  - name: agent
    grants:
      - tools: ["echo", "get_*", "write_*", "slow", "crash", "big", "trigger_*"]
circuit_breaker: {failure_threshold: 3, reset_seconds: 60}
backend_timeout_seconds: %(timeout)s
sanitizer: {max_bytes: 4194304, max_string: 4194304}
rule_sets: [rules.yaml, disclosure.yaml, %(mcp_rules)s]
"""

TEST_RULES = """\
apiVersion: dharma/v1
kind: RuleSet
metadata: {name: mcp-test-rules}
rules:
  - id: notes-no-traversal
    tools: ["write_note"]
    when: 'has(args.path) && args.path.contains("..")'
    effect: deny
    message_expr: '"path leaves the notes folder: " + args.path'
  - id: notes-important-needs-approval
    tools: ["write_note"]
    when: 'has(args.path) && args.path.startsWith("important/")'
    effect: require_approval
    message: writing an important note
"""

TEST_DISCLOSURE = """\
apiVersion: dharma/v1
kind: DisclosureRuleSet
metadata: {name: mcp-test-disclosure}
rules:
  - id: report-redact-secret
    tools: ["get_report"]
    verdict: REDACT
    redact: ["$.structuredContent.secret"]
"""


def _installed(name: str, version: str) -> bool:
    try:
        meta = json.loads((CACHE / "node_modules" / name / "package.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("version") == version


def npm_install(packages: dict[str, str], what: str) -> Path:
    """Install npm `packages` ({name: pinned version}) once into the test cache; the `node` to run them with."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if not npm or not node:
        pytest.skip(f"npm/node are not installed: cannot install {what}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(_installed(n, v) for n, v in packages.items()):
            specs = [f"{n}@{v}" for n, v in packages.items()]
            done = subprocess.run(
                [npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund", *specs],
                capture_output=True, text=True, timeout=600,
            )
            if done.returncode != 0:
                pytest.fail(f"npm install failed:\n{done.stderr[-2000:]}")
    return Path(node)


@pytest.fixture(scope="session")
def npm_servers() -> dict[str, Path]:
    """server-everything and server-filesystem at pinned versions, installed once into the cache."""
    node = npm_install(NPM_PACKAGES, "the reference MCP servers")
    base = CACHE / "node_modules" / "@modelcontextprotocol"
    return {
        "node": node,
        "everything": base / "server-everything" / "dist" / "index.js",
        "filesystem": base / "server-filesystem" / "dist" / "index.js",
    }


def write_mcp_policy(folder: Path, *, timeout: float = 1.5, elicitation: bool = False) -> Path:
    """The small MCP test profile (agent tier; admin_* hidden; approval and redaction rules) in `folder`;
    `elicitation` opts in to the caller releasing its own held calls by answering the gateway's form."""
    folder.mkdir()
    (folder / "rules.yaml").write_text(TEST_RULES)
    (folder / "disclosure.yaml").write_text(TEST_DISCLOSURE)
    path = folder / "profile.yaml"
    text = TEST_PROFILE % {"timeout": timeout, "mcp_rules": REPO / "rules" / "mcp.yaml"}
    path.write_text(text + ("approval: {allow_elicitation: true}\n" if elicitation else ""))
    return path


@pytest.fixture
def mcp_policy(tmp_path: Path) -> Path:
    return write_mcp_policy(tmp_path / "policy")


@pytest.fixture
def elicitation_policy(tmp_path: Path) -> Path:
    """The MCP test profile with `approval.allow_elicitation: true` (the explicit opt-in)."""
    return write_mcp_policy(tmp_path / "policy-elicit", elicitation=True)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    root.mkdir()
    return root


def gateway_command(state: Path, policy: Path, server: list[str], *extra: str) -> list[str]:
    return [PY, "-m", "gateway", "--state-root", str(state), "stdio", "--policy", str(policy), *extra, "--", *server]


def test_server_command() -> list[str]:
    return [PY, str(TEST_SERVER)]


test_server_command.__test__ = False  # type: ignore[attr-defined]


def gateway_env(tmp_path: Path) -> dict[str, str]:
    return {"MCP_TEST_CALL_LOG": str(tmp_path / "calls.log"), "PYTHONPATH": str(REPO)}


def backend_calls(tmp_path: Path) -> list[str]:
    try:
        return (tmp_path / "calls.log").read_text().split()
    except FileNotFoundError:
        return []


def ledger_records(state: Path) -> list[dict[str, Any]]:
    from audit.query import query_records
    from audit.sqlite import SqliteLedgerReader

    with SqliteLedgerReader(state / "ledger.db") as reader:
        return [r if isinstance(r, dict) else r.entry for r in query_records(reader)]


class RawGateway:
    """`dharma stdio` as a subprocess, spoken to in raw JSON-RPC lines."""

    def __init__(self, proc: anyio.abc.Process) -> None:
        self.proc = proc
        self._buffer = b""
        self.seen: list[Any] = []

    async def send(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode()
        assert self.proc.stdin is not None
        await self.proc.stdin.send(data + b"\n")

    async def recv(self, timeout: float = 15) -> Any:
        assert self.proc.stdout is not None
        with anyio.fail_after(timeout):
            while b"\n" not in self._buffer:
                self._buffer += await self.proc.stdout.receive(1 << 20)
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        self.seen.append(message)
        return message

    async def response(self, rpc_id: Any, timeout: float = 15) -> Any:
        """The next response to `rpc_id` (notifications and other traffic are kept in `seen`)."""
        while True:
            message = await self.recv(timeout)
            if isinstance(message, dict) and message.get("id") == rpc_id and "method" not in message:
                return message
            if isinstance(message, list):
                return message

    async def initialize(self, version: str = "2025-11-25", capabilities: dict[str, Any] | None = None) -> Any:
        await self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": capabilities or {},
            "clientInfo": {"name": "raw-test", "version": "0"}}})
        answer = await self.response("init")
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    async def call(self, rpc_id: Any, name: str, arguments: Any = None, **params: Any) -> Any:
        body: dict[str, Any] = {"name": name, **params}
        if arguments is not None:
            body["arguments"] = arguments
        await self.send({"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": body})
        return await self.response(rpc_id)


@pytest.fixture
async def raw_gateway(tmp_path: Path, state: Path, mcp_policy: Path) -> AsyncIterator[Any]:
    """Start `dharma stdio` around the test server (or `server=`), yield a RawGateway; stop it."""
    started: list[anyio.abc.Process] = []

    async def start(*extra: str, policy: Path | None = None, server: list[str] | None = None) -> RawGateway:
        command = gateway_command(state, policy or mcp_policy, server or test_server_command(), *extra)
        log = open(tmp_path / f"gateway{len(started)}.log", "wb")
        proc = await anyio.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                        cwd=str(REPO), env={**os.environ, **gateway_env(tmp_path)})
        started.append(proc)
        return RawGateway(proc)

    yield start
    for proc in started:
        if proc.stdin is not None:
            await proc.stdin.aclose()
        with anyio.move_on_after(5):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path
