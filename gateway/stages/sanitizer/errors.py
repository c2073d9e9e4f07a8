"""The sanitizer's error (what makes a call's arguments or a tool's schema unacceptable).

Shared by every part of the sanitizer (`gateway.stages.sanitizer.walk` and its `sanitize_*` modules), so it
sits below them all, with `json_type_name`, the JSON type names its messages use. No I/O.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gateway.core.errors import ErrorCode, GatewayError

__all__ = ["SanitizeError"]


class SanitizeError(GatewayError):
    """The arguments are unacceptable; the stage answers `invalid_params` with `str(exc)`.

    `message` says what is wrong, `path` where (a JSON path); `str(exc)` is "<path>: <message>".
    Messages never echo a detected secret.
    """

    code: ClassVar[ErrorCode] = ErrorCode.INVALID_PARAMS

    def __init__(self, message: str, path: str = "$") -> None:
        super().__init__(f"{path}: {message}")
        self.message = message
        self.path = path


def json_type_name(v: Any) -> str:
    names = {dict: "object", list: "array", tuple: "array", str: "string", bool: "boolean", type(None): "null"}
    if type(v) in names:
        return names[type(v)]
    return "number" if isinstance(v, (int, float)) else type(v).__name__
