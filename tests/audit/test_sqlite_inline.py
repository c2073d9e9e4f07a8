"""SqliteLedger's inline commit: a lone append on an idle ledger is committed in the caller's thread
(no hand-off to the writer thread); concurrent appends, a slow disk and failures behave as before."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.checkpoint import CheckpointSigner
from audit.errors import LedgerError
from audit.sqlite import INLINE_PROBE, INLINE_QUIET, WAL_CHECKPOINT_FRAMES, SqliteLedger, SqliteLedgerReader
from audit.verify import verify_ledger
from gateway.config import load_settings
from gateway.runtime import open_ledger

from .conftest import make_entry
from .test_export import FakeClock, wait_for_checkpoint

LONE = 100
ANY_DISK = 1000.0
"""A commit-time bound no test machine's sync reaches (a busy CI disk takes over the default's 2 ms),
for the tests about what inline commits do rather than about the bound."""


async def sequential(ledger: SqliteLedger, count: int, start: int = 0) -> list[int]:
    """`count` appends one after the other (a lone caller); their seqs."""
    return [(await ledger.append(make_entry(i))).seq for i in range(start, start + count)]


def verified(path: Path) -> bool:
    with SqliteLedgerReader(path) as reader:
        return verify_ledger(reader).ok


async def test_a_lone_caller_is_committed_inline(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=ANY_DISK)
    try:
        assert await sequential(ledger, LONE) == list(range(1, LONE + 1))
        # most: not the first threaded ones (no overlap seen yet), the periodic probes, nor, on a busy
        # machine, one that comes while the writer thread still finishes the probe before it
        assert ledger.inline_appends >= LONE // 2
        assert ledger.stats.batch.count == LONE and ledger.stats.lag.count == LONE
    finally:
        await ledger.aclose()
    assert verified(ledger_path)


async def test_concurrent_callers_are_still_grouped(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=ANY_DISK)
    try:
        await sequential(ledger, 20)
        assert ledger.inline_appends > 0  # inline mode first: 32 callers must be noticed from there
        inline, batches = ledger.inline_appends, ledger.stats.batch.count

        async def caller(c: int) -> None:
            for i in range(10):
                await ledger.append(make_entry(1000 + c * 10 + i))
                await asyncio.sleep(0)  # a caller does other work between its appends

        await asyncio.gather(*(caller(c) for c in range(32)))
        assert ledger.size == 20 + 320
        assert ledger.inline_appends - inline < INLINE_PROBE  # at most one probe interval, then threaded
        assert ledger.stats.batch.count - batches < 320 // 2  # group commit: batches hold > 1 record on average
    finally:
        await ledger.aclose()
    assert verified(ledger_path)


async def test_a_failed_inline_commit_fails_the_call_and_keeps_the_ledger_verifiable(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=ANY_DISK)
    try:
        await sequential(ledger, 20)
        before, inline = (ledger.size, ledger.head_hash, ledger.root()), ledger.inline_appends
        ledger.limit_pages(1)  # the disk is "full": the commit itself fails (SQLITE_FULL)
        failed = 0
        for i in range(3):
            try:
                await ledger.append(make_entry(100 + i))
            except LedgerError as exc:
                assert "were not committed" in str(exc) and str(ledger_path) in str(exc)
                failed += 1
        assert failed == 3
        assert ledger.inline_appends > inline  # at least one of them failed in the caller's thread
        assert (ledger.size, ledger.head_hash, ledger.root()) == before
        assert ledger.stats.failed_batches == 3
        ledger.limit_pages(None)
        assert (await ledger.append(make_entry(200))).seq == 21
    finally:
        await ledger.aclose()
    assert verified(ledger_path)
    with SqliteLedgerReader(ledger_path) as reader:
        assert reader.size() == 21


async def test_a_slow_commit_keeps_appends_on_the_writer_thread(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=1e-6)  # every real commit is slower
    try:
        await sequential(ledger, 30)
        assert ledger.inline_appends == 0 and ledger.stats.batch.count == 30
    finally:
        await ledger.aclose()
    never = await SqliteLedger.open(ledger_path, inline_max_ms=0)
    try:
        await sequential(never, 30, start=30)
        assert never.inline_appends == 0 and never.size == 60
    finally:
        await never.aclose()


async def test_inline_commits_still_get_periodic_checkpoints(ledger_path: Path, key: Ed25519PrivateKey) -> None:
    clock = FakeClock()
    ledger = await SqliteLedger.open(
        ledger_path, inline_max_ms=ANY_DISK, checkpoint_signer=CheckpointSigner(key, "dharma-gateway", "test/k"),
        clock=clock,
    )
    try:
        await sequential(ledger, 10)
        clock.advance(1.0)
        await wait_for_checkpoint(ledger_path, 10)  # the idle writer signs what was committed inline
        inline = ledger.inline_appends
        await sequential(ledger, 10, start=10)  # the first uncovered record wakes the sleeping writer
        assert ledger.inline_appends > inline
        clock.advance(1.0)
        assert await wait_for_checkpoint(ledger_path, 20) == [10, 20]
        await sequential(ledger, 3, start=20)
    finally:
        await ledger.aclose()
    with SqliteLedgerReader(ledger_path) as reader:
        assert [s for s, _ in reader.checkpoints()] == [10, 20, 23]  # close covers the last inline ones
    assert verified(ledger_path)


async def test_two_event_loops_share_one_ledger(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=ANY_DISK)
    results: list[list[int]] = []

    def other_loop(start: int) -> None:
        results.append(asyncio.run(sequential(ledger, 100, start=start)))

    try:
        alone = threading.Thread(target=other_loop, args=(1000,))
        alone.start()
        await asyncio.to_thread(alone.join, 60)
        assert results == [list(range(1, 101))]
        assert ledger.inline_appends > 0  # committed in the other loop's thread
        both = threading.Thread(target=other_loop, args=(2000,))
        both.start()
        mine = await sequential(ledger, 100)
        await asyncio.to_thread(both.join, 60)
        assert not both.is_alive()
        assert sorted(mine + results[1]) == list(range(101, 301))
    finally:
        await ledger.aclose()
    assert verified(ledger_path)


async def test_aclose_refuses_inline_appends_after_it(ledger_path: Path) -> None:
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=ANY_DISK)
    await sequential(ledger, 20)
    await ledger.aclose()
    try:
        await ledger.append(make_entry(99))
    except LedgerError as exc:
        assert "closed" in str(exc)
    else:
        raise AssertionError("an append after aclose was accepted")
    assert verified(ledger_path)


async def test_the_wal_is_checkpointed_by_the_writer_thread_only(ledger_path: Path) -> None:
    """Inline commits never copy the WAL back (that stalled the caller's loop for milliseconds): the
    connection's automatic checkpoint is off and the writer thread runs every one, so the WAL stays
    about as short as SQLite's own default keeps it."""
    ledger = await SqliteLedger.open(ledger_path, inline_max_ms=ANY_DISK)
    checkpoints: list[str] = []
    writer = f"karma-ledger:{ledger_path.name}"

    def traced(statement: str) -> None:
        if "wal_checkpoint" in statement.lower():
            checkpoints.append(threading.current_thread().name)

    ledger._conn.set_trace_callback(traced)
    try:
        assert ledger._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        await sequential(ledger, 600)
        assert ledger.inline_appends > 300
        await wait_until(lambda: ledger.wal_checkpoints >= 3)
        assert checkpoints and set(checkpoints) == {writer}
        page = ledger._conn.execute("PRAGMA page_size").fetchone()[0]
        # 600 lone commits write several pages each: unchecked, the WAL would be several times this
        assert Path(f"{ledger_path}-wal").stat().st_size <= 2 * WAL_CHECKPOINT_FRAMES * (page + 24) + 32
    finally:
        ledger._conn.set_trace_callback(None)
        await ledger.aclose()
    assert verified(ledger_path)


async def wait_until(condition: Callable[[], bool], deadline: float = 30.0) -> None:
    """Poll `condition` (the writer thread runs the checkpoint after answering) until it holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


async def test_the_operator_setting_turns_inline_commits_off(tmp_path: Path) -> None:
    """`ledger.inline_max_ms` in dharma.yaml reaches the ledger the gateway opens: 0 keeps every append on
    the writer thread (an operator who wants the loop never blocked by a sync), a bound commits inline."""
    seen = {}
    for setting in ("0", "1000"):
        root = tmp_path / setting
        root.mkdir()
        config = root / "dharma.yaml"
        config.write_text(f"state_root: {root}\nledger: {{inline_max_ms: {setting}}}\n")
        ledger = await open_ledger(load_settings(config, {}))
        try:
            await sequential(ledger, 40)
            seen[setting] = ledger.inline_appends
        finally:
            await ledger.aclose()
    assert seen["0"] == 0 and seen["1000"] > 20
