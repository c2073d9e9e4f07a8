"""Approvals in a SQLite file under the state root, so `dharma approvals approve` in another
process reaches the gateway that holds the call.

Insert-only like the karma ledger: `approval_holds` keeps each held call's binding,
`approval_events` every event of its life (held, approved, denied, expired, used), and
`approval_recorded` which events the ledger holds at which seq. Triggers refuse UPDATE and
DELETE on all three; an approval's state is its latest event. Each operation is one short
transaction; `BEGIN IMMEDIATE` makes decide/consume/expire atomic across processes (single use
holds). A file written by an older gateway (one mutable `approvals` table) is carried over once.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio

from gateway.core.errors import ConfigError
from gateway.stores.base import LEDGER_EVENTS, Approval, ApprovalEvent
from gateway.stores.memory import one_process_recording

_TABLES = ("approval_holds", "approval_events", "approval_recorded")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS approval_holds(
  id TEXT PRIMARY KEY, principal TEXT NOT NULL, tool TEXT NOT NULL, argument_digest TEXT NOT NULL,
  policy_version TEXT NOT NULL, request_id TEXT NOT NULL, reason TEXT NOT NULL,
  created_at REAL NOT NULL, expires_at REAL NOT NULL, arguments_preview TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS approval_events(
  no INTEGER PRIMARY KEY AUTOINCREMENT, approval_id TEXT NOT NULL REFERENCES approval_holds(id),
  event TEXT NOT NULL CHECK (event IN ('held', 'approved', 'denied', 'expired', 'used')),
  actor TEXT NOT NULL, via TEXT NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS approval_events_of ON approval_events(approval_id, no);
CREATE TABLE IF NOT EXISTS approval_recorded(
  no INTEGER PRIMARY KEY REFERENCES approval_events(no), seq INTEGER NOT NULL, hash TEXT NOT NULL);
""" + "".join(
    f"""
CREATE TRIGGER IF NOT EXISTS {table}_no_update BEFORE UPDATE ON {table}
BEGIN SELECT RAISE(ABORT, '{table} is insert-only: approvals are events'); END;
CREATE TRIGGER IF NOT EXISTS {table}_no_delete BEFORE DELETE ON {table}
BEGIN SELECT RAISE(ABORT, '{table} is insert-only: approvals are events'); END;
"""
    for table in _TABLES
)
_LATEST = "(SELECT e.{col} FROM approval_events e WHERE e.approval_id = h.id {extra} ORDER BY e.no DESC LIMIT 1)"
STATE_SQL = f"(CASE {_LATEST.format(col='event', extra='')} WHEN 'held' THEN 'pending' ELSE {_LATEST.format(col='event', extra='')} END)"
_DECIDED = "AND e.event IN ('approved', 'denied')"
_DECIDED_BY = f"COALESCE({_LATEST.format(col='actor', extra=_DECIDED)}, '')"
HOLD_COLUMNS = "id, principal, tool, argument_digest, policy_version, request_id, reason, created_at, expires_at, arguments_preview"
SELECT_SQL = (
    "SELECT h.id, h.principal, h.tool, h.argument_digest, h.policy_version, h.request_id, h.reason, "
    f"h.created_at, h.expires_at, {STATE_SQL}, {_DECIDED_BY}, h.arguments_preview FROM approval_holds h"
)
UNRECORDED_SQL = f"""
SELECT e.no, e.event, e.actor, e.via, e.reason, e.at, h.id, h.principal, h.tool, h.argument_digest, h.policy_version,
       h.request_id, h.reason, h.created_at, h.expires_at, h.arguments_preview
FROM approval_events e JOIN approval_holds h ON h.id = e.approval_id
WHERE e.no > (SELECT COALESCE(MAX(no), 0) FROM approval_recorded)
  AND e.event IN ({", ".join(f"'{name}'" for name in sorted(LEDGER_EVENTS))})
ORDER BY e.no
"""
_LEGACY_COPY = (
    f"INSERT INTO approval_holds({HOLD_COLUMNS}) SELECT {HOLD_COLUMNS} FROM approvals",
    "INSERT INTO approval_events(approval_id, event, actor, via, reason, at)"
    " SELECT id, 'held', principal, 'gateway', reason, created_at FROM approvals",
    "INSERT INTO approval_events(approval_id, event, actor, via, reason, at)"
    " SELECT id, CASE state WHEN 'used' THEN 'approved' ELSE state END, decided_by, 'legacy', '', created_at"
    " FROM approvals WHERE state IN ('approved', 'denied', 'used')",
    "INSERT INTO approval_events(approval_id, event, actor, via, reason, at)"
    " SELECT id, state, '', 'legacy', '', created_at FROM approvals WHERE state IN ('expired', 'used')",
    "DROP TABLE approvals",
)
"""Carry an older gateway's mutable `approvals` table (state in a column) over as events, once."""


def event_from_row(row: Any) -> ApprovalEvent:
    """An `ApprovalEvent` from a row of UNRECORDED_SQL (SQLite and PostgreSQL share the query)."""
    no, event, actor, via, reason, at, *hold = row
    return ApprovalEvent(
        no=no, event=event, by=actor, via=via, reason=reason, at=at,
        approval=Approval(*hold[:8], expires_at=hold[8], arguments_preview=hold[9]),
    )


class SqliteApprovalStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as conn:
                conn.executescript(_SCHEMA)
                self._carry_over_legacy(conn)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"{path}: cannot open the approvals store: {exc}") from None

    def _carry_over_legacy(self, conn: sqlite3.Connection) -> None:
        """Copy the one mutable `approvals` table of an older gateway into the event tables, once
        (checked again inside the transaction, so two processes opening it do not both copy)."""

        def legacy(c: sqlite3.Connection) -> bool:
            return "state" in {row[1] for row in c.execute("PRAGMA table_info(approvals)")}

        def op(c: sqlite3.Connection) -> None:
            if legacy(c):
                for statement in _LEGACY_COPY:
                    c.execute(statement)

        if legacy(conn):
            self._transaction(op)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        return anyio.to_thread.run_sync(fn, *args)

    def _transaction(self, fn: Any) -> Any:
        """Run `fn(conn)` inside `BEGIN IMMEDIATE … COMMIT` (rolled back if it raises)."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = fn(conn)
            conn.execute("COMMIT")
            return result
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()

    @staticmethod
    def _state(conn: sqlite3.Connection, approval_id: str) -> tuple[str, float] | None:
        row = conn.execute(
            f"SELECT {STATE_SQL}, h.expires_at FROM approval_holds h WHERE h.id = ?", (approval_id,)
        ).fetchone()
        return (row[0], row[1]) if row else None

    @staticmethod
    def _add(conn: sqlite3.Connection, approval_id: str, event: str, actor: str, via: str, reason: str, at: float) -> None:
        conn.execute(
            "INSERT INTO approval_events(approval_id, event, actor, via, reason, at) VALUES (?,?,?,?,?,?)",
            (approval_id, event, actor, via, reason, at),
        )

    async def create(self, approval: Approval) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO approval_holds({HOLD_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    approval.id, approval.principal, approval.tool, approval.argument_digest, approval.policy_version,
                    approval.request_id, approval.reason, approval.created_at, approval.expires_at,
                    approval.arguments_preview,
                ),
            )
            self._add(conn, approval.id, "held", approval.principal, "gateway", approval.reason, approval.created_at)

        await self._run(self._transaction, op)

    def get_sync(self, approval_id: str) -> Approval | None:
        with closing(self._connect()) as conn:
            row = conn.execute(f"{SELECT_SQL} WHERE h.id = ?", (approval_id,)).fetchone()
        return Approval(*row) if row else None

    async def get(self, approval_id: str) -> Approval | None:
        return await self._run(self.get_sync, approval_id)  # type: ignore[no-any-return]

    def decide_sync(
        self, approval_id: str, *, approve: bool, by: str, now: float, via: str = "api", reason: str = ""
    ) -> Approval:
        """Append `approved` or `denied` by principal `by`; KeyError if unknown, ValueError if not pending."""

        def op(conn: sqlite3.Connection) -> str | None:
            found = self._state(conn, approval_id)
            if found is None:
                raise KeyError(approval_id)
            state, expires_at = found
            if state == "pending" and expires_at <= now:
                self._add(conn, approval_id, "expired", "", "timeout", "expired before anyone decided", now)
                return "expired"
            if state != "pending":
                return state
            self._add(conn, approval_id, "approved" if approve else "denied", by, via, reason, now)
            return None

        refused = self._transaction(op)
        if refused is not None:
            raise ValueError(f"approval {approval_id} is {refused}, not pending")
        result = self.get_sync(approval_id)
        assert result is not None
        return result

    async def decide(
        self, approval_id: str, *, approve: bool, by: str, now: float, via: str = "api", reason: str = ""
    ) -> Approval:
        return await anyio.to_thread.run_sync(
            lambda: self.decide_sync(approval_id, approve=approve, by=by, now=now, via=via, reason=reason)
        )

    async def consume(self, approval_id: str, *, now: float) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            found = self._state(conn, approval_id)
            if found is None or found[0] != "approved" or found[1] <= now:
                return False
            self._add(conn, approval_id, "used", "", "gateway", "", now)
            return True

        return await self._run(self._transaction, op)  # type: ignore[no-any-return]

    async def expire(self, approval_id: str, *, now: float | None = None) -> None:
        at = time.time() if now is None else now

        def op(conn: sqlite3.Connection) -> None:
            found = self._state(conn, approval_id)
            if found is not None and found[0] == "pending":
                self._add(conn, approval_id, "expired", "", "timeout", "no decision in time", at)

        await self._run(self._transaction, op)

    def pending_sync(self, now: float) -> list[Approval]:
        with closing(self._connect()) as conn:
            rows = conn.execute(
                f"{SELECT_SQL} WHERE {STATE_SQL} = 'pending' AND h.expires_at > ? ORDER BY h.created_at", (now,)
            ).fetchall()
        return [Approval(*row) for row in rows]

    async def pending(self, now: float) -> list[Approval]:
        return await self._run(self.pending_sync, now)  # type: ignore[no-any-return]

    def unrecorded_sync(self) -> list[ApprovalEvent]:
        with closing(self._connect()) as conn:
            rows = conn.execute(UNRECORDED_SQL).fetchall()
        return [event_from_row(row) for row in rows]

    async def unrecorded(self) -> list[ApprovalEvent]:
        return await self._run(self.unrecorded_sync)  # type: ignore[no-any-return]

    async def mark_recorded(self, no: int, seq: int, record_hash: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO approval_recorded(no, seq, hash) VALUES (?,?,?)", (no, seq, record_hash))

        await self._run(self._transaction, op)

    def recording(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Only the process holding the SQLite ledger's writer lock copies events: nothing to claim."""
        return one_process_recording()

    def linked_mark(self, no: int) -> None:
        return None  # approvals.db is another file than the ledger: the mark is its own transaction
