"""A raw Streamable HTTP client (httpx) for the attack and bad-input tests: exact bytes, exact headers."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}}


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON messages of an event stream, parsed as the SSE spec says: an event's `data:` lines
    (one leading space removed from each) joined with "\\n"."""
    out = []
    for block in text.split("\n\n"):
        data = [line[6:] if line.startswith("data: ") else line[5:] for line in block.splitlines() if line.startswith("data:")]
        if data and "".join(data).strip():
            out.append(json.loads("\n".join(data)))
    return out


def messages(response: httpx.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return sse_messages(response.text)
    if not response.content:
        return []
    body = response.json()
    return body if isinstance(body, list) else [body]


def answer(response: httpx.Response) -> dict[str, Any]:
    return [m for m in messages(response) if "result" in m or "error" in m][-1]


class Raw:
    def __init__(self, url: str, key: str = "alice-key") -> None:
        self.url = url
        self.http = httpx.AsyncClient(timeout=30, headers={"X-API-Key": key})
        self.sid: str | None = None
        self.version = LEGACY
        self.next_id = 100

    async def __aenter__(self) -> Raw:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"accept": "application/json, text/event-stream", "content-type": "application/json",
             "mcp-protocol-version": self.version}
        if self.sid:
            h["mcp-session-id"] = self.sid
        h.update(extra or {})
        return h

    async def post(self, body: bytes | str | dict[str, Any] | list[Any], headers: dict[str, str] | None = None) -> httpx.Response:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return await self.http.post(self.url, content=data, headers=self.headers(headers))

    async def initialize(self, version: str = LEGACY, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        self.version = version
        r = await self.http.post(self.url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": capabilities or {}, "clientInfo": {"name": "raw", "version": "0"}}},
            headers={"accept": "application/json, text/event-stream", "content-type": "application/json"})
        assert r.status_code == 200, r.text
        self.sid = r.headers.get("mcp-session-id")
        await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer(r)

    async def call(self, name: str, arguments: dict[str, Any] | None = None, **params: Any) -> httpx.Response:
        self.next_id += 1
        p: dict[str, Any] = {"name": name, "arguments": arguments or {}, **params}
        return await self.post({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": p})

    async def modern(self, method: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        self.version = MODERN
        self.next_id += 1
        p = {**params, "_meta": {**META, **params.get("_meta", {})}}
        h = {"mcp-method": method}
        if method == "tools/call":
            h["mcp-name"] = p["name"]
        h.update(headers or {})
        return await self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": p}, h)

    async def listen(self, extra: dict[str, str], until: str, seconds: float = 30.0) -> str:
        """GET a stream that stays open and read it until `until` has arrived; return what arrived.

        Fails (TimeoutError) when `until` does not arrive within `seconds`: never a silent empty result.
        """
        text = ""
        with anyio.fail_after(seconds):
            async with self.http.stream("GET", self.url, headers=self.headers({"accept": "text/event-stream", **extra})) as r:
                async for chunk in r.aiter_text():
                    text += chunk
                    if until in text:
                        break
        return text

    async def fetch(self, extra: dict[str, str], seconds: float = 30.0) -> tuple[int, str]:
        """GET with `extra` headers and read the answer to its end: (status, body). Fails when it does
        not end within `seconds`, so a check on the body is never made on a cut-off read."""
        with anyio.fail_after(seconds):
            async with self.http.stream("GET", self.url, headers=self.headers({"accept": "text/event-stream", **extra})) as r:
                return r.status_code, (await r.aread()).decode()

    @contextlib.asynccontextmanager
    async def standalone(self, seconds: float = 30.0) -> AsyncIterator[None]:
        """Hold the session's standalone GET stream open while the block runs.

        An SDK upstream allows one such stream per session and answers any further GET 409, so a
        GET made meanwhile that the gateway does not answer from its own store ends at once.
        """
        opened = anyio.Event()

        async def hold() -> None:
            async with self.http.stream("GET", self.url, headers=self.headers({"accept": "text/event-stream"})) as r:
                assert r.status_code == 200, await r.aread()
                opened.set()
                async for _chunk in r.aiter_bytes():
                    pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            with anyio.fail_after(seconds):
                await opened.wait()
            try:
                yield
            finally:
                tg.cancel_scope.cancel()


def ledger_text(state: Path, wait: float = 2.0) -> str:
    """Every ledger record as text (waits for the group commit)."""
    from audit.sqlite import SqliteLedgerReader

    deadline = time.monotonic() + wait
    text = ""
    while time.monotonic() < deadline:
        try:
            with SqliteLedgerReader(state / "ledger.db") as reader:
                text = "\n".join(bytes(r[2]).decode() for r in reader.iter_records())
        except Exception:
            text = ""
        if text:
            return text
        time.sleep(0.05)
    return text
