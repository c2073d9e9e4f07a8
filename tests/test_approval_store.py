"""The `ApprovalStore` contract, run against every implementation (memory, a real SQLite file, a
real PostgreSQL database) so they cannot drift; then what only PostgreSQL promises: insert-only
tables including TRUNCATE, a schema of its own beside the ledger, single use across replicas, and
a ledger mark that exists exactly when its record does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from audit.errors import LedgerError
from audit.postgres import LinkedRow, PostgresLedger, PostgresLedgerReader
from audit.verify import verify_ledger
from gateway.stores.base import Approval
from gateway.stores.memory import MemoryApprovalStore
from gateway.stores.postgres_approvals import MARK_SQL, SCHEMA, TABLES, PostgresApprovalStore
from gateway.stores.sqlite_approvals import SqliteApprovalStore

STORES = ("memory", "sqlite", "postgres")


def held(approval_id: str, *, expires_in: float = 600.0, now: float | None = None) -> Approval:
    at = time.time() if now is None else now
    return Approval(id=approval_id, principal="operator", tool="delete_file", argument_digest="d" * 64,
                    policy_version="pv1", request_id=f"req_{approval_id}", reason="deleting a file",
                    created_at=at, expires_at=at + expires_in, arguments_preview='{"path":"a.txt"}')


async def open_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if kind == "memory":
        return MemoryApprovalStore()
    if kind == "sqlite":
        return SqliteApprovalStore(tmp_path / "approvals.db")
    return await PostgresApprovalStore.open(request.getfixturevalue("postgres_url"))


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    opened = await open_store(request.param, request, tmp_path)
    yield opened
    if hasattr(opened, "aclose"):
        await opened.aclose()


async def test_held_decided_once(store: Any) -> None:
    now = time.time()
    await store.create(held("apr_1", now=now))
    got = await store.get("apr_1")
    assert (got.state, got.principal, got.arguments_preview) == ("pending", "operator", '{"path":"a.txt"}')
    assert [a.id for a in await store.pending(now)] == ["apr_1"]
    decided = await store.decide("apr_1", approve=True, by="approver", now=now + 1, via="http", reason="ok")
    assert (decided.state, decided.decided_by) == ("approved", "approver")
    assert await store.pending(now) == []
    with pytest.raises(ValueError, match="approved, not pending"):
        await store.decide("apr_1", approve=False, by="approver", now=now + 2)
    with pytest.raises(KeyError):
        await store.decide("apr_nope", approve=True, by="approver", now=now)
    assert await store.get("apr_nope") is None


async def test_consume_is_single_use_and_needs_an_unexpired_approval(store: Any) -> None:
    now = time.time()
    for name in ("apr_ok", "apr_pending", "apr_denied", "apr_late"):
        await store.create(held(name, expires_in=10, now=now))
    await store.decide("apr_ok", approve=True, by="approver", now=now)
    await store.decide("apr_denied", approve=False, by="approver", now=now)
    await store.decide("apr_late", approve=True, by="approver", now=now)
    assert await store.consume("apr_ok", now=now) is True
    assert await store.consume("apr_ok", now=now) is False
    assert (await store.get("apr_ok")).state == "used"
    assert await store.consume("apr_pending", now=now) is False
    assert await store.consume("apr_denied", now=now) is False
    assert await store.consume("apr_late", now=now + 11) is False
    assert await store.consume("apr_nope", now=now) is False


async def test_expiry_is_one_event(store: Any) -> None:
    now = time.time()
    await store.create(held("apr_x", expires_in=5, now=now))
    await store.create(held("apr_y", expires_in=5, now=now))
    await store.expire("apr_x", now=now + 1)
    await store.expire("apr_x", now=now + 2)  # already expired: nothing more
    assert (await store.get("apr_x")).state == "expired"
    with pytest.raises(ValueError, match="expired, not pending"):  # a late decision finds it expired (and says so once)
        await store.decide("apr_y", approve=True, by="approver", now=now + 6)
    assert (await store.get("apr_y")).state == "expired"
    events = [(e.approval.id, e.event) for e in await store.unrecorded()]
    assert events == [("apr_x", "held"), ("apr_y", "held"), ("apr_x", "expired"), ("apr_y", "expired")]


async def test_unrecorded_in_order_marked_once_and_used_stays_out(store: Any) -> None:
    now = time.time()
    await store.create(held("apr_1", now=now))
    await store.decide("apr_1", approve=True, by="approver", now=now, via="cli", reason="checked")
    assert await store.consume("apr_1", now=now)
    events = await store.unrecorded()
    assert [(e.event, e.by, e.via, e.reason) for e in events] == [
        ("held", "operator", "gateway", "deleting a file"), ("approved", "approver", "cli", "checked")]
    assert events[0].approval.argument_digest == "d" * 64 and events[0].no < events[1].no
    await store.mark_recorded(events[0].no, 1, "aa" * 32)
    assert [e.event for e in await store.unrecorded()] == ["approved"]
    with pytest.raises(Exception, match="already recorded|UNIQUE|unique"):
        await store.mark_recorded(events[0].no, 2, "bb" * 32)
    await store.mark_recorded(events[1].no, 3, "cc" * 32)
    assert await store.unrecorded() == []  # `used` is not a ledger event
    async with store.recording():  # the claim every form offers (a no-op where one process records)
        pass


# ---- PostgreSQL only ---------------------------------------------------------------------------


async def test_postgres_tables_are_insert_only_including_truncate(postgres_url: str) -> None:
    store = await PostgresApprovalStore.open(postgres_url)
    try:
        await store.create(held("apr_t"))
        events = await store.unrecorded()
        await store.mark_recorded(events[0].no, 1, "aa" * 32)
    finally:
        await store.aclose()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for table in TABLES:
            for statement in (f"UPDATE {SCHEMA}.{table} SET {'seq = 0' if table == 'approval_recorded' else 'reason = reason'}",
                              f"DELETE FROM {SCHEMA}.{table}", f"TRUNCATE {SCHEMA}.{table} CASCADE"):
                with pytest.raises(psycopg.errors.RaiseException, match="insert-only"):
                    conn.execute(statement)
    store = await PostgresApprovalStore.open(postgres_url)  # opening again finds the tables as they were
    try:
        assert (await store.get("apr_t")).state == "pending"
    finally:
        await store.aclose()


async def test_postgres_approvals_sit_beside_the_ledger_in_either_order(postgres: Any, request: pytest.FixtureRequest) -> None:
    """Approvals first (e.g. `dharma approvals list` before any gateway ran), then the ledger: the
    ledger still finds a database with no tables of its own kind but its own, and opens."""
    url = postgres.new_database()
    request.addfinalizer(lambda: postgres.drop_database(url))
    store = await PostgresApprovalStore.open(url)
    ledger = await PostgresLedger.open(url)
    try:
        await store.create(held("apr_b"))
        [event] = await store.unrecorded()
        appended = await ledger.append_linked({"kind": "approval", "event": "held", "approval_id": "apr_b"},
                                              store.linked_mark(event.no))
        assert await store.unrecorded() == []
        with psycopg.connect(url) as conn:
            assert conn.execute(f"SELECT seq, hash FROM {SCHEMA}.approval_recorded").fetchall() == [
                (appended.seq, appended.hash)]
    finally:
        await ledger.aclose()
        await store.aclose()


async def test_postgres_record_and_mark_are_one_commit(postgres_url: str) -> None:
    """A mark that cannot be written takes its record with it: the ledger never holds an approval
    event its store does not know is recorded (so a copier that dies cannot leave one to copy twice)."""
    store = await PostgresApprovalStore.open(postgres_url)
    ledger = await PostgresLedger.open(postgres_url)
    try:
        await store.create(held("apr_m"))
        [event] = await store.unrecorded()
        await ledger.append_linked({"kind": "approval", "event": "held", "approval_id": "apr_m"}, store.linked_mark(event.no))
        size = ledger.size
        with pytest.raises(LedgerError, match="not committed"):  # the same event marked twice: refused, record and all
            await ledger.append_linked({"kind": "approval", "event": "held", "approval_id": "apr_m"},
                                       LinkedRow(MARK_SQL, (event.no,)))
        others = await asyncio.gather(*(ledger.append({"request_id": f"req-{i}"}) for i in range(5)))
        assert [a.seq for a in others] == list(range(size + 1, size + 6))  # the failed one took nothing with it
    finally:
        await ledger.aclose()
        await store.aclose()
    with PostgresLedgerReader(postgres_url) as reader:
        assert reader.size() == size + 5 and verify_ledger(reader).ok


async def test_postgres_single_use_across_replicas(postgres_url: str) -> None:
    """Two replicas (two stores, two connection pools) redeem the same approved ids at once:
    exactly one redemption of each succeeds."""
    a, b = await PostgresApprovalStore.open(postgres_url), await PostgresApprovalStore.open(postgres_url)
    now = time.time()
    ids = [f"apr_{i}" for i in range(20)]
    try:
        for approval_id in ids:
            await a.create(held(approval_id, now=now))
            await b.decide(approval_id, approve=True, by="approver", now=now)
        results = await asyncio.gather(*(s.consume(i, now=now) for i in ids for s in (a, b, a, b)))
        per_id = [results[k * 4:(k + 1) * 4] for k in range(len(ids))]
        assert all(sum(r) == 1 for r in per_id), per_id
        assert {(await b.get(i)).state for i in ids} == {"used"}
    finally:
        await a.aclose()
        await b.aclose()
