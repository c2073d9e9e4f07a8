"""Approvals in PostgreSQL, in the karma ledger's own database, for several gateway replicas.

Same contract and tables as `sqlite_approvals` (the state queries are shared), in a schema of
their own (`dharma_approvals`), so the ledger's tables and checks never see them:
`approval_holds` keeps each held call's binding, `approval_events` every event of its life,
`approval_recorded` which events the ledger holds at which seq. Triggers refuse UPDATE, DELETE
and TRUNCATE on all three; an approval's state is its latest event.

Across replicas:
- every state change (decide, consume, expire) is one transaction that first locks the
  approval's hold row (`FOR UPDATE`), so two replicas redeeming one approved id serialize on it
  and exactly one appends `used` (single use);
- every event insert also takes one transaction-scoped advisory lock, so event numbers are
  assigned in commit order and "everything after the last recorded number" misses none;
- copying events into the ledger (`ApprovalRecorder`) runs under `recording()`, a transaction
  advisory lock: one replica at a time. The mark is a `LinkedRow` written in the same transaction
  as the ledger record (`PostgresLedger.append_linked`) and `approval_recorded.no` is its primary
  key, so an event is in the chain at most once even if the lock were lost, and a replica dying
  mid-copy leaves the record and its mark both written or both absent (never a record to copy
  again). Its lock goes with its connection.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import psycopg
import psycopg.sql
import structlog

from audit.postgres import LinkedRow
from gateway.config import display_url
from gateway.core.errors import ConfigError
from gateway.stores.base import Approval, ApprovalEvent, StoreUnavailable
from gateway.stores.sqlite_approvals import HOLD_COLUMNS, SELECT_SQL, STATE_SQL, UNRECORDED_SQL, event_from_row

log = structlog.get_logger()

SCHEMA = "dharma_approvals"
TABLES = ("approval_holds", "approval_events", "approval_recorded")
CONNECT_TIMEOUT_S = 5
POOL_SIZE = 4
LOCK_TIMEOUT = "30s"
"""How long a replica waits for another's copy into the ledger before giving up (fails closed)."""
SCHEMA_LOCK = 0x6441_7070_0001  # advisory lock ids: creating the schema, numbering events, copying
EVENTS_LOCK = 0x6441_7070_0002
RECORD_LOCK = 0x6441_7070_0003

_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE {SCHEMA}.approval_holds(
  id text PRIMARY KEY, principal text NOT NULL, tool text NOT NULL, argument_digest text NOT NULL,
  policy_version text NOT NULL, request_id text NOT NULL, reason text NOT NULL,
  created_at double precision NOT NULL, expires_at double precision NOT NULL, arguments_preview text NOT NULL DEFAULT '');
CREATE INDEX approval_holds_expires ON {SCHEMA}.approval_holds(expires_at);
CREATE TABLE {SCHEMA}.approval_events(
  no bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, approval_id text NOT NULL REFERENCES {SCHEMA}.approval_holds(id),
  event text NOT NULL CHECK (event IN ('held', 'approved', 'denied', 'expired', 'used')),
  actor text NOT NULL, via text NOT NULL, reason text NOT NULL, at double precision NOT NULL);
CREATE INDEX approval_events_of ON {SCHEMA}.approval_events(approval_id, no);
CREATE TABLE {SCHEMA}.approval_recorded(
  no bigint PRIMARY KEY REFERENCES {SCHEMA}.approval_events(no), seq bigint NOT NULL, hash text NOT NULL);
