"""The gateway's own SSE event store (`gateway.transports.mcp_http.events`): ids, bounds, replay."""

from __future__ import annotations

import anyio

from gateway.transports.mcp_http.events import EventStore


async def _replay(store: EventStore, event_id: str) -> list[bytes]:
    found = store.find(event_id)
    assert found is not None
    stream, after = found
    return [data async for _id, data in store.follow(stream, after, wait=False)]


async def test_ids_are_opaque_and_replay_follows_the_stream() -> None:
    store = EventStore()
    a, b = store.open(), store.open()
    prime = store.append(a, b"")
    ids = [store.append(a, b"a1"), store.append(b, b"b1"), store.append(a, b"a2")]
    assert len(set([prime, *ids])) == 4 and all(len(i.split(".")[0]) >= 20 for i in ids)
    assert await _replay(store, prime) == [b"a1", b"a2"]  # the priming event itself is not replayed
    assert await _replay(store, ids[0]) == [b"a2"]
    assert store.find("1") is None and store.find(EventStore().append(EventStore().open(), b"x")) is None


async def test_follow_waits_for_the_answer_of_a_running_stream() -> None:
    store = EventStore()
    stream = store.open()
    prime = store.append(stream, b"")
    got: list[bytes] = []

    async def follow() -> None:
        found = store.find(prime)
        assert found is not None
        async for _id, data in store.follow(*found):
            got.append(data)

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.sleep(0.01)
            store.append(stream, b"progress")
            await anyio.sleep(0.01)
            store.append(stream, b"answer")
            store.finish(stream)
    assert got == [b"progress", b"answer"]


def test_store_is_bounded_by_count_and_bytes() -> None:
    store = EventStore(max_events=3, max_bytes=10)
    stream = store.open()
    ids = [store.append(stream, b"x") for _ in range(5)]
    assert len(store) == 3 and store.find(ids[0]) is None and store.find(ids[-1]) is not None
    store.append(stream, b"123456789")  # 3 + 9 bytes > 10: older events go
    assert store.size <= 10 and len(store) <= 3
    assert store.find(ids[2]) is None
