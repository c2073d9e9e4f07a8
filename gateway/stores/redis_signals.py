"""Approval wake-ups over Redis pub/sub, so a decision made through any replica (HTTP API, CLI,
MCP elicitation) releases the call held on another at once.

One channel (`<prefix>approvals:decided`) carries approval ids; each gateway keeps one
subscription, read by one task, and wakes its local holders (`MemoryApprovalSignals`). The
message is only a hint to read the approval store again: the decision itself is in PostgreSQL.
So Redis down or a lost message only delays a release until the holder's safety poll
(`approvals.poll_seconds`), and a forged message wakes a holder that then finds nothing decided:
Redis can neither lose nor forge a release. After the subscription was lost and is back, every
local holder is woken once, since messages sent meanwhile are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog

from gateway.stores.memory import MemoryApprovalSignals
from gateway.stores.redis import REDIS_ERRORS, RedisLink

log = structlog.get_logger()

LISTEN_SECONDS = 5.0
"""How long one read of the subscription waits before it reads again (bounds shutdown, not latency)."""
RETRY_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Waits between attempts to subscribe again after Redis failed."""
MAX_ID_BYTES = 200


class RedisApprovalSignals:
    """`ApprovalSignals` shared by the replicas through Redis pub/sub."""

    def __init__(self, link: RedisLink, *, subscribe_wait: float = 1.0) -> None:
        self.link = link
        self.channel = link.key("approvals", "decided")
        self.local = MemoryApprovalSignals()
        self.subscribe_wait = subscribe_wait
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Start the listener task (idempotent); `watch` starts it too."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="approval-wakeups")

    async def notify(self, approval_id: str) -> None:
        """Wake local holders at once, and publish for the other replicas (a failure is logged, not raised)."""
        self.local.wake(approval_id)
        try:
            await self.link.client.publish(self.channel, approval_id)
        except REDIS_ERRORS as exc:
            log.warning("approval.wakeup_not_sent", approval_id=approval_id, error=str(self.link.unavailable(exc)),
                        effect="holders on other replicas see the decision at their next safety poll")

    @contextlib.asynccontextmanager
    async def watch(self, approval_id: str) -> AsyncIterator[Any]:
        """Register a holder; waits (bounded by the operation timeout) for the subscription, so a
        decision published right after this returns is not missed."""
        self.start()
        async with self.local.watch(approval_id) as watch:
            with anyio.move_on_after(self.subscribe_wait):
                await self._subscribed.wait()
            yield watch

    async def _listen(self) -> None:
        attempt = 0
        while not self._closed:
            pubsub = self.link.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                if attempt:
                    log.info("approval.wakeups_resumed", redis=self.link.where)
                    self.local.wake_all()  # what was published while we were away is gone: look again
                attempt = 0
                self._subscribed.set()
                while not self._closed:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_SECONDS)
                    if message is not None and message.get("type") == "message":
                        self._deliver(message.get("data"))
            except REDIS_ERRORS as exc:
                self._subscribed.clear()
                log.warning("approval.wakeups_lost", error=str(self.link.unavailable(exc)),
                            effect="held calls fall back to the safety poll until Redis is back")
                await anyio.sleep(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
                attempt += 1
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()

    def _deliver(self, data: Any) -> None:
        if isinstance(data, bytes) and 0 < len(data) <= MAX_ID_BYTES:
            self.local.wake(data.decode("utf-8", "replace"))

    async def aclose(self) -> None:
        """Stop listening, wake every local holder (they read the store once more), close the link."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.local.wake_all()
        await self.link.aclose()
