"""`ServerOutput` and `ServerProcess`, how `dharma stdio` reads and writes its server's pipes:
lines handled in the read callback when that needs no awaiting, in order one at a time when a
line must be awaited, the pipe paused behind a slow line and resumed, the end of output ending
the pump; writes to a server that is gone logged, not raised. Real pipes, a real child process."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

from gateway.mcp.framing import Oversize
from gateway.transports.mcp_stdio import lines
from gateway.transports.mcp_stdio.supervisor import ServerOutput, Supervisor, spawn_server

def _handler(handled: list[Any], release: asyncio.Event, slow: Callable[[bytes | Oversize], bool], *,
             in_task: list[bool] | None = None, started: asyncio.Event | None = None) -> lines.LineHandler:
    """A line handler that records each line in `handled`: a line `slow` picks is awaited until
    `release` is set (`started` set when it is reached); any other is handled at once, `in_task`
    noting whether a task (rather than the read callback) ran it."""

    async def wait(line: bytes | Oversize) -> None:
        if started is not None:
            started.set()
        await release.wait()
        handled.append(line)

    def handle(line: bytes | Oversize) -> Coroutine[Any, Any, None] | None:
        if slow(line):
            return wait(line)
        if in_task is not None:
            in_task.append(asyncio.current_task() is not None)
        handled.append(line)
        return None

    return handle


async def _pipe() -> tuple[int, ServerOutput]:
    read_end, write_end = os.pipe()
    _, out = await asyncio.get_running_loop().connect_read_pipe(ServerOutput, open(read_end, "rb", buffering=0))
    return write_end, out


async def test_lines_are_handled_in_order_and_a_line_being_awaited_holds_back_the_next() -> None:
    write_end, out = await _pipe()
    handled: list[bytes] = []
    release = asyncio.Event()
    in_task: list[bool] = []
    handle = _handler(handled, release, lambda line: isinstance(line, bytes) and line.startswith(b"slow"), in_task=in_task)

    async with anyio.create_task_group() as tg:
        tg.start_soon(out.pump, handle)
        os.write(write_end, b"a\nb\n")
        with anyio.fail_after(10):
            while handled != [b"a", b"b"]:
                await asyncio.sleep(0.01)
        assert in_task == [False, False]  # handled in the read callback, no task woken for them
        os.write(write_end, b"slow1\nc\n")
        with anyio.fail_after(10):
            while not out._pending:  # noqa: SLF001 - the line being awaited
                await asyncio.sleep(0.01)
        os.write(write_end, b"d\n")
        for _ in range(20):  # several loop rounds: "c" and "d" must still wait for "slow1"
            await asyncio.sleep(0)
        assert handled == [b"a", b"b"]
        release.set()
        os.close(write_end)
        with anyio.fail_after(10):
            while handled != [b"a", b"b", b"slow1", b"c", b"d"]:
                await asyncio.sleep(0.01)
    # the pump returned at the end of the output (the task group exited)
    assert handled == [b"a", b"b", b"slow1", b"c", b"d"]


async def test_reading_pauses_behind_a_slow_line_and_resumes_with_nothing_lost() -> None:
    write_end, out = await _pipe()
    handled: list[bytes] = []
    release = asyncio.Event()
    count = lines.QUEUED_LINES * 4
    handle = _handler(handled, release, lambda line: line == b"slow")

    async with anyio.create_task_group() as tg:
        tg.start_soon(out.pump, handle)
        os.write(write_end, b"slow\n")
        with anyio.fail_after(10):
            while not out._pending:  # noqa: SLF001
                await asyncio.sleep(0.01)
        for i in range(count):
            os.write(write_end, b"%d\n" % i)
        with anyio.fail_after(10):
            while not out._paused:  # noqa: SLF001 - the pipe is no longer read
                await asyncio.sleep(0.01)
        release.set()
        with anyio.fail_after(10):
            while len(handled) < count + 1:
                await asyncio.sleep(0.01)
        assert not out._paused  # noqa: SLF001 - read again once the queue is empty
        os.close(write_end)
    assert handled == [b"slow", *(b"%d" % i for i in range(count))]


async def test_a_cancelled_pump_closes_the_line_it_had_not_awaited() -> None:
    write_end, out = await _pipe()
    started: list[bytes] = []

    async def never(line: bytes) -> None:
        started.append(line)
        await asyncio.Event().wait()

    def handle(line: bytes | Oversize) -> Coroutine[Any, Any, None] | None:
        assert isinstance(line, bytes)
        return never(line)

    async with anyio.create_task_group() as tg:
        tg.start_soon(out.pump, handle)
        os.write(write_end, b"x\n")
        with anyio.fail_after(10):
            while not started:
                await asyncio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert out._pending is None  # noqa: SLF001
    out.close()
    os.close(write_end)


async def test_a_server_is_written_to_and_stopped_and_a_write_after_it_is_gone_is_logged() -> None:
    script = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line.upper()); sys.stdout.flush()\n"
    lines: list[bytes] = []
    done = asyncio.Event()

    def on_line(line: bytes) -> None:
        lines.append(line)
        done.set()

    async def nothing() -> None:
        return None

    sup = Supervisor([sys.executable, "-c", script], "test", on_line=on_line, on_exit=nothing, on_restart=nothing)
    first = await sup.spawn()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.run, first)
        await sup.send(b'{"a":1}')
        with anyio.fail_after(20):
            await done.wait()
        assert lines == [b'{"A":1}']
        assert sup.heard
        await sup.stop()
        assert first.proc.returncode is not None  # stdin closed: the server ended
        await sup.send(b'{"b":2}')  # the pipe is closed: logged, not raised
        tg.cancel_scope.cancel()


async def test_a_server_that_cannot_be_started_leaves_no_pipe_open() -> None:
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        await spawn_server(["/nonexistent/dharma-no-such-server"])
    assert set(os.listdir("/proc/self/fd")) <= before


async def test_a_client_write_is_done_at_once_only_with_nothing_buffered_before_it() -> None:
    from gateway.transports.mcp_stdio.pipes import ClientPipes

    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    with open(in_read, "rb", buffering=0) as stdin, open(out_write, "wb", buffering=0) as stdout:
        pipes = ClientPipes(stdin, stdout)
        await pipes.open()
        assert pipes.write_now(b"first")
        assert os.read(out_read, 100) == b"first\n"
        big = b"x" * (1 << 20)  # more than the pipe holds: the rest stays buffered
        assert pipes.write_now(big)
        assert not pipes.write_now(b"after")  # would overtake the buffered bytes' turn: left to write()
        received = bytearray()
        with anyio.fail_after(20):
            while len(received) < len(big) + 1:
                received += await anyio.to_thread.run_sync(os.read, out_read, 1 << 16)
        assert bytes(received) == big + b"\n"
    os.close(in_write)
    os.close(out_read)


async def test_the_agents_lines_are_handled_in_the_read_callback_in_order_behind_an_awaited_one() -> None:
    from gateway.transports.mcp_stdio.pipes import ClientPipes

    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    handled: list[bytes | Oversize] = []
    in_task: list[bool] = []
    release = asyncio.Event()
    handle = _handler(handled, release, lambda line: isinstance(line, bytes) and line.startswith(b"slow"), in_task=in_task)

    with open(in_read, "rb", buffering=0) as stdin, open(out_write, "wb", buffering=0) as stdout:
        pipes = ClientPipes(stdin, stdout)
        await pipes.open()
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipes.pump, handle, 100)
            os.write(in_write, b"a\n" + b"x" * 150 + b"\nslow\nb\n")
            with anyio.fail_after(10):
                while len(handled) < 2:
                    await asyncio.sleep(0.01)
            for _ in range(20):  # several loop rounds: "b" must still wait for "slow"
                await asyncio.sleep(0)
            assert handled == [b"a", Oversize(b"x" * 150, 150)]  # over the limit: its size and first bytes (up to 4 KiB)
            release.set()
            os.close(in_write)  # end of input: the pump returns
        assert handled == [b"a", Oversize(b"x" * 150, 150), b"slow", b"b"]
        assert in_task == [False, False, True]  # in the read callback; the line after an awaited one by the pump
    os.close(out_read)


async def test_stdin_the_loop_cannot_watch_is_read_in_threads_up_to_its_end(tmp_path: Any) -> None:
    from gateway.transports.mcp_stdio.pipes import ClientPipes

    source = tmp_path / "input.jsonl"  # a regular file: epoll refuses it
    expected = [b"%d" % i for i in range(lines.QUEUED_LINES * 8)]
    source.write_bytes(b"\n".join(expected) + b"\nunterminated")
    handled: list[bytes | Oversize] = []
    started = asyncio.Event()
    release = asyncio.Event()
    handle = _handler(handled, release, lambda line: line == b"0", started=started)

    out_read, out_write = os.pipe()
    with open(source, "rb", buffering=0) as stdin, open(out_write, "wb", buffering=0) as stdout:
        pipes = ClientPipes(stdin, stdout)
        await pipes.open()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(pipes.pump, handle, 1 << 20)
                await started.wait()
                for _ in range(20):
                    await asyncio.sleep(0)
                assert handled == []  # the lines after the first wait for it
                release.set()
        assert handled == expected  # in order, up to the end; the unterminated tail is no message
    os.close(out_read)
