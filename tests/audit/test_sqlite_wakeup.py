"""How the SQLite writer thread wakes the event loops it answers: an eventfd per loop, watched by the
loop, falling back to `call_soon_threadsafe` where a loop cannot watch one; every caller answered,
whichever loop it runs on, and no descriptor left open once the ledger is closed."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from audit.sqlite import SqliteLedger, SqliteLedgerReader

from .conftest import make_entry

pytestmark = pytest.mark.skipif(not hasattr(os, "eventfd"), reason="eventfd is Linux only")


def eventfds() -> set[int]:
    """This process's open eventfd descriptors."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventfd]":
                found.add(int(name))
        except OSError:
            continue
    return found


def watched(loop: asyncio.AbstractEventLoop, fds: set[int]) -> set[int]:
    """Which of `fds` the (selector) loop watches for reading."""
    selector = loop._selector  # type: ignore[attr-defined]
    return {fd for fd in fds if fd in selector.get_map()}


def wait_for(condition, what: str, deadline: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


async def test_answers_come_through_an_eventfd_the_loop_watches_and_it_is_closed_with_the_ledger(ledger_path: Path) -> None:
    before = eventfds()
    ledger = await SqliteLedger.open(ledger_path)
    first = await ledger.append(make_entry(0))
    mine = eventfds() - before
    assert len(mine) == 1 and watched(asyncio.get_running_loop(), mine) == mine
    rest = await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(1, 200)))
    assert [first.seq, *(r.seq for r in rest)] == list(range(1, 201))
    assert eventfds() - before == mine  # one per loop, not per append
    (wakeup,) = ledger._wakeups.values()  # type: ignore[attr-defined]
    await ledger.aclose()
    assert eventfds() - before == set()
    wakeup.drain()  # a reader callback the loop had already queued when it closed finds nothing to read
    assert watched(asyncio.get_running_loop(), mine) == set()
    with SqliteLedgerReader(ledger_path) as reader:
        assert reader.size() == 200


class NoReaders(asyncio.SelectorEventLoop):
    """A loop that cannot watch descriptors (as a proactor loop on Windows)."""

    def add_reader(self, fd, callback, *args):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def test_a_loop_that_cannot_watch_an_eventfd_is_answered_through_call_soon_threadsafe(ledger_path: Path) -> None:
    before = eventfds()

    async def main() -> list[int]:
        ledger = await SqliteLedger.open(ledger_path)
        try:
            answers = await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(50)))
            assert eventfds() - before == set()  # the eventfd it could not watch is not kept
            return [a.seq for a in answers]
        finally:
            await ledger.aclose()

    with asyncio.Runner(loop_factory=NoReaders) as runner:
        assert runner.run(main()) == list(range(1, 51))
    assert eventfds() - before == set()


def test_uvloop_keeps_its_own_thread_safe_wake(ledger_path: Path) -> None:
    uvloop = pytest.importorskip("uvloop")
    before = eventfds()

    async def main() -> list[int]:
        ledger = await SqliteLedger.open(ledger_path)
        try:
            answers = await asyncio.wait_for(asyncio.gather(*(ledger.append(make_entry(i)) for i in range(50))), 30)
            assert not watched_by_uvloop(ledger)
            return [a.seq for a in answers]
        finally:
            await ledger.aclose()

    assert uvloop.run(main()) == list(range(1, 51))
    assert eventfds() - before == set()


def watched_by_uvloop(ledger: SqliteLedger) -> bool:
    """Whether the ledger made an eventfd of its own for the running (uvloop) loop."""
    return any(wakeup.fd is not None for wakeup in ledger._wakeups.values())  # type: ignore[attr-defined]


async def test_callers_on_two_loops_are_each_answered_on_their_own(ledger_path: Path) -> None:
    before = eventfds()
    ledger = await SqliteLedger.open(ledger_path)
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        async def on_the_other_loop() -> list[Any]:
            return await asyncio.gather(*(ledger.append(make_entry(1000 + i)) for i in range(100)))

        theirs = asyncio.run_coroutine_threadsafe(on_the_other_loop(), other)
        ours = await asyncio.gather(*(ledger.append(make_entry(i)) for i in range(100)))
        their_answers = await asyncio.wait_for(asyncio.wrap_future(theirs), 30)
        seqs = sorted([a.seq for a in ours] + [a.seq for a in their_answers])
        assert seqs == list(range(1, 201))
        assert len(eventfds() - before) == 2
        await ledger.aclose()  # closes the other loop's eventfd in that loop's own thread
        wait_for(lambda: eventfds() - before == set(), "the other loop to close its eventfd")
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(30)
        other.close()
    with SqliteLedgerReader(ledger_path) as reader:
        got = {reader.get(a.seq).to_dict()["request_id"] for a in their_answers}  # type: ignore[union-attr]
        assert got == {f"req-{1000 + i}" for i in range(100)}


async def test_a_loop_closed_before_the_ledger_leaves_no_descriptor_behind(ledger_path: Path) -> None:
    before = eventfds()
    ledger = await SqliteLedger.open(ledger_path)
    other = asyncio.new_event_loop()
    try:
        answer = await asyncio.to_thread(other.run_until_complete, ledger.append(make_entry(7)))
    finally:
        other.close()
    assert answer.seq == 1
    assert (await ledger.append(make_entry(8))).seq == 2
    await ledger.aclose()
    assert eventfds() - before == set()


async def test_a_ledger_outliving_many_loops_keeps_no_descriptor_for_the_closed_ones(ledger_path: Path) -> None:
    before = eventfds()
    ledger = await SqliteLedger.open(ledger_path)

    def one_loop(i: int) -> int:
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(ledger.append(make_entry(i))).seq
        finally:
            loop.close()

    seqs = [await asyncio.to_thread(one_loop, i) for i in range(20)]
    assert seqs == list(range(1, 21))
    assert len(eventfds() - before) <= 1  # the last loop's: dropped when the next loop registers
    assert (await ledger.append(make_entry(99))).seq == 21
    assert len(eventfds() - before) == 1  # ours; every closed loop's is gone
    await ledger.aclose()
    assert eventfds() - before == set()
