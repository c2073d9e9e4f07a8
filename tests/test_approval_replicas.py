"""Approvals across gateway replicas, with real parts: two or three Gateways sharing one real
PostgreSQL database (karma ledger and approvals) and one real Redis (wake-ups), the HTTP API
over ASGI, and `dharma approvals` as its own process.

A call held on replica A is released by a decision made through replica B at once, over Redis
pub/sub: the safety poll is set to 60 s, so only a wake-up can release it within the deadline.
With Redis stopped, the safety poll (short in that test) releases it. Approval events reach the
ledger exactly once however many replicas copy them concurrently, and an expiry noticed by
several replicas is one event.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from audit.postgres import PostgresLedgerReader
from audit.verify import verify_ledger
from gateway.stores.base import Approval, StoreUnavailable
from gateway.stores.memory import one_process_recording
from gateway.stores.postgres_approvals import RECORD_LOCK, SCHEMA
from tests.conftest import KEYS, OpenGateway, write_policy
from tests.test_approval_events import APPROVER, APPROVER_KEY, profile
from tests.test_cli import cli_env, dharma
from tests.test_http_api import client_for

WAKEUP_DEADLINE = 10.0
"""A release over pub/sub must come within this; the safety poll in those tests is 60 s."""
NO_POLL = 60.0
WAIT = 60.0
"""Generous deadline for conditions on a loaded 2-core machine."""


async def replicas(open_test_gateway: OpenGateway, tmp_path: Path, count: int, *, ledger_url: str,
                   redis_url: str | None = None, poll: float = NO_POLL, **approval: Any) -> list[Any]:
    """`count` Gateways on one PostgreSQL ledger (and one Redis, if given), as `dharma serve` replicas open them."""
    policy = write_policy(tmp_path / "policy", profile(**approval))
    settings: dict[str, Any] = {"ledger": {"url": ledger_url}, "approvals": {"poll_seconds": poll}}
    if redis_url is not None:
        settings["redis"] = {"url": redis_url}
    return [await open_test_gateway(policy, **settings) for _ in range(count)]


async def until(condition: Any, what: str, timeout: float = WAIT) -> Any:
    """Wait for `await condition()` to be truthy (checked every 20 ms); fail naming `what`."""
    with anyio.fail_after(timeout):
        while not (found := await condition()):
            await anyio.sleep(0.02)
    assert found, what
    return found


def ledger_records(url: str) -> list[dict[str, Any]]:
    with PostgresLedgerReader(url) as reader:
        assert verify_ledger(reader).ok
        return [reader.get(seq).to_dict() for seq in range(1, reader.size() + 1)]  # type: ignore[union-attr]


def approval_events(url: str, approval_id: str | None = None) -> list[tuple[str, str]]:
    return [(r["approval_id"], r["event"]) for r in ledger_records(url)
            if r.get("kind") == "approval" and approval_id in (None, r["approval_id"])]


async def held_on(gw: Any, other: Any, path: str) -> tuple[asyncio.Task[Any], str]:
    """Start a call on `gw` that a rule holds for approval; return it and its approval id once `other` lists it."""
    task = asyncio.create_task(gw.call("delete_file", {"path": path}, api_key=KEYS["operator"]))
    listed = await until(lambda: other.pending_approvals(), "the held call is listed on the other replica")
    return task, listed[0].id


async def test_approved_through_b_releases_the_call_held_on_a(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, redis_url: str
) -> None:
    a, b = await replicas(open_test_gateway, tmp_path, 2, ledger_url=postgres_url, redis_url=redis_url, hold_seconds=300)
    (sandbox / "a.txt").write_text("a", encoding="utf-8")
    task, approval_id = await held_on(a, b, "a.txt")
    async with client_for(b) as http:
        started = time.monotonic()
        decided = await http.post(f"/v1/approvals/{approval_id}:approve", headers=APPROVER, json={"reason": "ok"})
        assert decided.status_code == 200, decided.text
        with anyio.fail_after(WAKEUP_DEADLINE):
            outcome = await task
    released = time.monotonic() - started
    assert outcome.status.value == "ok" and outcome.approval_id == approval_id, outcome.message
    assert released < WAKEUP_DEADLINE < NO_POLL
    assert not (sandbox / "a.txt").exists()
    assert approval_events(postgres_url, approval_id) == [(approval_id, "held"), (approval_id, "approved")]
    assert (await b.approvals.get(approval_id)).state == "used"


async def test_denied_by_the_cli_releases_the_call_held_on_a(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, state_root: Path, redis_url: str
) -> None:
    a, b = await replicas(open_test_gateway, tmp_path, 2, ledger_url=postgres_url, redis_url=redis_url, hold_seconds=300)
    (sandbox / "d.txt").write_text("d", encoding="utf-8")
    task, approval_id = await held_on(a, b, "d.txt")
    env = cli_env(state_root, DHARMA_LEDGER__URL=postgres_url, DHARMA_REDIS__URL=redis_url)
    listed = await anyio.to_thread.run_sync(lambda: dharma("approvals", "list", "--json", state_root=state_root, env=env))
    assert listed.rc == 0 and approval_id in listed.out, listed.err
    started = time.monotonic()
    denied = await anyio.to_thread.run_sync(lambda: dharma(
        "approvals", "deny", approval_id, "--policy", tmp_path / "policy" / "profile.yaml", "--api-key", APPROVER_KEY,
        "--reason", "not today", state_root=state_root, env=env))
    assert denied.rc == 0 and "denied by approver" in denied.out and "woken over Redis" in denied.out, denied.err
    with anyio.fail_after(WAKEUP_DEADLINE):
        outcome = await task
    assert time.monotonic() - started < WAKEUP_DEADLINE < NO_POLL
    assert outcome.error_code is not None and outcome.error_code.value == "approval_denied", outcome.message
    assert (sandbox / "d.txt").exists()
    assert approval_events(postgres_url, approval_id) == [(approval_id, "held"), (approval_id, "denied")]


async def test_a_lost_wakeup_is_made_good_by_the_safety_poll(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, redis_url: str
) -> None:
    """A decision whose wake-up never arrives (lost while Redis was away, or never sent) still
    releases the held call: the holder reads the decision from PostgreSQL at its safety poll.

    (With Redis itself down the call would not be released into a forward: every call that needs
    shared state fails closed then; see tests/test_shared_state.py.)"""
    a, b = await replicas(open_test_gateway, tmp_path, 2, ledger_url=postgres_url, redis_url=redis_url,
                          poll=0.3, hold_seconds=300)
    (sandbox / "s.txt").write_text("s", encoding="utf-8")
    task, approval_id = await held_on(a, b, "s.txt")
    await b.approvals.decide(approval_id, approve=True, by="approver", now=time.time(), via="api")  # no wake-up sent
    with anyio.fail_after(WAIT):
        outcome = await task
    assert outcome.status.value == "ok", outcome.message
    assert approval_events(postgres_url, approval_id) == [(approval_id, "held"), (approval_id, "approved")]


async def test_wakeups_resume_after_redis_comes_back(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, own_redis: Any
) -> None:
    a, b = await replicas(open_test_gateway, tmp_path, 2, ledger_url=postgres_url, redis_url=own_redis.url,
                          hold_seconds=300)
    (sandbox / "r.txt").write_text("r", encoding="utf-8")
    task, approval_id = await held_on(a, b, "r.txt")  # held while the subscription is live
    own_redis.stop()
    own_redis.start()
    await b.approve(approval_id, by="approver")
    with anyio.fail_after(WAKEUP_DEADLINE):  # resubscribed and woken (or woken by the resubscription itself)
        outcome = await task
    assert outcome.status.value == "ok", outcome.message


# ---- copying approval events into the ledger: exactly once across replicas ---------------------


def binding(approval_id: str) -> Approval:
    now = time.time()
    return Approval(id=approval_id, principal="operator", tool="delete_file", argument_digest="d" * 64,
                    policy_version="pv", request_id=f"req_{approval_id}", reason="deleting a file",
                    created_at=now, expires_at=now + 600)


async def make_events(gws: list[Any], round_no: int) -> None:
    """Events appended through different replicas, none copied into the ledger yet."""
    for i in range(6):
        approval_id = f"apr_{round_no}_{i}"
        await gws[i % 3].approvals.create(binding(approval_id))
        if i % 3 == 0:
            await gws[(i + 1) % 3].approvals.decide(approval_id, approve=True, by="approver", now=time.time())
        elif i % 3 == 1:
            await gws[(i + 2) % 3].approvals.decide(approval_id, approve=False, by="approver", now=time.time())
        else:
            await gws[i % 3].approvals.expire(approval_id)


def store_events(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT approval_id, event FROM {SCHEMA}.approval_events WHERE event <> 'used' ORDER BY no").fetchall()


def assert_each_once(url: str) -> None:
    expected = store_events(url)
    in_ledger = approval_events(url)  # verifies the chain too
    assert Counter(in_ledger) == Counter(expected) and len(set(in_ledger)) == len(in_ledger)
    assert in_ledger == expected  # and in the store's order
    with psycopg.connect(url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {SCHEMA}.approval_recorded").fetchone()[0] == len(expected)


async def test_three_replicas_syncing_at_once_record_each_event_once(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path
) -> None:
    gws = await replicas(open_test_gateway, tmp_path, 3, ledger_url=postgres_url)
    for round_no in range(4):
        await make_events(gws, round_no)
        await asyncio.gather(*(gw.approval_recorder.sync() for gw in gws for _ in range(3)))
    assert len(store_events(postgres_url)) == 4 * 6 * 2
    assert_each_once(postgres_url)
    verified = await anyio.to_thread.run_sync(lambda: dharma(
        "audit", "verify", state_root=tmp_path / "state", env=cli_env(tmp_path / "state", DHARMA_LEDGER__URL=postgres_url)))
    assert verified.rc == 0, verified.out + verified.err


async def test_without_the_copy_lock_the_mark_still_keeps_each_event_once(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock only spares work: with it gone, replicas race to copy the same events and the mark,
    written in the record's own transaction under a primary key, lets exactly one copy commit."""
    gws = await replicas(open_test_gateway, tmp_path, 3, ledger_url=postgres_url)
    for gw in gws:
        monkeypatch.setattr(gw.approvals, "recording", one_process_recording)
    for round_no in range(3):
        await make_events(gws, round_no)
        await asyncio.gather(*(gw.approval_recorder.try_sync() for gw in gws for _ in range(2)))
    assert await gws[0].approval_recorder.try_sync()  # whatever a lost race left is copied now
    assert_each_once(postgres_url)


