"""Three `dharma serve` replicas behind one address (issue 8): one ledger, one limit, approvals and
state shared through real PostgreSQL and Redis, and no acknowledged call lost when a replica is
killed or Redis stops.

The client spreads calls round-robin over the replicas itself. Every acknowledged answer carries a
receipt; at the end each receipt must verify against the one JWKS and name a ledger record with
its request id, and `dharma audit verify` must pass on the shared ledger.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from audit.postgres import PostgresLedgerReader
from gateway.crypto.receipts import check_receipt_in_ledger, verify_receipt
from tests.conftest import KEYS
from tests.replicas.cluster import Cluster
from tests.replicas.conftest import MakeCluster
from tests.test_cli import dharma

OPERATOR = {"authorization": f"Bearer {KEYS['operator']}"}
ADMIN = {"authorization": f"Bearer {KEYS['admin']}"}
DEADLINE_S = 300.0


@dataclass
class Tally:
    """What the clients saw: acknowledged envelopes (with receipts) and counts by outcome."""

    acked: list[dict[str, Any]] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    transport_errors: int = 0

    def add(self, envelope: dict[str, Any]) -> None:
        self.acked.append(envelope)
        self.outcomes[envelope.get("error_code") or envelope["status"]] += 1


async def call(http: httpx.AsyncClient, url: str, tool: str, path: str, *, headers: dict[str, str] = OPERATOR,
               **extra: Any) -> dict[str, Any]:
    answer = await http.post(f"{url}/v1/tools/{tool}:call", json={"arguments": {"path": path}, **extra}, headers=headers)
    envelope: dict[str, Any] = answer.json()
    assert "receipt" in envelope or answer.status_code >= 400, answer.text
    return envelope


async def approve(http: httpx.AsyncClient, url: str, approval_id: str) -> None:
    answer = await http.post(f"{url}/v1/approvals/{approval_id}:approve", json={"reason": "replica test"}, headers=ADMIN)
    assert answer.status_code == 200, answer.text


def check_ledger(cluster: Cluster, tally: Tally, jwks: dict[str, Any]) -> None:
    """Every acknowledged receipt verifies and names its record; the shared ledger verifies."""
    reader = PostgresLedgerReader(cluster.ledger_url)
    try:
        for envelope in tally.acked:
            if not envelope.get("receipt"):
                continue
            payload = verify_receipt(envelope["receipt"], jwks)
            assert payload["request_id"] == envelope["request_id"]
            check_receipt_in_ledger(payload, reader.get(payload["ledger"]["seq"]))
    finally:
        reader.close()
    verify = dharma("audit", "verify", "--ledger", cluster.ledger_url, state_root=cluster.state_root, timeout=600)
    assert verify.rc == 0 and verify.out.startswith("OK"), verify.out + verify.err


async def one_jwks(http: httpx.AsyncClient, cluster: Cluster) -> dict[str, Any]:
    """The JWKS, which every replica must publish identically (one key set)."""
    sets = [(await http.get(url + "/.well-known/jwks.json")).json() for url in cluster.urls]
    assert all(s == sets[0] for s in sets), "replicas publish different keys"
    return sets[0]


async def test_ten_thousand_calls_one_ledger(cluster: MakeCluster) -> None:
    """10,000 calls, allowed, denied and held (approved on another replica, redeemed on a third)."""
    c = await cluster(3)
    tally = Tally()
    names = itertools.count()
    total = 10_000
    async with httpx.AsyncClient(timeout=60) as http:

        async def client(offset: int) -> None:
            for i in iter(lambda: next(names), None):
                if i >= total:
                    return
                url = c.urls[(i + offset) % 3]
                if i % 20 == 7:  # held: approval_required, approved through the next replica, redeemed on the one after
                    held = await call(http, url, "delete_note", f"n{i}")
                    assert held["status"] == "pending_approval", (held["error_code"], held["message"])
                    tally.add(held)
                    await approve(http, c.urls[(i + offset + 1) % 3], held["approval_id"])
                    done = await call(http, c.urls[(i + offset + 2) % 3], "delete_note", f"n{i}", approval_id=held["approval_id"])
                    assert done["status"] == "ok", (done.get("error_code"), done.get("message"))
                    tally.add(done)
                elif i % 5 == 3:
                    denied = await call(http, url, "write_note", f"../n{i}")
                    assert denied["error_code"] == "policy_blocked", denied
                    tally.add(denied)
                else:
                    ok = await call(http, url, "write_note", f"n{i}")
                    assert ok["status"] == "ok", (ok.get("error_code"), ok.get("message"))
                    tally.add(ok)

        await asyncio.wait_for(asyncio.gather(*(client(k) for k in range(12))), DEADLINE_S)
        jwks = await one_jwks(http, c)
    assert tally.outcomes["ok"] == total - total // 5 - total // 20 + total // 20  # every allowed and redeemed call
    assert tally.outcomes["policy_blocked"] == total // 5 and tally.outcomes["approval_required"] == total // 20, tally.outcomes
    check_ledger(c, tally, jwks)


async def test_a_global_limit_holds_across_replicas(cluster: MakeCluster) -> None:
    """One limit of RATE calls/s on a tool, hammered through three replicas: the calls allowed stay
    within 1 % of what GCRA allows over the time the checks ran.

    The limiter checks on Redis's clock, somewhere between a call's send and its answer, so the
    window is bracketed: at most burst + rate × (last answer − first send), at least burst + rate ×
    (last send − first answer) while the clients keep the limit saturated (far more demand than
    RATE: 24 clients, back to back). RATE is low so a busy 2-core machine still outruns it.
    """
    rate, burst, seconds = 20.0, 20, 10.0
    c = await cluster(3, rate_limits=[{"id": "notes-global", "key": ["tool"], "tools": ["write_note"], "rate": rate,
                                         "per_seconds": 1, "burst": burst}])
    allowed = limited = 0
    sends: list[float] = []
    answers: list[float] = []
    names = itertools.count()
    async with httpx.AsyncClient(timeout=60) as http:
        start = time.monotonic()

        async def client(offset: int) -> None:
            nonlocal allowed, limited
            while time.monotonic() - start < seconds:
                i = next(names)
                sends.append(time.monotonic())
                envelope = await call(http, c.urls[(i + offset) % 3], "write_note", f"g{i}")
                answers.append(time.monotonic())
                if envelope["status"] == "ok":
                    allowed += 1
                else:
                    assert envelope["error_code"] == "rate_limited", envelope
                    limited += 1

        await asyncio.gather(*(client(k) for k in range(24)))
    most = burst + rate * (max(answers) - min(sends))
    least = burst + rate * (max(sends) - min(answers))
    assert limited > allowed, f"the clients did not outrun the limit ({allowed} allowed, {limited} limited)"
    assert least * 0.99 <= allowed <= most * 1.01, f"{allowed} calls allowed; GCRA allows {least:.1f} to {most:.1f}"


async def test_a_call_held_on_one_replica_is_released_through_another(cluster: MakeCluster) -> None:
    c = await cluster(3, approval={"hold_seconds": 120})
    async with httpx.AsyncClient(timeout=180) as http:
        held = asyncio.create_task(call(http, c.urls[0], "delete_note", "held-note"))
        deadline = time.monotonic() + 60
        while True:
            pending = (await http.get(c.urls[1] + "/v1/approvals", headers=ADMIN)).json()["approvals"]
            if pending:
                break
            assert not held.done(), held.result()
            assert time.monotonic() < deadline, "the held call never showed up on the other replica"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        await approve(http, c.urls[1], pending[0]["id"])
        envelope = await asyncio.wait_for(held, 60)
        released_after = time.monotonic() - started
    assert envelope["status"] == "ok" and envelope["result"], envelope
    assert released_after < 30, released_after


async def test_kill_9_one_replica_mid_load(cluster: MakeCluster) -> None:
    """The survivors keep serving; no acknowledged call is missing from the ledger."""
    c = await cluster(3)
    tally = Tally()
    names = itertools.count()
    killed = asyncio.Event()
    after_kill = 0
    async with httpx.AsyncClient(timeout=60) as http:

        async def client(offset: int) -> None:
            nonlocal after_kill
            while after_kill < 300:
                i = next(names)
                target = (i + offset) % 3
                if killed.is_set() and target == 1:
                    continue  # a balancer takes the dead replica out; so does this client
                try:
                    envelope = await call(http, c.urls[target], "write_note", f"k{i}")
                except httpx.TransportError:
                    tally.transport_errors += 1  # the killed replica, mid-call: not acknowledged
                    continue
                assert envelope["status"] == "ok", (envelope.get("error_code"), envelope.get("message"))
                tally.add(envelope)
                if killed.is_set():
                    after_kill += 1
                elif len(tally.acked) >= 300:
                    c.kill(1)
                    killed.set()

        await asyncio.wait_for(asyncio.gather(*(client(k) for k in range(12))), DEADLINE_S)
        jwks = await one_jwks(http, type("Survivors", (), {"urls": [c.urls[0], c.urls[2]]})())  # type: ignore[arg-type]
    assert not c.replicas[1].alive and c.replicas[0].alive and c.replicas[2].alive
    check_ledger(c, tally, jwks)


async def test_redis_stops_for_five_seconds_mid_load(cluster: MakeCluster) -> None:
    """Refusals naming Redis while it is down, then recovery by itself; nothing acknowledged is lost."""
    c = await cluster(3, rate_limits=[{"id": "per-principal", "key": ["principal"], "rate": 10_000, "burst": 10_000}])
    tally = Tally()
    names = itertools.count()
    phase = "before"
    seen: Counter[str] = Counter()
    async with httpx.AsyncClient(timeout=60) as http:

        async def client(offset: int) -> None:
            while phase != "done":
                i = next(names)
                envelope = await call(http, c.urls[(i + offset) % 3], "write_note", f"r{i}")
                if envelope["status"] == "ok":
                    tally.add(envelope)
                    seen[f"ok-{phase}"] += 1
                else:
                    assert "redis" in envelope["message"].lower(), envelope
                    assert envelope["retryable"], envelope
                    seen[f"refused-{phase}"] += 1
                    await asyncio.sleep(0.01)

        clients = [asyncio.create_task(client(k)) for k in range(9)]
        deadline = time.monotonic() + 120
        while seen["ok-before"] < 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        c.redis.stop()  # type: ignore[attr-defined]
        phase = "down"
        outage = time.monotonic()
        while seen["refused-down"] < 30 or time.monotonic() - outage < 5:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        c.redis.start()  # type: ignore[attr-defined]
        phase = "after"
        while seen["ok-after"] < 200:
            assert time.monotonic() < deadline, f"no recovery after Redis came back: {seen}"
            await asyncio.sleep(0.05)
        phase = "done"
        await asyncio.wait_for(asyncio.gather(*clients), 60)
        health = [(await http.get(url + "/healthz")).status_code for url in c.urls]
        jwks = await one_jwks(http, c)
    assert health == [200, 200, 200]
    assert seen["refused-down"] >= 30 and seen["ok-down"] < seen["refused-down"], seen
    check_ledger(c, tally, jwks)
