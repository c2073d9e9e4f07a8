"""The legacy session store (`gateway.stores.base.SessionStore`): the same contract on the
in-memory form and the Redis form (a real redis-server), so the two cannot drift."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from gateway.config import RedisSettings
from gateway.core.errors import LimitReached
from gateway.stores.base import SessionFacts, SessionLimits, SessionSignal, SessionStore
from gateway.stores.memory_sessions import MemorySessionStore
from gateway.stores.redis import connect
from gateway.stores.redis_sessions import RedisSessionStore

IDLE = 1.0


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        yield MemorySessionStore(IDLE)
        return
    link = connect(RedisSettings(url=request.getfixturevalue("redis_url")))
    yield RedisSessionStore(link, IDLE, block_seconds=0.2)
    await link.aclose()


def _facts(sid: str = "dgs_a") -> SessionFacts:
    return SessionFacts(id=sid, principal="alice", nonce="n1", capabilities={"elicitation": {}},
                        upstream_sids={"toy": "up-1"})


async def test_facts_round_trip_and_end_forgets_them(store: SessionStore) -> None:
    await store.create(_facts())
    assert await store.load("dgs_b") is None
    loaded = await store.load("dgs_a")
    assert loaded == _facts()
    await store.save(loaded.model_copy(update={"version": "2025-11-25", "upstream_versions": {"toy": "2025-11-25"}}))
    again = await store.load("dgs_a")
    assert again is not None and again.version == "2025-11-25" and again.upstream_sids == {"toy": "up-1"}
    events = store.events("dgs_a")
    kept = await events.append(events.open(), b"x")
    await store.end("dgs_a")
    assert await store.load("dgs_a") is None and await store.events("dgs_a").find(kept) is None


async def test_what_a_store_hands_out_or_takes_shares_nothing_with_what_it_keeps(store: SessionStore) -> None:
    """Changing loaded (or created, or saved) facts in place changes nothing kept until `save`,
    on the in-memory form as on Redis (where every load is decoded afresh)."""
    created = SessionFacts(id="dgs_c", principal="alice", nonce="n1",
                           capabilities={"elicitation": {"form": {}}, "roots": {"names": ["a"]}},
                           upstream_sids={"toy": "up-1"}, upstream_versions={"toy": "2025-06-18"})
    await store.create(created)
    created.capabilities["elicitation"]["form"]["x"] = 1
    loaded = await store.load("dgs_c")
    assert loaded is not None and loaded.capabilities == {"elicitation": {"form": {}}, "roots": {"names": ["a"]}}
    loaded.capabilities["roots"]["names"].append("b")
    loaded.upstream_sids["toy"] = "up-2"
    loaded.upstream_versions["other"] = "2025-11-25"
    loaded.version = "2025-11-25"  # a field set anew, as the nested changes above
    again = await store.load("dgs_c")
    assert again is not None and again.model_dump() == {
        "id": "dgs_c", "principal": "alice", "nonce": "n1", "version": None,
        "capabilities": {"elicitation": {"form": {}}, "roots": {"names": ["a"]}},
        "upstream_sids": {"toy": "up-1"}, "upstream_versions": {"toy": "2025-06-18"}}
    await store.save(loaded)
    loaded.capabilities["roots"]["names"].append("c")
    kept = await store.load("dgs_c")
    assert kept is not None and kept.capabilities["roots"]["names"] == ["a", "b"] and kept.upstream_sids == {"toy": "up-2"}


async def test_idle_sessions_expire_and_use_keeps_them(store: SessionStore) -> None:
    await store.create(_facts("dgs_used"))
    await store.create(_facts("dgs_idle"))
    started = time.monotonic()
    while time.monotonic() - started < IDLE * 1.5:  # used more often than the idle limit: stays
        assert await store.load("dgs_used") is not None
        await anyio.sleep(IDLE / 5)
    with anyio.fail_after(10):
        while await store.load("dgs_idle") is not None:
            await anyio.sleep(0.05)
    assert await store.load("dgs_used") is not None


async def test_signals_reach_the_other_replicas_only(redis_url: str) -> None:
    link = connect(RedisSettings(url=redis_url))
    a, b = RedisSessionStore(link, IDLE, block_seconds=0.2), RedisSessionStore(link, IDLE, block_seconds=0.2)
    got: list[SessionSignal] = []
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                async def listen(store: Any) -> None:
                    async for signal in store.signals():
                        got.append(signal)
                        tg.cancel_scope.cancel()

                tg.start_soon(listen, b)
                tg.start_soon(listen, a)
                while (await link.client.pubsub_numsub(a.channel))[0][1] < 2:  # both subscribed
                    await anyio.sleep(0.02)
                await a.publish(SessionSignal(kind="cancel", session="dgs_a", key=7))
    finally:
        await link.aclose()
    assert [(s.kind, s.session, s.key, s.origin) for s in got] == [("cancel", "dgs_a", 7, a.replica)]


async def test_an_idle_local_part_is_renewed_on_its_next_use_and_the_others_swept(demo_gateway: Any) -> None:
    """This replica's `Local` part of a session (its catalog, waiters, holds) idle for the store's
    limit is replaced on the session's next request, as before; the idle parts of other sessions
    go with a sweep that runs at most once per `SWEEP_SECONDS` (it used to scan every session on
    every request). A part with a held call is kept."""
    from gateway.transports.mcp_http import sessions as legacy
    from gateway.transports.mcp_http.relay import Relay
    from gateway.transports.upstreams.mcp_http import McpHttpUpstream

    store = MemorySessionStore(3600.0)
    parts = legacy.LegacySessions(demo_gateway, Relay([McpHttpUpstream("toy", "http://127.0.0.1:9/mcp")], store), store)
    for sid in ("dgs_a", "dgs_b", "dgs_held", "dgs_c"):
        await store.create(_facts(sid))
        assert await parts.find(sid, "alice") is not None
    first = parts.local["dgs_a"]
    again = await parts.find("dgs_a", "alice")
    assert again is not None and again.local is first  # in use: the same part
    parts.local["dgs_held"].holds["c"] = anyio.CancelScope()
    for sid in ("dgs_a", "dgs_b", "dgs_held"):  # unused here for the limit (another replica served them)
        parts.local[sid].used -= store.idle_seconds
    parts._swept = time.monotonic()  # a sweep just ran: the next request does not scan
    renewed = await parts.find("dgs_a", "alice")
    assert renewed is not None and renewed.local is not first and parts.local["dgs_a"] is renewed.local
    assert "dgs_b" in parts.local
    parts._swept -= legacy.SWEEP_SECONDS
    assert await parts.find("dgs_c", "alice") is not None
    assert set(parts.local) == {"dgs_a", "dgs_held", "dgs_c"}


# ---- limits (issue 23): the same counts on both forms ---------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def limited(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    """A store allowing 2 sessions per principal and 3 in total, idle after `IDLE`."""
    limits = SessionLimits(per_principal=2, total=3)
    if request.param == "memory":
        yield MemorySessionStore(IDLE, limits=limits)
        return
    link = connect(RedisSettings(url=request.getfixturevalue("redis_url")))
    yield RedisSessionStore(link, IDLE, block_seconds=0.2, limits=limits)
    await link.aclose()


def _of(sid: str, principal: str) -> SessionFacts:
    return SessionFacts(id=sid, principal=principal, nonce="n1")


async def test_a_store_refuses_sessions_past_either_limit_naming_it_and_end_frees_a_slot(limited: SessionStore) -> None:
    await limited.create(_of("dgs_a1", "alice"))
    await limited.create(_of("dgs_a2", "alice"))
    with pytest.raises(LimitReached) as per:
        await limited.create(_of("dgs_a3", "alice"))
    assert per.value.setting == "mcp.max_sessions_per_principal" and 0 < per.value.retry_after <= IDLE + 1
    assert "2 open sessions for principal 'alice'" in per.value.message
    assert await limited.load("dgs_a3") is None  # nothing was stored
    await limited.create(_of("dgs_b1", "bob"))
    with pytest.raises(LimitReached) as total:
        await limited.create(_of("dgs_c1", "carol"))
    assert total.value.setting == "mcp.max_sessions" and "3 open sessions on this gateway" in total.value.message
    await limited.end("dgs_a1")
    await limited.create(_of("dgs_c1", "carol"))  # the slot is free at once
    with pytest.raises(LimitReached):
        await limited.create(_of("dgs_a4", "alice"))


async def test_a_session_kept_alive_keeps_its_slot_and_an_expired_one_frees_it(limited: SessionStore) -> None:
    """Counts follow expiry exactly: a session used past the time it would have expired unused
    still counts (on Redis its score is renewed when a `create` looks), one left alone stops counting."""
    await limited.create(_of("dgs_used", "alice"))
    await limited.create(_of("dgs_idle", "alice"))
    started = time.monotonic()
    while time.monotonic() - started < IDLE * 1.5:
        assert await limited.load("dgs_used") is not None
        await anyio.sleep(IDLE / 5)
    with anyio.fail_after(10):
        while await limited.load("dgs_idle") is not None:
            await anyio.sleep(0.05)
    await limited.create(_of("dgs_new", "alice"))  # the idle one's slot
    with pytest.raises(LimitReached):  # the used one still holds its own
        await limited.create(_of("dgs_more", "alice"))


async def test_touch_keeps_sessions_alive_and_reap_hands_over_the_expired_ones(limited: SessionStore) -> None:
    await limited.create(_of("dgs_busy", "alice"))
    await limited.create(_of("dgs_left", "bob"))
    started = time.monotonic()
    while time.monotonic() - started < IDLE * 1.5:  # a request in flight: the reaper renews it
        await limited.touch(["dgs_busy"])
        await anyio.sleep(IDLE / 5)
    assert await limited.load("dgs_busy") is not None
    with anyio.fail_after(10):
        while await limited.load("dgs_left") is not None:
            await anyio.sleep(0.05)
    # Memory hands it over once (for its upstream sessions to be ended); Redis expires it by itself.
    expected = ["dgs_left"] if isinstance(limited, MemorySessionStore) else []
    assert [f.id for f in await limited.reap()] == expected
    assert await limited.reap() == []
