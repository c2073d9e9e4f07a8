"""Where governed calls go. The pipeline holds a `Backend` and never knows which kind it is.

Each adapter maps its library's failures into `CallError` as they leave it (timeout → `timeout`,
unreachable → `backend_unavailable`, a failing tool → `backend_error`), so nothing above an
adapter catches a third-party exception.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import httpx

from audit.canon import digest
from gateway.call import ToolInfo
from gateway.errors import CallError, ErrorCode

ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class BackendResult:
    """A backend's answer: the result object and whether the tool itself reported an error."""

    result: Any
    is_error: bool = False


class Backend(Protocol):
    id: str

    def tools(self) -> list[ToolInfo]: ...
    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult: ...
    async def aclose(self) -> None: ...


def tool_digest(name: str, description: str, input_schema: Any, output_schema: Any, annotations: Any) -> str:
    """Digest of a tool definition, for pinning and for the ledger."""
    return digest(
        {
            "name": name,
            "description": description,
            "inputSchema": input_schema,
            "outputSchema": output_schema,
            "annotations": annotations,
        }
    )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool definition given in configuration or code (name, schema, annotations)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] = field(default_factory=dict)

    def info(self, backend: str) -> ToolInfo:
        return ToolInfo(
            name=self.name,
            backend=backend,
            description=self.description,
            annotations=dict(self.annotations),
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            digest=tool_digest(self.name, self.description, self.input_schema, self.output_schema, self.annotations),
        )


class CallableBackend:
    """In-process tools: plain Python functions (sync or async) called with the arguments as kwargs."""

    def __init__(self, id: str, tools: Mapping[str, tuple[ToolFunction, ToolSpec]]) -> None:
        self.id = id
        self._tools = dict(tools)
        self._infos = [spec.info(id) for _, spec in self._tools.values()]

    @classmethod
    def from_functions(cls, id: str, functions: Mapping[str, ToolFunction] | list[ToolFunction]) -> CallableBackend:
        """Build from functions; the tool name is the dict key (or the function name)."""
        items = functions.items() if isinstance(functions, Mapping) else ((f.__name__, f) for f in functions)
        return cls(id, {name: (fn, ToolSpec(name=name, description=inspect.getdoc(fn) or "")) for name, fn in items})

    def tools(self) -> list[ToolInfo]:
        return list(self._infos)

    async def send(self, tool: str, arguments: dict[str, Any], *, timeout: float) -> BackendResult:
        entry = self._tools.get(tool)
        if entry is None:
            raise CallError(ErrorCode.TOOL_NOT_FOUND, f"Unknown tool: {tool}")
        fn = entry[0]
        try:
            value = fn(**arguments)
            if inspect.isawaitable(value):
                with anyio.fail_after(timeout):  # a plain function cannot be interrupted anyway
                    value = await value
        except TimeoutError:
            raise CallError(ErrorCode.TIMEOUT, f"tool {tool} did not answer within {timeout:g}s") from None
        except CallError:
            raise
        except TypeError as exc:
            raise CallError(ErrorCode.INVALID_PARAMS, f"tool {tool}: {exc}") from exc
        except Exception as exc:  # the tool's own failure is a backend error, not ours
            raise CallError(ErrorCode.BACKEND_ERROR, f"tool {tool} failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(value, BackendResult):
            return value
        return BackendResult(value)

    async def aclose(self) -> None:
        return None


class HttpBackend:
    """A plain HTTP tool API: `POST {url}/{tool}` with `{"arguments": {...}}`, answering JSON.

    A 2xx answer's JSON body is the result (a `{"result": ...}` envelope is unwrapped); 4xx/5xx
    become `backend_error` (or `backend_unavailable` for 502/503/504).
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
        self._client = httpx.AsyncClient(headers=dict(headers or {}), transport=transport)

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
