"""The Redis link every shared store uses: settings validation, errors that name the server but
never its password, and reconnection after an outage, against a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import RedisSettings, Settings, display_url
from gateway.stores.base import StoreUnavailable
from gateway.stores.redis import REDIS_ERRORS, connect


def test_redis_url_must_be_a_redis_url() -> None:
    with pytest.raises(ValidationError, match="redis://"):
        RedisSettings(url="http://127.0.0.1:6379")
    assert Settings(redis={"url": "rediss://h:6380/1"}).redis.url == "rediss://h:6380/1"
    assert Settings().redis.url is None


def test_display_url_hides_the_password() -> None:
    assert display_url("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert display_url("postgresql://dharma:pw@db/ledger") == "postgresql://dharma:***@db/ledger"
    assert display_url("redis://h:6379/0") == "redis://h:6379/0"
    assert "s3cret" not in display_url("redis://:s3cret@h:6379")


async def test_link_reports_an_outage_and_reconnects(own_redis: Any) -> None:
    url = own_redis.url.replace("redis://", "redis://default:s3cret-not-shown@")
    own_redis.stop()
    link = connect(RedisSettings(url=own_redis.url, connect_timeout_seconds=0.5, operation_timeout_seconds=0.5))
    shown = connect(RedisSettings(url=url))
    try:
        why = await link.ping()
        assert why is not None and f"127.0.0.1:{own_redis.port}" in why and "unavailable" in why
        assert "s3cret" not in shown.where
        try:
            await link.client.set(link.key("probe"), "1")
        except REDIS_ERRORS as exc:
            err = link.unavailable(exc)
            assert isinstance(err, StoreUnavailable) and str(own_redis.port) in str(err)
        else:
            pytest.fail("a command to a stopped Redis succeeded")
        own_redis.start()
        assert await link.ping() is None
        await link.client.set(link.key("probe"), "1")
        assert await link.client.get("dharma:probe") == b"1"
    finally:
        await link.aclose()
        await shown.aclose()