async def test_a_replica_dying_while_copying_releases_its_claim(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path
) -> None:
    """Replica C holds the copy lock and dies (its PostgreSQL session is killed): B's copy goes on,
    and nothing C had in flight is half-written (record and mark are one commit)."""
    b, c = await replicas(open_test_gateway, tmp_path, 2, ledger_url=postgres_url)
    await make_events([b, c, b], 0)
    entered, never = asyncio.Event(), asyncio.Event()

    async def c_copies() -> None:
        async with c.approvals.recording():
            entered.set()
            await never.wait()

    c_task = asyncio.create_task(c_copies())
    b_sync: asyncio.Task[None] | None = None
    lock = (RECORD_LOCK >> 32, RECORD_LOCK & 0xFFFFFFFF)

    async def b_waits() -> bool:
        with psycopg.connect(postgres_url) as conn:
            return conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                "AND classid = %s AND objid = %s", lock).fetchone()[0] == 1
    try:
        await entered.wait()
        b_sync = asyncio.create_task(b.approval_recorder.sync())
        await until(b_waits, "B waits for the copy lock C holds")
        assert not b_sync.done()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                                  "AND classid = %s AND objid = %s", lock).fetchall()
        assert killed == [(True,)]
        with anyio.fail_after(WAIT):
            await b_sync
    finally:  # whatever failed above, let C's task end so the gateways can close
        never.set()
        if b_sync is not None and not b_sync.done():
            b_sync.cancel()
    with pytest.raises(StoreUnavailable, match="PostgreSQL approvals store"):
        await c_task
    assert_each_once(postgres_url)
    assert await c.approval_recorder.try_sync()  # C's store reconnects for its next copy


