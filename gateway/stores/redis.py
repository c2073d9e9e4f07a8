"""Redis as the replicas' shared state (design §7): the one place a Redis client is made.

Every Redis-backed store takes a `RedisLink`: the asyncio client with bounded connect and
operation timeouts, the key prefix, and `unavailable()`, which turns any Redis error into
`StoreUnavailable` naming the server (never its password) so each stage decides, as with every
other store, whether that fails open or closed. redis-py reconnects by itself on the next
command, so a Redis that comes back is used again without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.config import RedisSettings, display_url
from gateway.stores.base import StoreUnavailable

#: What a failed Redis command may raise besides RedisError (timeouts and refused connections
#: surface as OSError subclasses from the socket layer on some paths).
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)


@dataclass(slots=True)
class RedisLink:
    """A shared Redis client plus what every store needs to use it safely."""

    client: aioredis.Redis
    prefix: str
    where: str

    def key(self, *parts: str) -> str:
        """A key under the gateway's prefix; parts are joined with `:`."""
        return self.prefix + ":".join(parts)

    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        """The error a store raises when Redis fails: says which Redis and what went wrong."""
        return StoreUnavailable(f"Redis at {self.where} is unavailable: {type(exc).__name__}: {exc}")

    async def ping(self) -> str | None:
        """None if Redis answers, else why not (for /healthz)."""
        try:
            await self.client.ping()
        except REDIS_ERRORS as exc:
            return str(self.unavailable(exc))
        return None

    async def aclose(self) -> None:
        await self.client.aclose()


def connect(settings: RedisSettings) -> RedisLink:
    """A client for `settings.url` (lazy: nothing is sent until the first command)."""
    if settings.url is None:
        raise ValueError("redis.url is not set")
    client: Any = aioredis.Redis.from_url(
        settings.url,
        socket_connect_timeout=settings.connect_timeout_seconds,
        socket_timeout=settings.operation_timeout_seconds,
        retry_on_timeout=False,
        health_check_interval=30,
    )
    return RedisLink(client=client, prefix=settings.key_prefix, where=display_url(settings.url))
