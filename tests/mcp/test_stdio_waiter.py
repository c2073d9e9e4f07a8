"""`Waiter`, how `dharma stdio` awaits an answer from the server or the client: answered, failed,
timed out, or abandoned by a cancelled caller, and never a second outcome after the first."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.transports.mcp_stdio.proxy import BackendGone, Waiter


async def test_an_answer_set_before_or_while_waiting_is_returned() -> None:
    early = Waiter("server")
    early.set({"id": 1})
    assert await early.wait(5) == {"id": 1}

    late = Waiter("client")
    asyncio.get_running_loop().call_soon(late.set, {"id": 2})
    assert await late.wait(5) == {"id": 2}


async def test_a_failure_is_raised_and_the_first_outcome_wins() -> None:
    waiter = Waiter("server")
    waiter.fail(BackendGone())
    waiter.set({"id": 1})  # too late: the server is gone
    with pytest.raises(BackendGone):
        await waiter.wait(5)


async def test_no_answer_within_the_timeout_raises_timeout_error() -> None:
    waiter = Waiter("server")
    started = anyio.current_time()
    with pytest.raises(TimeoutError):
        await waiter.wait(0.05)
    assert anyio.current_time() - started >= 0.05
    waiter.set({"id": 1})  # an answer after the timeout changes nothing


async def test_a_cancelled_caller_abandons_the_wait_and_a_later_answer_is_harmless() -> None:
    waiter = Waiter("server")
    with anyio.CancelScope() as scope:
        asyncio.get_running_loop().call_soon(scope.cancel)
        await waiter.wait(30)
    assert scope.cancelled_caught
    waiter.set({"id": 1})
    waiter.fail(BackendGone())
    # the timer was cancelled with the wait: nothing fires later
    await anyio.sleep(0)
    assert waiter.future.cancelled()


async def test_a_failure_nobody_awaits_is_not_reported_as_never_retrieved() -> None:
    """The server can exit while a call still waits for it to be ready, before the call waits for
    its answer: that failure is dropped with the waiter, not logged by asyncio at collection."""
    import gc

    reported: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        waiter = Waiter("server")
        waiter.fail(BackendGone())
        del waiter
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
