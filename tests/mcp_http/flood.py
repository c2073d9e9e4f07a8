"""A flood of session-opening `initialize` requests against `/mcp`, run as a process of its own so
its work does not share the event loop (or the GIL) of the gateway it floods.

    python -m tests.mcp_http.flood URL KEY --connections N --stop-file F

Each of N keep-alive connections posts `initialize` back to back until F exists; prints `flooding`
once the first answer came back, then one JSON line with the count of each HTTP status seen.
Every session that does open is ended again (DELETE), so the flood only ever asks for new ones.
It runs at a lower CPU priority (nice 10): in an attack the flood's client side runs on the
attacker's machines, while here it shares the gateway's cores, and a test measures the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
from pathlib import Path

import httpx

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "flood", "version": "0"}}}
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


async def _connection(url: str, key: str, stop: Path, seen: collections.Counter[int], first: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": key, **HEADERS}) as http:
        body = json.dumps(INITIALIZE)
        while not stop.exists():
            r = await http.post(url, content=body)
            seen[r.status_code] += 1
            first.set()
            sid = r.headers.get("mcp-session-id")
            if sid:
                await http.delete(url, headers={"mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--stop-file", type=Path, required=True)
    args = parser.parse_args()
    os.nice(10)
    seen: collections.Counter[int] = collections.Counter()
    first = asyncio.Event()
    tasks = [asyncio.create_task(_connection(args.url, args.key, args.stop_file, seen, first)) for _ in range(args.connections)]
    await asyncio.wait_for(first.wait(), 60)
    print("flooding", flush=True)
    await asyncio.gather(*tasks)
    print(json.dumps({str(k): v for k, v in seen.items()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
