"""Replicas: calls/s with 1, 2 and 3 `dharma serve` replicas sharing one PostgreSQL ledger and one
Redis (docs/deploy.md), the latency the Redis round trips add to a call, and the replicas' CPU.

Each row starts its own replicas (tests/replicas/cluster.py: real processes, the HTTP tool API, a
fast Python tool behind a rate limit, so the limiter's store is on the path) and drives them from
this process with CLIENTS concurrent httpx clients spread round-robin, for SECONDS. Rows:

- `1 replica, SQLite, memory`: the embedded default, the baseline of the ratios;
- `1 replica, PostgreSQL, memory`: the shared ledger alone;
- `1/2/3 replicas, PostgreSQL + Redis`: the shared setup.

'cpu/call' is the CPU of all replica processes per call, from /proc; 'client cpu/call' is this
process. PostgreSQL (fsync on) and Redis share the same cores: on a 2-core machine the replicas
compete with them and with the client, so more replicas cannot add throughput here; the row shows
what sharing costs per call, which is what a bigger machine would multiply.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import Options, Results, Stats, fmt_num, fmt_time, table
from bench.mcp_stdio import proc_cpu
from tests.conftest import KEYS
from tests.redis_server import redis_bin, running_redis
from tests.replicas.cluster import Cluster, start_cluster

HEADERS = {"authorization": f"Bearer {KEYS['operator']}"}
LIMIT = [{"id": "per-principal", "key": ["principal"], "rate": 1_000_000, "burst": 1_000_000}]


async def _drive(cluster: Cluster, clients: int, seconds: float) -> dict[str, Any]:
    """Round-robin load from `clients` tasks for `seconds`: latencies, calls/s, CPU per call."""
    names = itertools.count()
    latencies: list[float] = []
    pids = [r.process.pid for r in cluster.replicas if r.process is not None]
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=clients * 2)) as http:
        for url in cluster.urls:  # warm each replica (imports, connections)
            for _ in range(20):
                await http.post(f"{url}/v1/tools/write_note:call", json={"arguments": {"path": "warm"}}, headers=HEADERS)
        clock = time.perf_counter
        cpu0, own0, start = sum(proc_cpu(p) for p in pids), time.process_time(), clock()

        async def client(offset: int) -> None:
            while clock() - start < seconds:
                i = next(names)
                t0 = clock()
                answer = await http.post(f"{cluster.urls[(i + offset) % len(cluster.urls)]}/v1/tools/write_note:call",
                                         json={"arguments": {"path": f"b{i}"}}, headers=HEADERS)
                latencies.append(clock() - t0)
                if answer.status_code != 200:
                    raise RuntimeError(f"bench call failed: {answer.status_code} {answer.text[:300]}")

        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = clock() - start
    n = len(latencies)
    return {"stats": Stats.of(latencies), "rate": n / wall, "cpu": (sum(proc_cpu(p) for p in pids) - cpu0) / n,
            "client_cpu": (time.process_time() - own0) / n}


async def _interleaved(a: Cluster, b: Cluster, seconds: float) -> tuple[Stats, Stats]:
    """One client alternating calls between `a` and `b`, call by call: their lone-call latencies
    under the same load, so the difference is theirs and not the machine's."""
    clock = time.perf_counter
    took: tuple[list[float], list[float]] = ([], [])
    async with httpx.AsyncClient(timeout=60) as http:
        for c in (a, b):
            for _ in range(20):
                await http.post(f"{c.urls[0]}/v1/tools/write_note:call", json={"arguments": {"path": "warm"}}, headers=HEADERS)
        start = clock()
        i = 0
        while clock() - start < seconds:
            for side, c in enumerate((a, b)):
                t0 = clock()
                await http.post(f"{c.urls[0]}/v1/tools/write_note:call", json={"arguments": {"path": f"i{i}"}}, headers=HEADERS)
                took[side].append(clock() - t0)
            i += 1
    return Stats.of(took[0]), Stats.of(took[1])


async def run(opts: Options, results: Results) -> None:
    seconds = 1.5 if opts.quick else 8.0
    clients = 4 if opts.quick else 12
    if opts.postgres is None or redis_bin() is None:
        why = "PostgreSQL " + opts.postgres_missing if opts.postgres is None else "redis-server not installed"
        table("replicas", ["setup"], [[f"NOT MEASURED: {why}"]])
        return
    rows: list[list[str]] = []
    base_rate = base_p50 = float("nan")
    single: dict[str, float] = {}
    memory_cluster: Cluster | None = None
    lone: tuple[Stats, Stats] | None = None
    with running_redis(redis_bin() or "") as redis, tempfile.TemporaryDirectory(prefix="dharma-bench-replicas-",
                                                                              dir=opts.workdir) as tmp:
        setups: list[tuple[str, int, dict[str, str] | None, bool]] = [
            ("1 replica, SQLite, memory", 1, None, False),
            ("1 replica, PostgreSQL, memory", 1, {"url": opts.postgres.new_database()}, False),
            ("1 replica, PostgreSQL + Redis", 1, {"url": opts.postgres.new_database()}, True),
            ("2 replicas, PostgreSQL + Redis", 2, {"url": opts.postgres.new_database()}, True),
            ("3 replicas, PostgreSQL + Redis", 3, {"url": opts.postgres.new_database()}, True),
        ]
        for k, (name, count, ledger, shared) in enumerate(setups):
            redis.flush()
            directory = Path(tmp) / f"setup{k}"
            cluster = await start_cluster(directory, replicas=count,
                                          ledger=ledger or {"path": str(directory / "ledger.db")},
                                          redis_url=redis.url if shared else None, rate_limits=LIMIT)
            keep = name == "1 replica, PostgreSQL, memory"  # kept running to compare with the next row
            try:
                if count == 1:
                    one = await _drive(cluster, 1, seconds / 2)
                    single[name] = one["stats"].p50
                got = await _drive(cluster, clients, seconds)
                if keep:
                    memory_cluster = cluster
                elif name == "1 replica, PostgreSQL + Redis":
                    lone = await _interleaved(memory_cluster, cluster, seconds)
            finally:
                if not keep:
                    for done in {id(cluster): cluster, id(memory_cluster): memory_cluster}.values() if memory_cluster else (cluster,):
                        with contextlib.suppress(Exception):
                            done.stop_all()
                    memory_cluster = None
            stats: Stats = got["stats"]
            if k == 0:
                base_rate, base_p50 = got["rate"], stats.p50
            rows.append([name, fmt_time(single.get(name, float("nan"))), fmt_time(stats.p50), fmt_time(stats.p99),
                         fmt_num(got["rate"]), f"{got['rate'] / base_rate:.2f}x", fmt_time(got["cpu"]),
                         fmt_time(got["client_cpu"])])
    assert lone is not None
    redis_cost = lone[1].p50 - lone[0].p50
    table("replicas",
          ["setup", "1 client p50", f"{clients} clients p50", "p99", "calls/s", "x 1 SQLite", "cpu/call", "client cpu/call"],
          rows,
          note=(f"HTTP tool API, round-robin over the replicas, {clients} clients, {seconds:g} s per row; PostgreSQL fsync on.\n"
                f"Redis round trips add {fmt_time(redis_cost)} to a lone call's p50: {fmt_time(lone[1].p50)} with Redis vs "
                f"{fmt_time(lone[0].p50)} with memory (1 replica, PostgreSQL ledger, one client alternating between them).\n"
                f"Baseline {fmt_time(base_p50)} p50 at {clients} clients."))
