"""Several real `dharma serve` replicas sharing one ledger (PostgreSQL) and one Redis, as
docs/deploy.md runs them; used by the replica tests (tests/replicas) and bench/replicas.py.

`start_cluster` writes a dharma.yaml, starts the replicas on free ports (one state root, so one
key set: receipts from any replica verify against the same JWKS) and waits until each answers
/healthz. `Cluster.kill(i)` is kill -9; clients spread calls round-robin themselves
(`Cluster.urls`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import REPO, write_policy
from tests.test_cli import cli_env, free_port

READY_SECONDS = 90.0

FAST_BACKEND = '''
from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

async def write_note(path: str):
    return {"written": path}

async def delete_note(path: str):
    return {"deleted": path}

def backend(backend_id: str = "notes") -> CallableBackend:
    return CallableBackend(backend_id, {
        "write_note": (write_note, ToolSpec("write_note", "Write a note.", SCHEMA)),
        "delete_note": (delete_note, ToolSpec("delete_note", "Delete a note.", SCHEMA)),
    })
'''


@dataclass
class Replica:
    port: int
    log: Path
    process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Cluster:
    config: Path
    state_root: Path
    ledger_url: str
    replicas: list[Replica] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def start(self, replica: Replica) -> None:
        log = replica.log.open("a")  # a file, not a pipe: an unread pipe would stall the server
        replica.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(self.config), "serve", "--port", str(replica.port)],
            env=cli_env(self.state_root), stdout=subprocess.DEVNULL, stderr=log, text=True,
        )
        log.close()

    async def wait_ready(self, replica: Replica) -> None:
        deadline = time.monotonic() + READY_SECONDS
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                assert replica.alive, f"replica on {replica.port} exited: {replica.log.read_text()[-3000:]}"
                try:
                    if (await http.get(replica.url + "/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"replica on {replica.port} not ready: {replica.log.read_text()[-3000:]}"
                await asyncio.sleep(0.05)

    def kill(self, index: int) -> None:
        """kill -9 replica `index` and reap it."""
        process = self.replicas[index].process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def stop_all(self) -> None:
        for replica in self.replicas:
            if replica.alive and replica.process is not None:
                replica.process.terminate()
        for replica in self.replicas:
            if replica.process is not None:
                try:
                    replica.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    replica.process.kill()
                    replica.process.wait()


async def start_cluster(directory: Path, *, replicas: int, ledger: dict[str, str], redis_url: str | None,
                        **overrides: Any) -> Cluster:
    """Write the configuration under `directory` and start `replicas` gateways on it.

    `ledger` is the `ledger:` section (`{"url": …}` or `{"path": …}`); `redis_url` None keeps
    state in memory; `overrides` go on top of the test profile (tests.conftest.TEST_PROFILE).
    """
    modules = directory / "modules"
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "notes_backend.py").write_text(FAST_BACKEND, encoding="utf-8")
    state_root = directory / "state"
    state_root.mkdir(exist_ok=True)
    settings: dict[str, Any] = {
        "policy": str(write_policy(directory / "policy", **{"backend_timeout_seconds": 30, **overrides})),
        "python_path": [str(modules), str(REPO)],
        "ledger": ledger,
        "upstreams": [{"id": "notes", "type": "python", "target": "notes_backend:backend"}],
        "log_level": "warning",
    }
    if redis_url is not None:
        # the product's default is 1 s; 2 s here so a replica starved of CPU on a busy 2-core machine
        # is not refused for a slow answer (a stopped Redis still refuses at once: connection refused)
        settings["redis"] = {"url": redis_url, "operation_timeout_seconds": 2.0, "connect_timeout_seconds": 2.0}
    config = directory / "dharma.yaml"
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    c = Cluster(config, state_root, ledger.get("url") or ledger["path"])
    for _ in range(replicas):
        port = free_port()
        c.replicas.append(Replica(port, state_root / f"serve-{port}.log"))
    try:
        c.start(c.replicas[0])  # the first creates the keys; the others then read the same ones
        await c.wait_ready(c.replicas[0])
        for replica in c.replicas[1:]:
            c.start(replica)
        await asyncio.gather(*(c.wait_ready(r) for r in c.replicas[1:]))
    except BaseException:
        c.stop_all()
        raise
    return c
