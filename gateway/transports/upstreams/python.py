"""In-process tools: plain Python functions behind the `Backend` interface."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from gateway.core.backends import BackendResult, ToolSpec
from gateway.core.call import ToolInfo
from gateway.core.errors import CallError, ErrorCode

ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]


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
