"""Where governed calls go: the `Backend` interface. The pipeline holds one and never knows which
kind it is (the adapters live in `gateway.transports.upstreams`).

Each adapter maps its library's failures into `CallError` as they leave it (timeout → `timeout`,
unreachable → `backend_unavailable`, a failing tool → `backend_error`), so nothing above an
adapter catches a third-party exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from audit.canon import digest
from gateway.core.call import ToolInfo

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
