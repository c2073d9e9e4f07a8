"""A small round-robin HTTP load balancer for the replica tests: no stickiness at all.

Each request goes to the next replica in turn (whatever its session, method or headers), with its
body and headers as they came; the answer streams back unbuffered, chunk by chunk as the replica
sends it (SSE included), so a held or polled stream behaves as it would without the balancer.
`served` records (method, replica index, request headers, body) for the assertions; `turn` may be set
to choose the next replica (a test that needs "the other one").
"""

from __future__ import annotations

import httpx
from starlette.types import Receive, Scope, Send

#: Hop-by-hop headers a proxy does not pass on (RFC 9110 §7.6.1), plus the ones httpx sets itself.
HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
       "content-length"}


class RoundRobin:
    """An ASGI app that sends each request to the next of `replicas` (base URLs)."""

    def __init__(self, replicas: list[str]) -> None:
        self.replicas = replicas
        self.turn = 0
        self.served: list[tuple[str, int, dict[str, str], bytes]] = []
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(60.0, read=None))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        index = self.turn % len(self.replicas)
        self.turn += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k.decode("latin-1").lower() not in HOP]
        self.served.append((scope["method"], index, {k.lower(): v for k, v in headers}, body))
        url = self.replicas[index] + scope["path"] + (("?" + scope["query_string"].decode()) if scope["query_string"] else "")
        request = self.http.build_request(scope["method"], url, headers=headers, content=body)
        try:
            upstream = await self.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _plain(send, 502, f"load balancer: replica {index} failed: {exc}".encode())
            return
        try:
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in upstream.headers.multi_items()
                                    if k.lower() not in HOP]})
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (httpx.HTTPError, OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await upstream.aclose()

    def replicas_for(self, method: str, body_has: bytes = b"", **header: str) -> list[int]:
        """The replicas that served requests of `method` whose body contains `body_has` and that carry
        every given header (name=value, `*` for any value)."""
        wanted = {k.replace("_", "-"): v for k, v in header.items()}
        return [i for m, i, h, b in self.served
                if m == method and body_has in b and all(k in h and (v == "*" or h[k] == v) for k, v in wanted.items())]


async def _plain(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
