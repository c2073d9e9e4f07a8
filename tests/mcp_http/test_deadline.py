"""The forwarded call's deadline (`mcp_http.forward.Deadline`): `asyncio.timeout` for a loop already
known. Expiry turns its own cancellation into TimeoutError; anyone else's cancellation stays a
cancellation; leaving in time leaves nothing armed."""

from __future__ import annotations

import asyncio

import pytest

from gateway.transports.mcp_http.forward import Deadline


@pytest.mark.parametrize("known", [True, False])
async def test_expiry_is_a_timeout_error_and_the_task_is_not_left_cancelled(known: bool) -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with Deadline(0.01, loop if known else None):
            await asyncio.Event().wait()  # never set: only the deadline ends it
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # and no cancellation is still pending


async def test_leaving_in_time_disarms_it() -> None:
    later = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with Deadline(0.01, loop):
        pass
    loop.call_later(0.2, later.set)
    async with asyncio.timeout(30):
        await later.wait()  # were the deadline still armed, this wait would be cancelled at 10 ms


async def test_another_cancellation_stays_a_cancellation() -> None:
    entered = asyncio.Event()

    async def inner() -> None:
        async with Deadline(30):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(inner())
    async with asyncio.timeout(30):
        await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_an_outer_cancellation_after_expiry_is_not_swallowed() -> None:
    """Expired, but the task was also cancelled by someone else: the cancellation goes on, as with
    `asyncio.timeout`."""
    reached = asyncio.Event()

    async def inner() -> None:
        async with Deadline(0.01):
            reached.set()
            try:
                await asyncio.Event().wait()
            finally:
                asyncio.current_task().cancel()  # type: ignore[union-attr]  # a second request to cancel

    task = asyncio.ensure_future(inner())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reached.is_set()
