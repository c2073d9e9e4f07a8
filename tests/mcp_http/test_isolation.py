"""No exception from handling one message ends a connection: a failure injected into each handler
of `dharma stdio` and of `/mcp` is answered -32603 (with the request's id) and the next message on
the same connection is served."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.config import load_settings
from gateway.stores.file_pins import FilePinStore
from gateway.runtime import open_gateway
from gateway.transports.mcp_http.relay import Relay
from gateway.transports.mcp_http.tools import HttpTools
from gateway.transports.mcp_stdio.pipes import ClientPipes
from gateway.transports.mcp_stdio.proxy import StdioProxy
from tests.mcp.conftest import REPO, test_server_command, write_mcp_policy
from tests.mcp_http.conftest import serve_gateway, upstream
from tests.mcp_http.raw import Raw, answer, messages


class Injected(RuntimeError):
    """The failure the tests inject."""


def fail_once(real: Any, when: Any = lambda *a, **k: True) -> Any:
    """`real`, except that the first call for which `when(*args)` holds raises `Injected`."""
    state = {"armed": True}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if state["armed"] and when(*args, **kwargs):
            state["armed"] = False
            raise Injected("injected by the test")
        return real(*args, **kwargs)

    return wrapper


class PipeClient:
    """The agent's end of two OS pipes to an in-process `StdioProxy`."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""

    async def send(self, message: dict[str, Any]) -> None:
        await anyio.to_thread.run_sync(os.write, self.write_fd, json.dumps(message).encode() + b"\n")

    async def answer(self, rpc_id: Any) -> dict[str, Any]:
        with anyio.fail_after(30):
            while True:
                while b"\n" not in self.buffer:
                    chunk = await anyio.to_thread.run_sync(os.read, self.read_fd, 1 << 16)
                    assert chunk, "the proxy closed its stdout"
                    self.buffer += chunk
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == rpc_id and "method" not in message:
                    return message  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def stdio_proxy(tmp_path: Path) -> AsyncIterator[tuple[StdioProxy, PipeClient]]:
    """An in-process `StdioProxy` around the SDK test server, initialized, with its agent's pipe ends."""
    policy = write_mcp_policy(tmp_path / "policy", timeout=10)
    settings = load_settings(None, env={}, overrides={"policy": str(policy), "state_root": str(tmp_path / "state")})
    gateway = await open_gateway(settings)
    proxy = StdioProxy(gateway, test_server_command(), pins=FilePinStore(settings.state_dir), env={"PYTHONPATH": str(REPO)})
    to_proxy_r, to_proxy_w = os.pipe()
    from_proxy_r, from_proxy_w = os.pipe()
    pipes = ClientPipes(stdin=open(to_proxy_r, "rb", buffering=0), stdout=open(from_proxy_w, "wb", buffering=0))
    await pipes.open()
    client = PipeClient(to_proxy_w, from_proxy_r)
    async with anyio.create_task_group() as tg:
        tg.start_soon(proxy.run, pipes)
        await client.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
            }
        )
        assert "result" in await client.answer(0)
        await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        try:
            yield proxy, client
        finally:
            os.close(to_proxy_w)  # end of input: the proxy stops its server and returns
    await gateway.aclose()
    os.close(from_proxy_r)


async def _ping_works(client: PipeClient, rpc_id: str) -> None:
    await client.send({"jsonrpc": "2.0", "id": rpc_id, "method": "ping"})
    assert (await client.answer(rpc_id)).get("result") == {}


async def test_stdio_client_handler_failure_is_answered_and_the_pump_goes_on(tmp_path: Path) -> None:
    async with stdio_proxy(tmp_path) as (proxy, client):
        proxy.session.from_client = fail_once(proxy.session.from_client, lambda line: b'"boom"' in line)
        await client.send({"jsonrpc": "2.0", "id": "boom", "method": "ping"})
        failed = await client.answer("boom")
        assert failed["error"]["code"] == -32603
        await _ping_works(client, "after")


async def test_stdio_call_handler_failure_is_answered_and_the_pump_goes_on(tmp_path: Path) -> None:
    async with stdio_proxy(tmp_path) as (proxy, client):
        proxy.calls.gateway.govern = fail_once(proxy.calls.gateway.govern)
        await client.send(
            {"jsonrpc": "2.0", "id": "call", "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}
        )
        failed = await client.answer("call")
        assert failed["error"]["code"] == -32603
        await client.send(
            {"jsonrpc": "2.0", "id": "again", "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "y"}}}
        )
        assert (await client.answer("again"))["result"]["content"][0]["text"] == "echo: y"


async def test_stdio_server_handler_failure_loses_one_message_not_the_connection(tmp_path: Path) -> None:
    async with stdio_proxy(tmp_path) as (proxy, client):
        proxy.session.from_server = fail_once(proxy.session.from_server, lambda line: b'"lost"' in line)
        await client.send({"jsonrpc": "2.0", "id": "lost", "method": "ping"})
        await _ping_works(client, "after")  # answered, though the answer to "lost" was dropped


@pytest.mark.parametrize(
    ("owner", "handler", "method", "params"),
    [
        (HttpTools, "tools_list", "tools/list", {}),
        (HttpTools, "tools_call", "tools/call", {"name": "echo", "arguments": {"text": "x"}}),
        (Relay, "relay", "ping", {}),
    ],
)
async def test_http_handler_failure_is_answered_and_the_session_goes_on(
    tmp: Path, toy_url: str, monkeypatch: pytest.MonkeyPatch, owner: type, handler: str, method: str, params: dict[str, Any]
) -> None:
    async with serve_gateway(tmp, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as raw:
            await raw.initialize()
            monkeypatch.setattr(owner, handler, fail_once(getattr(owner, handler)))
            failed = await raw.post({"jsonrpc": "2.0", "id": 41, "method": method, "params": params})
            assert failed.status_code == 500
            assert [m["error"]["code"] for m in messages(failed) if m.get("id") == 41] == [-32603]
            after = await raw.post({"jsonrpc": "2.0", "id": 42, "method": "ping"})
            assert answer(after) == {"jsonrpc": "2.0", "id": 42, "result": {}}
