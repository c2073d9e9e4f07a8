"""Opening the karma ledger for reading, and the values its query filters accept.

Shared by the auditor's CLI (`dharma audit …`) and HTTP API (`/v1/audit/…`), which must not import
each other. Light on purpose: the CLI imports it while building its parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.core.errors import ConfigError

if TYPE_CHECKING:
    from gateway.config import Settings

PASSTHROUGH_STATUS = "forwarded"
"""The status of a record for an MCP method the gateway does not govern, relayed as is."""


def query_choices() -> dict[str, list[str]]:
    """The values a ledger record can hold, per validated query filter: from the code's enums."""
    from gateway.core.call import Effect, Status
    from gateway.core.errors import ErrorCode

    return {
        "decision": [e.value for e in Effect],
        "status": [s.value for s in Status] + [PASSTHROUGH_STATUS],
        "error_code": [c.value for c in ErrorCode],
    }


def ledger_location(settings: Settings) -> Path | str:
    """The ledger `settings` name: its postgresql:// URL, else the SQLite file."""
    return settings.ledger.url or settings.ledger_path


def verify_log_path(location: Path | str, state_root: Path) -> Path:
    """Where the last verification of the ledger at `location` is recorded (`audit.verify_log`):
    beside a SQLite file; under the state root, named by the URL's digest (never its password), for PostgreSQL."""
    import hashlib
    from urllib.parse import urlsplit

    from audit.verify_log import SUFFIX

    if isinstance(location, Path):
        return location.with_name(location.name + SUFFIX)

    parts = urlsplit(location)
    name = f"{parts.hostname or ''}:{parts.port or ''}{parts.path}"
    return state_root.expanduser() / f"ledger-{hashlib.sha256(name.encode()).hexdigest()[:16]}{SUFFIX}"


def open_ledger_reader(location: Path | str) -> Any:
    """A read-only reader of the ledger at `location` (a SQLite file, or a postgresql:// URL).

    Raises:
        ConfigError: no ledger there, it is not a ledger, or psycopg is missing for a URL.
    """
    from audit.errors import LedgerError

    try:
        if isinstance(location, str):
            from audit.postgres import PostgresLedgerReader

            return PostgresLedgerReader(location)
        from audit.sqlite import SqliteLedgerReader

        if not location.exists():
            raise ConfigError(f"{location}: no ledger there")
        return SqliteLedgerReader(location)
    except LedgerError as exc:
        raise ConfigError(str(exc)) from None
    except ImportError as exc:
        raise ConfigError(f"a PostgreSQL ledger needs psycopg: pip install 'dharma-gateway[postgres]' ({exc})") from None
