"""The karma ledger as a /healthz dependency: is its store reachable and writable right now?

Each probe answers `ping()` with None when the ledger's store is up, else a short reason naming
it (never a password). They open their own short-lived connection, so a probe never queues
behind the ledger's writer.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from gateway.config import display_url

#: A health probe answers within this, or reports the store as down.
PROBE_SECONDS = 2.0


class SqliteProbe:
    """The SQLite ledger file: it opens, answers a query, and its directory and file are writable."""

    name = "ledger"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _check(self) -> str | None:
        where = f"the SQLite ledger at {self.path}"
        for target in (self.path.parent, self.path):
            if target.exists() and not os.access(target, os.W_OK):
                return f"{where} is not writable ({target})"
        try:
            with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=PROBE_SECONDS) as conn:
                conn.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            return f"{where} cannot be read: {exc}"
        return None

    async def ping(self) -> str | None:
        return await asyncio.to_thread(self._check)

    async def aclose(self) -> None:
        return None


class PostgresProbe:
    """The PostgreSQL ledger: a connection within the probe time, on a primary (writable)."""

    name = "ledger"

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = f"the PostgreSQL ledger at {display_url(url)}"

    async def ping(self) -> str | None:
        import psycopg

        try:
            async with asyncio.timeout(PROBE_SECONDS):
                conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=max(1, int(PROBE_SECONDS)))
                async with conn:
                    row = await (await conn.execute("SELECT pg_is_in_recovery()")).fetchone()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return f"{self.where} is unavailable: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if row is None or row[0]:
            return f"{self.where} is read-only (a standby)"
        return None

    async def aclose(self) -> None:
        return None