# ---- expiry ------------------------------------------------------------------------------------


async def test_an_expiry_noticed_by_several_replicas_is_recorded_once(
    postgres_url: str, open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path
) -> None:
    a, b, c = await replicas(open_test_gateway, tmp_path, 3, ledger_url=postgres_url, expires_seconds=1)
    first = await a.call("delete_file", {"path": "e.txt"}, api_key=KEYS["operator"])
    approval_id = first.approval_id
    assert first.error_code is not None and first.error_code.value == "approval_required"
    expires_at = (await b.approvals.get(approval_id)).expires_at

    async def expired() -> bool:
        return time.time() > expires_at
    await until(expired, "the approval's expiry passes")
    outcomes = await asyncio.gather(
        *(gw.call("delete_file", {"path": "e.txt"}, api_key=KEYS["operator"], approval_id=approval_id) for gw in (a, b, c)),
        c.approvals.expire(approval_id), a.approvals.expire(approval_id),
    )
    assert {o.error_code.value for o in outcomes[:3]} == {"approval_timeout"}
    await asyncio.gather(*(gw.approval_recorder.sync() for gw in (a, b, c)))
    assert approval_events(postgres_url, approval_id) == [(approval_id, "held"), (approval_id, "expired")]
    assert_each_once(postgres_url)
