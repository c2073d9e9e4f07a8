"""The gateway's own SSE event store (`gateway.stores.base.EventStore`): ids, bounds, replay.

Contract tests: the same tests run against the in-memory store and the Redis one (a real
redis-server), so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from gateway.config import RedisSettings
from gateway.stores.base import EventStore
from gateway.stores.memory_sessions import MemoryEventStore
from gateway.stores.redis import connect
from gateway.stores.redis_sessions import RedisEventStore

Make = Callable[..., EventStore]


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    if request.param == "memory":
        yield MemoryEventStore
        return
    link = connect(RedisSettings(url=request.getfixturevalue("redis_url")))
    names = iter(range(1_000_000))

    def redis_store(**bounds: Any) -> EventStore:
        return RedisEventStore(link, f"s{next(names)}", ttl_ms=60_000, block_seconds=0.2, **bounds)

    yield redis_store
    await link.aclose()


async def _replay(store: EventStore, event_id: str) -> list[bytes]:
    found = await store.find(event_id)
    assert found is not None
    stream, after = found
    return [data async for _id, data in store.follow(stream, after, wait=False)]


async def test_ids_are_opaque_and_replay_follows_the_stream(make: Make) -> None:
    store = make()
    a, b = store.open(), store.open()
    prime = await store.append(a, b"")
    ids = [await store.append(a, b"a1"), await store.append(b, b"b1"), await store.append(a, b"a2")]
    assert len(set([prime, *ids])) == 4 and all(len(i.split(".")[0]) >= 20 for i in ids)
    assert await _replay(store, prime) == [b"a1", b"a2"]  # the priming event itself is not replayed
    assert await _replay(store, ids[0]) == [b"a2"]
    other = make()
    foreign = await other.append(other.open(), b"x")
    assert await store.find("1") is None and await store.find(foreign) is None and await store.find("x.y") is None


async def test_follow_waits_for_the_answer_of_a_running_stream(make: Make) -> None:
    store = make()
    stream = store.open()
    prime = await store.append(stream, b"")
    got: list[bytes] = []
    following = anyio.Event()

    async def follow() -> None:
        found = await store.find(prime)
        assert found is not None
        following.set()
        async for _id, data in store.follow(*found):
            got.append(data)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await following.wait()
            await store.append(stream, b"progress")
            await store.append(stream, b"answer")
            await store.finish(stream)
    assert got == [b"progress", b"answer"]


async def test_store_is_bounded_by_count_and_bytes(make: Make) -> None:
    store = make(max_events=3, max_bytes=10)
    stream = store.open()
    ids = [await store.append(stream, b"x") for _ in range(5)]
    assert await store.find(ids[0]) is None and await store.find(ids[-1]) is not None
    assert await _replay(store, ids[2]) == [b"x", b"x"]  # only 3 are kept
    big = await store.append(stream, b"123456789")  # 3 + 9 bytes > 10: the two oldest go
    assert await store.find(ids[3]) is None and await store.find(ids[4]) is not None
    assert await _replay(store, ids[4]) == [b"123456789"] and await store.find(big) is not None


async def test_streams_that_carried_nothing_leave_nothing_behind() -> None:
    """A client may open GET stream after GET stream (each bounded while open): one that ends
    without an event is forgotten, so a session's store does not grow with the streams it opened."""
    store = MemoryEventStore()
    kept = store.open()
    await store.append(kept, b"answer")
    for _ in range(1000):
        await store.finish(store.open(standalone=True))
    await store.finish(kept)
    assert len(store._streams) == 1  # only the stream with an event to resume
    found = await store.find(f"{kept.token}.1")
    assert found is not None
    assert [data async for _id, data in store.follow(*found, wait=False)] == []  # nothing after it; it is done
