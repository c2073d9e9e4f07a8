"""Fixtures for MCP over HTTP: real upstream servers (the toy server and the conformance fixture,
both built on the official `mcp` SDK; server-everything from npm), `dharma serve`'s app under
uvicorn on a free port, and the official SDK client pointed at it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.conftest import CONFORMANCE, REPO, key_digest

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
CACHE = Path(os.environ.get("DHARMA_TEST_CACHE", Path.home() / ".cache" / "dharma-test"))
EVERYTHING_VERSION = "2026.8.31"

KEYS = {"alice": "alice-key", "admin": "admin-key", "approver": "approver-key"}

PROFILE: dict[str, Any] = {
    "apiVersion": "dharma/v1",
    "kind": "Policy",
    "metadata": {"name": "mcp-http-test"},
    "principals": [
        {"id": "alice", "api_key_sha256": key_digest(KEYS["alice"]), "tier": "user"},
        {"id": "admin", "api_key_sha256": key_digest(KEYS["admin"]), "tier": "admin", "roles": ["admin"]},
        {"id": "approver", "api_key_sha256": key_digest(KEYS["approver"]), "tier": "user", "roles": ["approver"]},
    ],
    "tiers": [
        {"name": "user", "grants": [{"tools": ["echo", "read_*", "delete_*", "slow", "hang", "crash", "run_query",
                                               "fs_echo", "fs_read_*", "ev_echo", "test_*"]}]},
        {"name": "admin", "grants": [{"tools": ["*"]}]},
    ],
    "backend_timeout_seconds": 3.0,
    "circuit_breaker": {"failure_threshold": 2, "reset_seconds": 30},
    "rule_sets": ["rules.yaml", str(REPO / "rules" / "secrets.yaml")],
}

RULES: dict[str, Any] = {
    "apiVersion": "dharma/v1",
    "kind": "RuleSet",
    "metadata": {"name": "mcp-http-test-rules"},
    "rules": [
        {"id": "confirm-delete", "description": "Deleting needs a human.", "tools": ["delete_*"],
         "effect": "require_approval", "message": "deleting a file"},
        {"id": "no-etc", "description": "No /etc.", "tools": ["echo"],
         "when": 'has(args.message) && args.message.startsWith("/etc")', "effect": "deny", "message": "no /etc paths"},
    ],
}


def write_profile(directory: Path, **overrides: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rules.yaml").write_text(yaml.safe_dump(RULES, sort_keys=False), encoding="utf-8")
    doc = {**PROFILE, **overrides}
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def spawn(cmd: list[str], url_file: Path, *, env: dict[str, str] | None = None, timeout: float = 30.0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start a server process that writes its URL to `url_file`; stop its process group after."""
    url_file.unlink(missing_ok=True)
    log = open(url_file.with_suffix(".log"), "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not (url_file.exists() and url_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[:3]} did not start: {url_file.with_suffix('.log').read_text()[-2000:]}")
            time.sleep(0.05)
        yield url_file.read_text().strip(), proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def toy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("toy")
    with spawn([PYTHON, str(HERE / "toy_server.py"), "--url-file", str(d / "url")], d / "url") as (url, _):
        yield url


