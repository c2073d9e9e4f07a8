"""Structured logging with structlog; a processor in the chain scrubs secrets from every event.

Where the lines go is always stderr (stdout may be a protocol stream). How they look is the
`log_format` setting: `json` (one JSON object a line, for collectors), `console` (structlog's
`ConsoleRenderer`: aligned, coloured unless NO_COLOR is set, for a person), or `auto` (the
default): console when stderr is a terminal, JSON otherwise. The secret scrubber runs before
either renderer, after exceptions are formatted, so neither form carries a secret.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = ("api_key", "authorization", "password", "secret", "token", "private_key", "arguments", "args")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
"""A credential after an HTTP auth scheme, as an exception text may quote a header (the detectors want a known key shape)."""
LOG_FORMATS: tuple[str, ...] = ("auto", "console", "json")


def scrub_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Drop values whose key names a secret, and redact secrets found in string values."""
    from gateway.stages.sanitizer.walk import redact_secrets

    for key in list(event):
        if any(word in key.lower() for word in _SECRET_KEYS):
            event[key] = "[REDACTED]"
        elif isinstance(event[key], str) and len(event[key]) >= 12 and key != "event":
            event[key], _ = redact_secrets(_BEARER.sub(r"\1 [REDACTED]", event[key]))
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


def console_wanted(fmt: str, stream: Any = None) -> bool:
    """Whether `fmt` means the human-readable form on `stream` (default: stderr): `auto` asks if it is a terminal."""
    if fmt == "console":
        return True
    if fmt == "json":
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream: not a terminal
        return False


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Log events at `level` and above to stderr, as JSON lines or console lines (see the module doc)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of: {', '.join(LOG_FORMATS)}")
    renderer: Any
    if console_wanted(fmt):
        renderer = structlog.dev.ConsoleRenderer(colors=not os.environ.get("NO_COLOR"))
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            scrub_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=True,
    )
