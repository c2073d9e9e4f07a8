"""The tasks `dharma stdio` handles messages in (a `tools/call`, a refusal, a pass-through record):
bare asyncio tasks of the proxy's own, so they must behave as the task group's children did —
dropped when done, cancelled and awaited when the proxy ends, a failure answered without ending
the session, anything `_safely` cannot handle ending the proxy."""

from __future__ import annotations

import asyncio
import sys

import anyio

from gateway.transports.mcp_stdio.proxy import StdioProxy


def _proxy() -> StdioProxy:
    return StdioProxy(None, [sys.executable, "-c", "pass"])  # never started: only its tasks are used


async def _settled(proxy: StdioProxy) -> None:
    """Wait until the message tasks running now have ended (their done callbacks run first)."""
    with anyio.fail_after(10):
        await asyncio.gather(*proxy._messages, return_exceptions=True)


async def test_a_finished_message_task_is_dropped() -> None:
    proxy = _proxy()
    handled: list[int] = []

    async def handle(n: int) -> None:
        handled.append(n)

    for n in range(3):
        proxy._spawn("test.message", handle, n)
    assert len(proxy._messages) == 3
    await _settled(proxy)
    assert handled == [0, 1, 2]
    assert not proxy._messages


async def test_message_tasks_still_running_are_cancelled_and_awaited_when_the_proxy_ends() -> None:
    proxy = _proxy()
    started, ended = asyncio.Event(), []

    async def handle() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # a call waiting on a server that will not answer
        finally:
            await anyio.sleep(0)  # its clean-up still runs to the end
            ended.append("cleaned up")

    proxy._spawn("test.message", handle)
    await started.wait()
    with anyio.CancelScope() as scope:
        scope.cancel()  # the proxy is itself being cancelled: the end is shielded
        await proxy._end_messages()
    assert ended == ["cleaned up"]
    assert not proxy._messages


async def test_a_failing_message_is_logged_and_the_proxy_goes_on() -> None:
    proxy = _proxy()

    async def handle() -> None:
        raise ValueError("broken handler")

    async with anyio.create_task_group() as tg:
        proxy._tg = tg
        proxy._spawn("test.message", handle)
        await _settled(proxy)
        assert not proxy._messages
        assert not tg.cancel_scope.cancel_called
    assert proxy._crashed == []


async def test_what_safely_cannot_handle_ends_the_proxy() -> None:
    class Fatal(BaseException):
        pass

    proxy = _proxy()

    async def handle() -> None:
        raise Fatal()

    async with anyio.create_task_group() as tg:
        proxy._tg = tg
        proxy._spawn("test.message", handle)
        with anyio.fail_after(10):
            await anyio.sleep_forever()  # ended by the crash
    assert tg.cancel_scope.cancel_called
    assert len(proxy._crashed) == 1 and isinstance(proxy._crashed[0], Fatal)
