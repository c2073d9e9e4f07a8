"""Approvals in a SQLite file under the state root, so `dharma approvals approve` in another
process reaches the gateway that holds the call. Each operation is one short transaction;
`BEGIN IMMEDIATE` makes decide/consume atomic across processes (single use holds)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import anyio

from gateway.core.errors import ConfigError
from gateway.stores.base import Approval

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals(
  id TEXT PRIMARY KEY, principal TEXT NOT NULL, tool TEXT NOT NULL, argument_digest TEXT NOT NULL,
  policy_version TEXT NOT NULL, request_id TEXT NOT NULL, reason TEXT NOT NULL,
  created_at REAL NOT NULL, expires_at REAL NOT NULL, state TEXT NOT NULL,
  decided_by TEXT NOT NULL DEFAULT '', arguments_preview TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS approvals_state ON approvals(state, expires_at);
"""
_COLUMNS = (
    "id, principal, tool, argument_digest, policy_version, request_id, reason, created_at, expires_at, "
    "state, decided_by, arguments_preview"
)


class SqliteApprovalStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as conn, conn:
                conn.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"{path}: cannot open the approvals store: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        return anyio.to_thread.run_sync(fn, *args)

    async def create(self, approval: Approval) -> None:
        def op() -> None:
            with closing(self._connect()) as conn, conn:
                conn.execute(
                    f"INSERT INTO approvals({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        approval.id, approval.principal, approval.tool, approval.argument_digest,
                        approval.policy_version, approval.request_id, approval.reason, approval.created_at,
                        approval.expires_at, approval.state, approval.decided_by, approval.arguments_preview,
                    ),
                )

        await self._run(op)

    def get_sync(self, approval_id: str) -> Approval | None:
        with closing(self._connect()) as conn, conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (approval_id,)).fetchone()
        return Approval(*row) if row else None

    async def get(self, approval_id: str) -> Approval | None:
        return await self._run(self.get_sync, approval_id)  # type: ignore[no-any-return]

    def decide_sync(self, approval_id: str, *, approve: bool, by: str, now: float) -> Approval:
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT state, expires_at FROM approvals WHERE id = ?", (approval_id,)).fetchone()
            if row is None:
                raise KeyError(approval_id)
            state, expires_at = row
            if state == "pending" and expires_at <= now:
                conn.execute("UPDATE approvals SET state = 'expired' WHERE id = ?", (approval_id,))
                conn.execute("COMMIT")
                raise ValueError(f"approval {approval_id} is expired, not pending")
            if state != "pending":
                raise ValueError(f"approval {approval_id} is {state}, not pending")
            conn.execute(
                "UPDATE approvals SET state = ?, decided_by = ? WHERE id = ?",
                ("approved" if approve else "denied", by, approval_id),
            )
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()
        result = self.get_sync(approval_id)
        assert result is not None
        return result

    async def decide(self, approval_id: str, *, approve: bool, by: str, now: float) -> Approval:
        return await anyio.to_thread.run_sync(lambda: self.decide_sync(approval_id, approve=approve, by=by, now=now))

    async def consume(self, approval_id: str, *, now: float) -> bool:
        def op() -> bool:
            with closing(self._connect()) as conn, conn:
                cur = conn.execute(
                    "UPDATE approvals SET state = 'used' WHERE id = ? AND state = 'approved' AND expires_at > ?",
                    (approval_id, now),
                )
                return cur.rowcount == 1

        return await self._run(op)  # type: ignore[no-any-return]

    async def expire(self, approval_id: str) -> None:
        def op() -> None:
            with closing(self._connect()) as conn, conn:
                conn.execute("UPDATE approvals SET state = 'expired' WHERE id = ? AND state = 'pending'", (approval_id,))

        await self._run(op)

    def pending_sync(self, now: float) -> list[Approval]:
        with closing(self._connect()) as conn, conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM approvals WHERE state = 'pending' AND expires_at > ? ORDER BY created_at",
                (now,),
            ).fetchall()
        return [Approval(*row) for row in rows]

    async def pending(self, now: float) -> list[Approval]:
        return await self._run(self.pending_sync, now)  # type: ignore[no-any-return]
