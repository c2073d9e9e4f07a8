"""Structured logging with structlog; a processor in the chain scrubs secrets from every event."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = ("api_key", "authorization", "password", "secret", "token", "private_key", "arguments", "args")


def scrub_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Drop values whose key names a secret, and redact secrets found in string values."""
    from gateway.stages.sanitizer.walk import redact_secrets

    for key in list(event):
        if any(word in key.lower() for word in _SECRET_KEYS):
            event[key] = "[REDACTED]"
        elif isinstance(event[key], str) and len(event[key]) >= 12 and key != "event":
            event[key], _ = redact_secrets(event[key])
    return event


class _StderrLogger:
    """Writes each event to whatever `sys.stderr` is at that moment (it may be swapped, e.g. by test capture)."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = msg


def ensure_logging() -> None:
    """Configure logging to stderr unless the host application already configured structlog."""
    if not structlog.is_configured():
        configure_logging("warning")


def configure_logging(level: str = "info") -> None:
    """JSON lines on stderr (stdout may be a protocol stream)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            scrub_secrets,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=True,
    )