CREATE FUNCTION {SCHEMA}.insert_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION '% is insert-only: approvals are events (% refused)', TG_TABLE_NAME, TG_OP; END $$;
""" + "".join(
    f"CREATE TRIGGER {table}_insert_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {SCHEMA}.{table} "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.insert_only();\n"
    for table in TABLES
)
MARK_SQL = f"INSERT INTO {SCHEMA}.approval_recorded(no, seq, hash) VALUES (%s, %s, %s)"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class PostgresApprovalStore:
    """The approval store of replicas sharing a PostgreSQL ledger. Build it with `await open(url)`."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.where = display_url(url)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = anyio.Semaphore(POOL_SIZE)
        self._recorder_conn: psycopg.AsyncConnection[Any] | None = None
        self._recorder_lock = anyio.Lock()

    @classmethod
    async def open(cls, url: str) -> PostgresApprovalStore:
        """Connect and create the approval tables if the database has none yet.

        Raises:
            ConfigError: PostgreSQL cannot be reached or the tables cannot be created (says which server).
        """
        store = cls(url)
        try:
            async with store._connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                cur = await conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.approval_recorded",))
                if (await cur.fetchone())[0] is None:  # type: ignore[index]
                    await conn.execute(_DDL)
                    log.info("approvals.created", url=store.where, schema=SCHEMA)
        except StoreUnavailable as exc:
            raise ConfigError(f"cannot open the approvals store: {exc}") from None
        return store

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"PostgreSQL approvals store at {self.where} is unavailable: {_first_line(exc)}")

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, options=f"-c search_path={SCHEMA}")

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; one that failed or was interrupted is closed, never reused."""
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            try:
                if conn is None:
                    conn = await self._connect()
                yield conn
            except psycopg.Error as exc:
                await _close(conn)
                raise self._unavailable(exc) from None
            except BaseException:
                if conn is not None and _reusable(conn):
                    self._idle.append(conn)  # e.g. KeyError after a clean rollback
                else:
                    await _close(conn)
                raise
            if _reusable(conn):
                self._idle.append(conn)

    async def _transaction(self, op: Callable[[psycopg.AsyncConnection[Any]], Any]) -> Any:
        async with self._connection() as conn, conn.transaction():
            return await op(conn)

    @staticmethod
    async def _locked_state(conn: psycopg.AsyncConnection[Any], approval_id: str) -> tuple[str, float] | None:
        """Lock the hold row (state changes of one approval serialize across replicas), then read its
        state in a second statement: its snapshot is taken after the lock, so it sees the event a
        replica that held the lock before us committed (a subquery of the locking statement would not)."""
        cur = await conn.execute("SELECT 1 FROM approval_holds WHERE id = %s FOR UPDATE", (approval_id,))
        if await cur.fetchone() is None:
            return None
        cur = await conn.execute(f"SELECT {STATE_SQL}, h.expires_at FROM approval_holds h WHERE h.id = %s", (approval_id,))
        row = await cur.fetchone()
        return (row[0], row[1]) if row else None

    @staticmethod
    async def _add(conn: psycopg.AsyncConnection[Any], approval_id: str, event: str, actor: str, via: str, reason: str,
                   at: float) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (EVENTS_LOCK,))
        await conn.execute(
            "INSERT INTO approval_events(approval_id, event, actor, via, reason, at) VALUES (%s, %s, %s, %s, %s, %s)",
            (approval_id, event, actor, via, reason, at),
        )

    async def create(self, approval: Approval) -> None:
        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(
                f"INSERT INTO approval_holds({HOLD_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (approval.id, approval.principal, approval.tool, approval.argument_digest, approval.policy_version,
                 approval.request_id, approval.reason, approval.created_at, approval.expires_at, approval.arguments_preview),
            )
            await self._add(conn, approval.id, "held", approval.principal, "gateway", approval.reason, approval.created_at)

        await self._transaction(op)

    async def get(self, approval_id: str) -> Approval | None:
        async with self._connection() as conn:
            cur = await conn.execute(f"{SELECT_SQL} WHERE h.id = %s", (approval_id,))
            row = await cur.fetchone()
        return Approval(*row) if row else None

    async def decide(
        self, approval_id: str, *, approve: bool, by: str, now: float, via: str = "api", reason: str = ""
    ) -> Approval:
        """Append `approved` or `denied` by principal `by`; KeyError if unknown, ValueError if not pending."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> str | None:
            found = await self._locked_state(conn, approval_id)
            if found is None:
                raise KeyError(approval_id)
            state, expires_at = found
            if state == "pending" and expires_at <= now:
                await self._add(conn, approval_id, "expired", "", "timeout", "expired before anyone decided", now)
                return "expired"
            if state != "pending":
                return state
            await self._add(conn, approval_id, "approved" if approve else "denied", by, via, reason, now)
            return None

        refused = await self._transaction(op)
        if refused is not None:
            raise ValueError(f"approval {approval_id} is {refused}, not pending")
        result = await self.get(approval_id)
        assert result is not None
        return result

    async def consume(self, approval_id: str, *, now: float) -> bool:
        async def op(conn: psycopg.AsyncConnection[Any]) -> bool:
            found = await self._locked_state(conn, approval_id)
            if found is None or found[0] != "approved" or found[1] <= now:
                return False
            await self._add(conn, approval_id, "used", "", "gateway", "", now)
            return True

        return await self._transaction(op)  # type: ignore[no-any-return]

    async def expire(self, approval_id: str, *, now: float | None = None) -> None:
        at = time.time() if now is None else now

        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            found = await self._locked_state(conn, approval_id)
            if found is not None and found[0] == "pending":
                await self._add(conn, approval_id, "expired", "", "timeout", "no decision in time", at)

        await self._transaction(op)

    async def pending(self, now: float) -> list[Approval]:
        async with self._connection() as conn:
            cur = await conn.execute(
                f"{SELECT_SQL} WHERE h.expires_at > %s AND {STATE_SQL} = 'pending' ORDER BY h.created_at", (now,))
            rows = await cur.fetchall()
        return [Approval(*row) for row in rows]

    async def unrecorded(self) -> list[ApprovalEvent]:
        async with self._connection() as conn:
            cur = await conn.execute(UNRECORDED_SQL)
            rows = await cur.fetchall()
        return [event_from_row(row) for row in rows]

    async def mark_recorded(self, no: int, seq: int, record_hash: str) -> None:
        """The mark on its own (a ledger elsewhere); `linked_mark` is the atomic form."""
        try:
            await self._transaction(lambda conn: conn.execute(MARK_SQL, (no, seq, record_hash)))
        except StoreUnavailable as exc:
            if "approval_recorded_pkey" in str(exc):
                raise ValueError(f"approval event {no} is already recorded") from None
            raise

    def linked_mark(self, no: int) -> LinkedRow:
        return LinkedRow(MARK_SQL, (no,))

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[None]:
        """Hold the copy lock (a transaction advisory lock on a connection of its own, released on
        commit or when this process's connection dies) while events are copied into the ledger."""
        async with self._recorder_lock:
            try:
                if self._recorder_conn is None or self._recorder_conn.closed or self._recorder_conn.broken:
                    self._recorder_conn = await self._connect()
                conn = self._recorder_conn
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (RECORD_LOCK,))
                    yield
            except psycopg.Error as exc:
                await _close(self._recorder_conn)
                self._recorder_conn = None
                raise self._unavailable(exc) from None

    async def aclose(self) -> None:
        for conn in [*self._idle, self._recorder_conn]:
            await _close(conn)
        self._idle.clear()
        self._recorder_conn = None


