"""A plain HTTP tool API behind the `Backend` interface."""

from __future__ import annotations

from collections.abc import Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from gateway.core.backends import BackendResult, ToolSpec
from gateway.core.call import ToolInfo
from gateway.core.errors import CallError, ErrorCode


class HttpBackend:
    """A plain HTTP tool API: `POST {url}/{tool}` with `{"arguments": {...}}`, answering JSON.

    A 2xx answer's JSON body is the result (a `{"result": ...}` envelope is unwrapped); 4xx/5xx
    become `backend_error` (or `backend_unavailable` for 502/503/504). Cookies the API sets are
    neither kept nor sent back: one client serves every caller, so a kept cookie would carry one
    caller's server-side state into the next caller's calls.
    """

    def __init__(
        self,
        id: str,
        url: str,
        tools: list[ToolSpec],
        *,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.id = id
        self.url = url.rstrip("/")
        self._specs = {t.name: t for t in tools}
        self._infos = [t.info(id) for t in tools]
        refuse_all = CookieJar(DefaultCookiePolicy(allowed_domains=[]))
        self._client = httpx.AsyncClient(headers=dict(headers or {}), transport=transport, cookies=refuse_all)

    def tools(self) -> list[ToolInfo]:
        return list(self._infos)

    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult:
        try:
            response = await self._client.post(f"{self.url}/{tool}", json={"arguments": arguments}, timeout=timeout)
        except httpx.TimeoutException:
            raise CallError(ErrorCode.TIMEOUT, f"backend {self.id} did not answer within {timeout:g}s") from None
        except (httpx.TransportError, OSError) as exc:
            raise CallError(ErrorCode.BACKEND_UNAVAILABLE, f"backend {self.id} unreachable: {exc}") from exc
        if response.status_code in (502, 503, 504):
            raise CallError(ErrorCode.BACKEND_UNAVAILABLE, f"backend {self.id} answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise CallError(ErrorCode.BACKEND_ERROR, f"backend {self.id} answered non-JSON (HTTP {response.status_code})") from None
        if response.status_code >= 400:
            raise CallError(ErrorCode.BACKEND_ERROR, f"backend {self.id} answered HTTP {response.status_code}")
        if isinstance(body, dict) and set(body) <= {"result", "is_error"} and "result" in body:
            return BackendResult(body["result"], bool(body.get("is_error", False)))
        return BackendResult(body)

    async def aclose(self) -> None:
        await self._client.aclose()
