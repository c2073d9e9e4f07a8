"""Fixtures of the replica tests: `cluster(replicas, **profile overrides)` starts real `dharma
serve` replicas (tests/replicas/cluster.py) on one real PostgreSQL ledger and one real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.pg import PostgresServer
from tests.replicas.cluster import Cluster, start_cluster

MakeCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def cluster(tmp_path: Path, postgres: PostgresServer, own_redis: Any) -> AsyncIterator[MakeCluster]:
    """Start `replicas` gateways under the test profile with `overrides`; `Cluster.redis` is the Redis."""
    made: list[Cluster] = []

    async def make(replicas: int = 3, **overrides: Any) -> Cluster:
        c = await start_cluster(tmp_path / f"cluster{len(made)}", replicas=replicas,
                                ledger={"url": postgres.new_database()}, redis_url=own_redis.url, **overrides)
        c.redis = own_redis  # type: ignore[attr-defined]
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop_all()