def _reusable(conn: psycopg.AsyncConnection[Any]) -> bool:
    return not (conn.closed or conn.broken) and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def _close(conn: psycopg.AsyncConnection[Any] | None) -> None:
    if conn is not None:
        with contextlib.suppress(psycopg.Error):
            await conn.close()


def grant_roles(url: str, *, writer: str | None, readers: Sequence[str]) -> list[str]:
    """Give the approval tables the ledger's privileges (`dharma audit grant`, run as the owner):
    create them if missing, revoke everything from PUBLIC and the roles, then let `writer` read and
    append (UPDATE on `approval_holds` only for the row lock its `SELECT … FOR UPDATE` takes; the
    triggers still refuse every UPDATE) and each reader read. Idempotent; one line per action.

    Raises:
        ConfigError: PostgreSQL cannot be reached or the statements fail (says which server).
    """
    ident, sql_ = psycopg.sql.Identifier, psycopg.sql.SQL
    roles = [r for r in (writer, *readers) if r is not None]
    schema = ident(SCHEMA)
    tables = sql_(", ").join(sql_("{}.{}").format(schema, ident(t)) for t in TABLES)
    who = sql_(", ").join([sql_("PUBLIC"), *(ident(r) for r in roles)])
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            if conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.approval_recorded",)).fetchone()[0] is None:  # type: ignore[index]
                conn.execute(_DDL)  # type: ignore[call-overload]
            statements = [
                sql_("REVOKE ALL ON TABLE {} FROM {}").format(tables, who),
                sql_("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(schema, who),
                sql_("REVOKE ALL ON SCHEMA {} FROM {}").format(schema, who),
                sql_("REVOKE ALL ON FUNCTION {}.insert_only() FROM {}").format(schema, who),
            ]
            if roles:
                statements.append(sql_("GRANT USAGE ON SCHEMA {} TO {}").format(schema, sql_(", ").join(ident(r) for r in roles)))
            if writer is not None:
                statements += [
                    sql_("GRANT SELECT, INSERT ON TABLE {} TO {}").format(tables, ident(writer)),
                    sql_("GRANT UPDATE ON TABLE {}.approval_holds TO {}").format(schema, ident(writer)),
                    sql_("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(schema, ident(writer)),
                ]
            for reader in readers:
                statements.append(sql_("GRANT SELECT ON TABLE {} TO {}").format(tables, ident(reader)))
            for statement in statements:
                conn.execute(statement)
    except psycopg.Error as exc:
        raise ConfigError(f"{display_url(url)}: the approval tables' grants were not applied ({_first_line(exc)})") from None
    done = [f"approvals ({SCHEMA}): revoked every privilege from PUBLIC and {', '.join(roles)}"]
    if writer is not None:
        done.append(f"writer {writer}: SELECT, INSERT on {', '.join(TABLES)}; UPDATE on approval_holds (row locks only: "
                    "the triggers refuse every UPDATE)")
    done += [f"auditor {reader}: SELECT on {', '.join(TABLES)}" for reader in readers]
    return done
