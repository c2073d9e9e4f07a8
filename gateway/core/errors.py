"""The error taxonomy: stable error codes and the exceptions that carry them.

    GatewayError
    ├── ConfigError          bad dharma.yaml, key file, state root, ledger path (CLI exit 2)
    ├── PolicyErrors         policy/rule files that do not load; a sorted list of PolicyProblem
    └── CallError            a call fails with one contract code (code, retryable, http_status)

Blocks decided by the pipeline are `Decision` values, not exceptions; `CallError` is for
faults met while carrying a call out (backend down, timeout, bad input at a transport).
No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorCode(StrEnum):
    """Contract error codes (design §2). Never renamed; new ones are added."""

    INVALID_PARAMS = "invalid_params"
    TOOL_NOT_FOUND = "tool_not_found"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    PURPOSE_REQUIRED = "purpose_required"
    POLICY_BLOCKED = "policy_blocked"
    RATE_LIMITED = "rate_limited"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMEOUT = "approval_timeout"
    BACKEND_UNAVAILABLE = "backend_unavailable"
    BACKEND_ERROR = "backend_error"
    TIMEOUT = "timeout"
    INTERNAL_ERROR = "internal_error"

    @property
    def retryable(self) -> bool:
        return self in _RETRYABLE

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]


_RETRYABLE = frozenset(
    {
        ErrorCode.RATE_LIMITED,
        ErrorCode.APPROVAL_REQUIRED,
        ErrorCode.APPROVAL_TIMEOUT,
        ErrorCode.BACKEND_UNAVAILABLE,
        ErrorCode.TIMEOUT,
    }
)

_HTTP_STATUS = {
    ErrorCode.INVALID_PARAMS: 400,
    ErrorCode.TOOL_NOT_FOUND: 404,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.PURPOSE_REQUIRED: 403,
    ErrorCode.POLICY_BLOCKED: 403,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.APPROVAL_REQUIRED: 202,
    ErrorCode.APPROVAL_DENIED: 403,
    ErrorCode.APPROVAL_TIMEOUT: 403,
    ErrorCode.BACKEND_UNAVAILABLE: 503,
    ErrorCode.BACKEND_ERROR: 502,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.INTERNAL_ERROR: 500,
}


class GatewayError(Exception):
    """Root of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """Configuration, key or state problems: the CLI prints the message and exits 2."""


@dataclass(frozen=True, slots=True, order=True)
class PolicyProblem:
    """One problem in a policy file, sortable by place."""

    file: str
    line: int
    rule_id: str
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        rule = f" [{self.rule_id}]" if self.rule_id else ""
        return f"{where}:{rule} {self.severity}: {self.message}"


class PolicyErrors(GatewayError):
    """Policy files that do not load. Carries every problem found, sorted by file and line."""

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = sorted(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class CallError(GatewayError):
    """A call failed with a contract error code."""

    def __init__(self, code: ErrorCode, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.code.retryable



class LimitReached(GatewayError):
    """A bounded resource is full (open MCP sessions, stdio server processes, streams): the
    request that wanted one more is refused, naming the setting that bounds it (`setting`, e.g.
    `mcp.max_sessions_per_principal`) and when a slot may be free again (`retry_after`, seconds)."""

    def __init__(self, setting: str, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.setting = setting
        self.message = message
        self.retry_after = retry_after
