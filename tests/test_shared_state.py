"""Shared state for replicas (issue 8): the memory and Redis stores behind one contract, several
Gateways sharing one real Redis (limits, breaker, idempotent replay, session history), and a
Redis outage (stopped, then hung) that refuses calls without forwarding and recovers by itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.sqlite import SqliteLedger
from gateway.config import RedisSettings, Settings
from gateway.core.call import Status
from gateway.core.errors import ErrorCode
from gateway.core.gateway import Gateway
from gateway.crypto.receipts import KeyStore
from gateway.policy.compile import load_policy
from gateway.runtime import open_gateway as open_runtime_gateway
from gateway.runtime import shared_stores
from gateway.stores import redis as rs
from gateway.stores.base import OidcFlowRecord
from gateway.stores.memory import (MemoryBreakerStore, MemoryIdempotencyStore, MemoryLimiterStore, MemoryUiSessionStore,
                                   SessionHistory)
from gateway.transports.http_api.app import build_app
from tests.helpers import Recorder, text_result, write_policy

DEADLINE = 30.0
TIERS = """\
tiers:
  - name: reader
    grants: [{tools: ["read_*", "shell"]}]
  - name: writer
    inherits: reader
    grants: [{tools: ["write_*"]}]
"""
SEQUENCE_RULES = {
    "call.yaml": """\
        apiVersion: dharma/v1
        kind: RuleSet
        metadata: {name: call}
        rules:
          - id: no-shell-after-read
            tools: ["shell"]
            when: '"read_secret" in session.tools'
            effect: deny
          - id: karma-brake
            tools: ["shell"]
            when: 'principal.karma.denials >= 2'
            effect: deny
          - id: no-traversal
            tools: ["read_*"]
            when: 'has(args.path) && args.path.contains("..")'
            effect: deny
        """
}


async def wait_for(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` after a generous deadline."""
    deadline = time.monotonic() + DEADLINE
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# ---- one contract, two implementations -----------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    """The limiter, breaker, idempotency, history and /ui session stores of one kind."""
    if request.param == "memory":
        yield {"limiter": MemoryLimiterStore(), "breaker": MemoryBreakerStore(),
               "idempotency": MemoryIdempotencyStore(), "history": SessionHistory(depth=3, window=60.0),
               "ui": MemoryUiSessionStore()}
        return
    link = rs.connect(RedisSettings(url=request.getfixturevalue("redis_url")))
    try:
        yield {"limiter": rs.RedisLimiterStore(link), "breaker": rs.RedisBreakerStore(link),
               "idempotency": rs.RedisIdempotencyStore(link, 60.0), "history": rs.RedisHistory(link, depth=3, window=60.0),
               "ui": rs.RedisUiSessionStore(link), "link": link}
    finally:
        await link.aclose()