@contextlib.contextmanager
def toy_server(directory: Path, *options: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A private toy server (for tests that kill it, or run it with `options` such as --no-delete)."""
    with spawn([PYTHON, str(HERE / "toy_server.py"), "--url-file", str(directory / "toy.url"), *options],
               directory / "toy.url") as pair:
        yield pair


@pytest.fixture(scope="session")
def fixture_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = CONFORMANCE / "fixture_server.py"
    if not script.exists():
        pytest.skip(f"the conformance fixture is not at {script} (../shared/conformance)")
    d = tmp_path_factory.mktemp("fixture")
    with spawn([PYTHON, str(script), "--port", "0", "--url-file", str(d / "url")], d / "url") as (url, _):
        yield url


def everything_script() -> Path:
    """server-everything @EVERYTHING_VERSION, installed once into the test cache with npm (used
    only when tests/mcp/conftest.py, which installs the same pinned packages, is absent)."""
    prefix = CACHE / "npm"
    script = prefix / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    pkg = script.parent.parent / "package.json"
    if script.exists() and pkg.exists() and f'"version": "{EVERYTHING_VERSION}"' in pkg.read_text():
        return script
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("node/npm are not installed: cannot run @modelcontextprotocol/server-everything")
    prefix.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                           f"@modelcontextprotocol/server-everything@{EVERYTHING_VERSION}"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not script.exists():
        pytest.skip(f"npm install of server-everything failed: {done.stderr[-500:]}")
    return script


LOOPBACK_CJS = """
const net = require('net'); const http = require('http');
const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' && (args.length === 1 || typeof args[1] === 'function')) args.splice(1, 0, '127.0.0.1');
  return listen.apply(this, args);
};
"""


try:  # reuse the stdio tests' installer (one npm cache, one lock) when it is there
    from tests.mcp.conftest import npm_servers  # noqa: F401  (a fixture, registered by import)
except ImportError:  # pragma: no cover
    @pytest.fixture(scope="session")
    def npm_servers() -> dict[str, Path]:
        return {"everything": everything_script()}


@pytest.fixture(scope="session")
def everything_url(tmp_path_factory: pytest.TempPathFactory, npm_servers: dict[str, Path]) -> Iterator[str]:
    script = npm_servers["everything"]
    d = tmp_path_factory.mktemp("everything")
    (d / "loopback.cjs").write_text(LOOPBACK_CJS)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    wrapper = d / "run.sh"
    wrapper.write_text(f'#!/bin/sh\nPORT={port} node --require {d / "loopback.cjs"} {script} streamableHttp &\n'
                       f'pid=$!\nfor i in $(seq 200); do (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.05; done\n'
                       f'echo {url} > {d / "url"}\nwait $pid\n')
    with spawn(["bash", str(wrapper)], d / "url") as (found, _):
        yield found


@contextlib.asynccontextmanager
async def serve_gateway(tmp: Path, upstreams: list[dict[str, Any]], policy: Path | None = None,
                        config: dict[str, Any] | None = None, **mcp: Any) -> AsyncIterator[Any]:
    """`dharma serve`'s app (open_gateway + build_app) under uvicorn on a free port; `config` adds
    top-level settings (`tracing`, ...), `mcp` the `mcp:` section's.

    Yields an object with `.url` (the /mcp endpoint), `.base` and `.gateway`.
    """
    from gateway.cli.serve import http_protocol
    from gateway.config import load_settings
    from gateway.runtime import open_gateway
    from gateway.transports.http_api.app import build_app

    policy = policy or write_profile(tmp / "policy")
    overrides = {"policy": str(policy), "state_root": str(tmp / "state"), "upstreams": upstreams,
                 "mcp": {"hold_seconds": 5, "progress_interval": 0.2, **mcp}, **(config or {})}
    settings = load_settings(None, env={}, overrides=overrides)
    gateway = await open_gateway(settings)
    app = build_app(gateway, max_body_bytes=settings.server.max_body_bytes)

    class Served:
        pass

    served = Served()
    served.gateway = gateway  # type: ignore[attr-defined]
    try:
        async with serve_asgi(app, http=http_protocol()) as base:  # the HTTP protocol `dharma serve` runs
            served.base = base  # type: ignore[attr-defined]
            served.url = base + "/mcp"  # type: ignore[attr-defined]
            yield served
    finally:
        await gateway.aclose()


@contextlib.asynccontextmanager
async def serve_asgi(app: Any, http: Any = "auto", **config: Any) -> AsyncIterator[str]:
    """Serve an ASGI app under uvicorn (`http`: its HTTP protocol, `config`: more of uvicorn's
    settings) on a free loopback port while the block runs; yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1,
                                           http=http, **config))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        while not server.started:
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


def client(url: str, key: str | None = "alice-key", **kwargs: Any) -> Any:
    """The official SDK client over Streamable HTTP, with an API key header."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"X-API-Key": key} if key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0))
    return Client(streamable_http_client(url, http_client=http), **kwargs)


async def call_raw(c: Any, name: str, arguments: dict[str, Any] | None = None) -> str:
    """A call's answer as text without its receipt (an error as its message): what two calls that
    must answer alike (a hidden tool and an unknown one) are compared by."""
    from mcp import MCPError

    from gateway.crypto.receipts import RECEIPT_META_KEY

    try:
        r = await c.call_tool(name, arguments or {})
    except MCPError as exc:
        return f"error {exc}"
    d = r.model_dump(mode="json", by_alias=True, exclude_none=True)
    d.get("_meta", {}).pop(RECEIPT_META_KEY, None)
    return repr(d)


def upstream(url: str, id: str = "toy", prefix: str = "") -> dict[str, Any]:
    return {"id": id, "type": "mcp_http", "url": url, "prefix": prefix}


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    return tmp_path


__all__ = ["tempfile"]