async def test_limiter_contract_burst_spacing_cost_and_keys(stores: dict[str, Any]) -> None:
    limiter = stores["limiter"]

    async def take(key: str, cost: int = 1) -> float:  # a long interval: the wall clock cannot refill it mid-test
        return await limiter.acquire(key, interval=100.0, burst=3, cost=cost, now=time.time())

    assert [await take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = await take("k")
    assert 99.0 < wait <= 100.0  # retry_after: one interval away
    assert await take("other") == 0.0  # keys are independent
    assert await take("costly", cost=3) == 0.0 and await take("costly") > 0  # a weight spends the burst at once
    assert await take("free", cost=0) == 0.0 and [await take("free") for _ in range(3)] == [0.0, 0.0, 0.0]


async def test_breaker_contract(stores: dict[str, Any]) -> None:
    breaker = stores["breaker"]
    for _ in range(3):
        assert await breaker.admit("b", now=0.0, reset_seconds=10) == 0.0
        await breaker.record("b", ok=False, now=0.0, threshold=3)
    assert await breaker.check("b", now=5.0, reset_seconds=10) == 5.0
    assert await breaker.check("other", now=5.0, reset_seconds=10) == 0.0
    assert await breaker.admit("b", now=5.0, reset_seconds=10) == 5.0
    assert await breaker.check("b", now=10.0, reset_seconds=10) == 0.0  # checks claim nothing
    assert await breaker.admit("b", now=10.0, reset_seconds=10) == 0.0  # the one probe
    assert await breaker.check("b", now=10.0, reset_seconds=10) == 1.0 and await breaker.admit("b", now=10.0, reset_seconds=10) == 1.0
    await breaker.release("b")
    assert await breaker.admit("b", now=10.5, reset_seconds=10) == 0.0  # released: the next call probes
    await breaker.record("b", ok=False, now=11.0, threshold=3)  # a failed probe reopens at once
    assert await breaker.check("b", now=12.0, reset_seconds=10) == 9.0
    assert await breaker.admit("b", now=21.0, reset_seconds=10) == 0.0
    await breaker.record("b", ok=True, now=21.0, threshold=3)
    assert await breaker.admit("b", now=21.0, reset_seconds=10) == 0.0 and await breaker.admit("b", now=21.0, reset_seconds=10) == 0.0


async def test_idempotency_contract(stores: dict[str, Any]) -> None:
    store = stores["idempotency"]
    value = {"argument_digest": "d", "result": {"content": [], "n": [1, 2.5, None, "é"]}, "disclosure": None}
    assert await store.get("k") is None
    await store.put("k", value)
    assert await store.get("k") == value
    assert await store.get("k2") is None


async def test_an_sso_login_under_way_is_taken_once_whatever_the_race(stores: dict[str, Any]) -> None:
    store, now = stores["ui"], time.time()
    flow = OidcFlowRecord(state="s", nonce="n", verifier="v", expires_at=now + 600)
    await store.put_flow("flow-id", flow)
    taken = await asyncio.gather(*(store.take_flow("flow-id", now) for _ in range(20)))
    assert [t for t in taken if t is not None] == [flow]  # one callback gets it; the others find nothing
    assert await store.take_flow("flow-id", now) is None
    await store.put_flow("late", flow)
    assert await store.take_flow("late", now + 601) is None and await store.take_flow("late", now) is None  # lapsed, and used up
    if "link" in stores:  # Redis keeps a digest of the id (the cookie's secret), expiring with the flow
        await store.put_flow("flow-id", flow)
        client = stores["link"].client
        keys = await client.keys("dharma:ui-oidc:*")
        assert len(keys) == 1 and b"flow-id" not in keys[0]
        assert 0 < await client.pttl(keys[0]) <= 600_000


async def test_history_contract(stores: dict[str, Any]) -> None:
    history = stores["history"]
    now = time.time()
    for i, tool in enumerate(["a", "b", "c", "d"]):
        await history.record(session_id="s1", principal="p", tool=tool, decision="deny" if i % 2 else "allow",
                             denied=bool(i % 2), now=now - 150 + i * 50, time=f"t{i}")
    session, karma = await history.read("s1", "p", now)
    assert [c["tool"] for c in session] == ["b", "c", "d"]  # the last `depth`, oldest first
    assert session[-1] == {"tool": "d", "decision": "deny", "time": "t3"}
    assert karma == {"calls": 2, "denials": 1}  # only the window's last 60 s: c (allowed) and d (denied)
    assert await history.read(None, "nobody", now) == ([], {"calls": 0, "denials": 0})


# ---- Redis specifics --------------------------------------------------------------------------


async def test_limit_keys_use_redis_time_and_expire_once_idle(redis_url: str) -> None:
    link = rs.connect(RedisSettings(url=redis_url))
    try:
        limiter = rs.RedisLimiterStore(link)
        # callers' clocks an hour apart share one limit: the script reads Redis's clock
        assert await limiter.acquire("k", interval=0.2, burst=1, cost=1, now=time.time()) == 0.0
        assert await limiter.acquire("k", interval=0.2, burst=1, cost=1, now=time.time() + 3600) > 0
        key = link.key("rl", "k")
        assert 0 < await link.client.pttl(key) <= 200

        async def gone() -> bool:
            return not await link.client.exists(key)

        await wait_for(gone, "an idle limit key to expire")
        assert await limiter.acquire("k", interval=0.2, burst=1, cost=1, now=0.0) == 0.0
    finally:
        await link.aclose()


# ---- several Gateways sharing one Redis -------------------------------------------------------


Replicas = Callable[..., Awaitable[list[Gateway]]]


@pytest.fixture
async def replicas(tmp_path: Path, redis_url: str) -> AsyncIterator[Replicas]:
    """Opens N Gateways over one Redis (as N replicas would), each with its own ledger unless
    `shared_ledger`; all closed after the test."""
    opened: list[Gateway] = []
    ledgers: list[SqliteLedger] = []

    async def make(n: int, profile: str, backends: Callable[[], list[Any]], *, rules: dict[str, str] | None = None,
                   shared_ledger: bool = False, clock: Callable[[], float] = time.time) -> list[Gateway]:
        policy = load_policy(write_policy(tmp_path, profile, rules))
        settings = Settings(redis={"url": redis_url})
        common = await SqliteLedger.open(tmp_path / "ledger.db") if shared_ledger else None
        for i in range(n):
            ledger = common or await SqliteLedger.open(tmp_path / f"ledger-{i}.db")
            ledgers.append(ledger)
            opened.append(Gateway(policy, backends(), ledger=ledger, keys=KeyStore.open(tmp_path / f"state-{i}"),
                                  clock=clock, **shared_stores(settings)))
        return opened[-n:]

    yield make
    for gw in opened:
        await gw.aclose()
    for ledger in ledgers:
        await ledger.aclose()


async def test_a_global_limit_holds_within_one_percent_across_three_gateways(replicas: Replicas) -> None:
    rate, burst, seconds = 60.0, 30, 6.0
    profile = TIERS + (f"rate_limits:\n  - {{id: global, key: [tool], tools: [read_file], rate: {rate}, per_seconds: 1,"
                       f" burst: {burst}}}\n")
    recorder = Recorder()
    tools = {"read_file": lambda path: text_result(path), "read_other": lambda path: text_result(path)}
    gateways = await replicas(3, profile, lambda: [recorder.backend(tools)])
    for gw in gateways:  # warm up everything but the limit (script load, first ledger write), so the clock starts fair
        assert (await gw.call("read_other", {"path": "a"}, api_key="alice-key")).status is Status.OK
    recorder.calls.clear()
    counts = {"ok": 0, "limited": 0}
    starts: list[float] = []
    ends: list[float] = []
    stop_at = time.monotonic() + seconds

    async def client(gw: Gateway) -> None:
        while time.monotonic() < stop_at:
            starts.append(time.monotonic())
            outcome = await gw.call("read_file", {"path": "a"}, api_key="alice-key")
            ends.append(time.monotonic())
            if outcome.status is Status.OK:
                counts["ok"] += 1
            else:
                assert outcome.error_code is ErrorCode.RATE_LIMITED and outcome.decision.retry_after > 0, outcome.message
                counts["limited"] += 1

    await asyncio.gather(*(client(gw) for gw in gateways for _ in range(4)))
    # Every check lies between the first call's start and the last call's end, and the first
    # check comes before the first call ends, the last after the last call starts. GCRA allows
    # the burst plus `rate` a second over the span of the checks, so the count lies between:
    most = burst + rate * (max(ends) - min(starts))
    least = burst + rate * (max(starts) - min(ends))
    assert counts["limited"] > counts["ok"], "the clients did not press the limit; the test proves nothing"
    assert counts["ok"] == len(recorder.calls)
    assert 0.99 * least <= counts["ok"] <= most + 1, (counts, least, most)


async def test_breaker_open_on_one_gateway_is_open_on_all(replicas: Replicas) -> None:
    now = [1000.0]
    recorder = Recorder()
    mode = {"now": "fail"}
    gate, probe_sent = asyncio.Event(), asyncio.Event()

    async def read_file(path: str) -> Any:
        if mode["now"] == "fail":
            raise RuntimeError("disk on fire")
        if mode["now"] == "slow":
            probe_sent.set()
            await gate.wait()
        return text_result(path)

    profile = TIERS + "circuit_breaker: {failure_threshold: 2, reset_seconds: 5}\n"
    a, b = await replicas(2, profile, lambda: [recorder.backend({"read_file": read_file})], clock=lambda: now[0])
    for _ in range(2):
        assert (await a.call("read_file", {"path": "x"}, api_key="alice-key")).error_code is ErrorCode.BACKEND_ERROR
    reached = len(recorder.calls)
    refused = await b.call("read_file", {"path": "x"}, api_key="alice-key")
    assert refused.error_code is ErrorCode.BACKEND_UNAVAILABLE and "is failing" in refused.message
    assert len(recorder.calls) == reached  # b never sent it
    now[0] += 6
    mode["now"] = "slow"  # a's probe stays in flight until the gate opens
    probe = asyncio.create_task(a.call("read_file", {"path": "x"}, api_key="alice-key"))
    await probe_sent.wait()
    held_off = await b.call("read_file", {"path": "x"}, api_key="alice-key")  # half-open: one probe across both
    assert held_off.error_code is ErrorCode.BACKEND_UNAVAILABLE
    mode["now"] = "ok"
    gate.set()
    assert (await probe).status is Status.OK
    assert (await b.call("read_file", {"path": "x"}, api_key="alice-key")).status is Status.OK


async def test_a_retry_on_another_gateway_replays_the_stored_answer(replicas: Replicas) -> None:
    recorder = Recorder()
    count = {"n": 0}

    def write_file(path: str, content: str) -> Any:
        count["n"] += 1
        return text_result(f"wrote {content} #{count['n']}")

    a, b = await replicas(2, TIERS, lambda: [recorder.backend({"write_file": write_file})], shared_ledger=True)
    first = await a.call("write_file", {"path": "p", "content": "v"}, api_key="bob-key", idempotency_key="k-1")
    again = await b.call("write_file", {"path": "p", "content": "v"}, api_key="bob-key", idempotency_key="k-1")
    assert first.status is again.status is Status.OK
    assert again.result == first.result == text_result("wrote v #1") and count["n"] == 1
    assert any("replayed" in w for w in again.warnings)
    other = await b.call("write_file", {"path": "p", "content": "w"}, api_key="bob-key", idempotency_key="k-1")
    assert other.error_code is ErrorCode.INVALID_PARAMS and count["n"] == 1
    assert first.ledger_seq is not None and again.ledger_seq is not None and again.ledger_seq > first.ledger_seq


async def test_sequence_and_karma_rules_see_calls_made_on_other_gateways(replicas: Replicas) -> None:
    recorder = Recorder()
    tools = {"read_secret": lambda path: text_result("s"), "read_file": lambda path: text_result(path),
             "shell": lambda command: text_result("ok")}
    a, b, c = await replicas(3, TIERS, lambda: [recorder.backend(tools)], rules=SEQUENCE_RULES)
    assert (await a.call("shell", {"command": "ls"}, api_key="alice-key", session_id="s1")).status is Status.OK
    assert (await b.call("read_secret", {"path": "k"}, api_key="alice-key", session_id="s1")).status is Status.OK
    after = await c.call("shell", {"command": "ls"}, api_key="alice-key", session_id="s1")
    assert after.decision.rule_ids == ("no-shell-after-read",)
    assert (await c.call("shell", {"command": "ls"}, api_key="alice-key", session_id="s2")).status is Status.OK
    for gw in (a, b):
        assert (await gw.call("read_file", {"path": "../x"}, api_key="bob-key")).status is Status.BLOCKED
    assert (await c.call("shell", {"command": "ls"}, api_key="bob-key")).decision.rule_ids == ("karma-brake",)


# ---- outages ---------------------------------------------------------------------------------


async def test_redis_outage_refuses_without_forwarding_and_recovers(tmp_path: Path, own_redis: Any) -> None:
    recorder = Recorder()
    profile = TIERS + "rate_limits:\n  - {id: per-principal, key: [principal], rate: 1000, burst: 1000}\n"
    url = own_redis.url.replace("redis://", "redis://default:s3cret-pw@")
    await asyncio.to_thread(own_redis.stop)  # start it again with the password the URL names
    own_redis.extra_args = ["--requirepass", "s3cret-pw"]
    await asyncio.to_thread(own_redis.start)
    settings = Settings(policy=write_policy(tmp_path, profile), state_root=tmp_path / "state",
                        redis={"url": url, "operation_timeout_seconds": 0.5, "connect_timeout_seconds": 0.5})
    gateway = await open_runtime_gateway(settings, backends=[recorder.backend({"read_file": lambda path: text_result(path)})])
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(gateway)), base_url="http://gateway.test")

    async def call() -> Any:
        return await gateway.call("read_file", {"path": "a"}, api_key="alice-key", session_id="s")

    async def refused_naming_redis() -> bool:
        outcome = await call()
        if outcome.status is Status.OK:
            return False
        assert outcome.error_code is ErrorCode.BACKEND_UNAVAILABLE and outcome.retryable, outcome.message
        assert f"Redis at redis://default:***@127.0.0.1:{own_redis.port}" in outcome.message, outcome.message
        return True

    async def serving() -> bool:
        return (await call()).status is Status.OK

    try:
        assert (await call()).status is Status.OK
        health = await http.get("/healthz")
        assert health.status_code == 200 and health.json()["dependencies"] == {"ledger": {"status": "up"}, "redis": {"status": "up"}}
        for outage, recover in ((own_redis.stop, own_redis.start), (own_redis.pause, own_redis.resume)):
            reached = len(recorder.calls)
            outage()
            await wait_for(refused_naming_redis, f"calls refused after {outage.__name__}")
            started = time.monotonic()
            assert await refused_naming_redis()
            assert time.monotonic() - started < 2 * settings.redis.operation_timeout_seconds + 1  # one wait, not minutes
            assert len(recorder.calls) == reached  # nothing was forwarded
            health = await http.get("/healthz")
            assert health.status_code == 503 and health.json()["dependencies"]["redis"]["status"] == "down"
            assert "Redis at" in health.json()["message"] and "s3cret" not in health.text
            recover()
            await wait_for(serving, f"calls served again after {recover.__name__}")
            assert (await http.get("/healthz")).status_code == 200
            assert len(recorder.calls) > reached
    finally:
        own_redis.resume()
        await http.aclose()
        await gateway.aclose()
    assert not gateway.dependencies[1].client.connection_pool._in_use_connections  # noqa: SLF001 - the link was closed


async def test_a_limit_may_fail_open_while_its_store_is_down(tmp_path: Path, own_redis: Any) -> None:
    recorder = Recorder()
    profile = TIERS + ("rate_limits:\n"
                       "  - {id: soft, key: [principal], tools: [read_file], rate: 1000, burst: 1000, store_down: allow}\n"
                       "  - {id: hard, key: [principal], tools: [read_other], rate: 1000, burst: 1000}\n")
    policy = load_policy(write_policy(tmp_path, profile))
    link = rs.connect(RedisSettings(url=own_redis.url, operation_timeout_seconds=0.5, connect_timeout_seconds=0.5))
    ledger = await SqliteLedger.open(tmp_path / "ledger.db")
    backend = recorder.backend({"read_file": lambda path: text_result(path), "read_other": lambda path: text_result(path)})
    gateway = Gateway(policy, [backend], ledger=ledger, keys=KeyStore.open(tmp_path / "state"),
                      limiter_store=rs.RedisLimiterStore(link), dependencies=[link])
    try:
        own_redis.stop()
        assert (await gateway.call("read_file", {"path": "a"}, api_key="alice-key")).status is Status.OK
        hard = await gateway.call("read_other", {"path": "a"}, api_key="alice-key")
        assert hard.error_code is ErrorCode.BACKEND_UNAVAILABLE and "Redis" in hard.message
        assert [c[0] for c in recorder.calls] == ["read_file"]
    finally:
        await gateway.aclose()
