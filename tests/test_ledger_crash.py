"""Kill -9 under load, on each ledger backend: no acknowledged call is missing from the ledger.

A real `dharma serve` with a fast backend tool takes calls from several concurrent clients; once
enough calls were answered and the writer signed a periodic checkpoint this round (positive
signals, never a fixed sleep), the server gets SIGKILL. Three rounds on the same ledger (a SQLite
file, or a PostgreSQL database started from the installed binaries). Afterwards every answered
call has its decision and outcome records, and `dharma audit verify` passes.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from audit.query import query_records
from tests.audit.conftest import BACKENDS, Location, new_location, open_reader
from tests.conftest import KEYS, REPO, write_policy
from tests.test_cli import cli_env, dharma, free_port

ROUNDS = 3
CLIENTS = 6
ACKS_PER_ROUND = 25
ROUND_TIMEOUT_S = 60

FAST_BACKEND = '''
from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

async def write_note(path: str):
    return {"written": path}

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

def backend(backend_id: str = "notes") -> CallableBackend:
    return CallableBackend(backend_id, {"write_note": (write_note, ToolSpec("write_note", "Answer at once.", SCHEMA))})
'''


def stored_checkpoints(location: Location) -> list[int]:
    """Sizes of the checkpoints the ledger holds now."""
    with open_reader(location) as reader:
        return [size for size, _ in reader.checkpoints()]


async def wait_healthy(http: httpx.AsyncClient, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while True:
        assert server.poll() is None, "the gateway exited before it was healthy (see its serve-*.log)"
        try:
            if (await http.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "dharma serve did not start"
        await asyncio.sleep(0.05)


async def one_round(config: Path, state_root: Path, location: Location, names: Any) -> set[str]:
    """Serve, load from CLIENTS concurrent clients, SIGKILL once ACKS_PER_ROUND answers came back and
    a new checkpoint is stored; return the request ids that were answered."""
    port = free_port()
    log = (state_root / f"serve-{port}.log").open("w")  # a file, not a pipe: a full unread pipe would stall the server
    server = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config), "serve", "--port", str(port)],
                              env=cli_env(state_root), stdout=subprocess.DEVNULL, stderr=log, text=True)
    acked: set[str] = set()
    enough = asyncio.Event()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            await wait_healthy(http, server)
            checkpoints_before = stored_checkpoints(location)  # the serving gateway has created the ledger

            async def client() -> None:
                while server.poll() is None:
                    request_id = f"crash-{next(names)}"
                    try:
                        answer = await http.post("/v1/tools/write_note:call", json={"arguments": {"path": request_id}},
                                                 headers={"authorization": f"Bearer {KEYS['operator']}",
                                                          "x-request-id": request_id})
                    except httpx.TransportError:
                        return  # the server died mid-call: not acknowledged
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["request_id"] == request_id
                    acked.add(request_id)
                    if len(acked) >= ACKS_PER_ROUND:
                        enough.set()

            clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
            await asyncio.wait_for(enough.wait(), ROUND_TIMEOUT_S)
            deadline = time.monotonic() + ROUND_TIMEOUT_S
            while len(stored_checkpoints(location)) <= len(checkpoints_before):  # the periodic checkpoint, under load
                assert time.monotonic() < deadline, f"no periodic checkpoint while serving; stored: {checkpoints_before}"
                await asyncio.sleep(0.05)
            server.send_signal(signal.SIGKILL)  # mid-load: the clients are still sending
            server.wait(timeout=30)
            await asyncio.wait_for(asyncio.gather(*clients), ROUND_TIMEOUT_S)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=30)
        log.close()
    assert server.returncode == -signal.SIGKILL
    return acked


@pytest.mark.parametrize("backend", BACKENDS)
async def test_kill_9_under_load_loses_no_acknowledged_call(backend: str, request: pytest.FixtureRequest,
                                                             tmp_path: Path) -> None:
    state_root = tmp_path / "state"
    state_root.mkdir()
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "fast_backend.py").write_text(FAST_BACKEND, encoding="utf-8")
    location = new_location(backend, request, state_root)
    ledger = {"url": location} if isinstance(location, str) else {"path": str(location)}
    config = tmp_path / "dharma.yaml"
    config.write_text(yaml.safe_dump({
        "policy": str(write_policy(tmp_path / "policy", backend_timeout_seconds=30)),
        "python_path": [str(modules), str(REPO)], "ledger": ledger,
        "upstreams": [{"id": "notes", "type": "python", "target": "fast_backend:backend"}],
    }), encoding="utf-8")

    names = itertools.count()
    acked: set[str] = set()
    for _ in range(ROUNDS):
        acked |= await one_round(config, state_root, location, names)

    with open_reader(location) as reader:
        kinds: dict[str, set[str]] = {}
        for record in query_records(reader):
            kinds.setdefault(record["request_id"], set()).add(record.get("kind", "single"))
    missing = sorted(r for r in acked if not {"decision", "outcome"} <= kinds.get(r, set()))
    assert len(acked) >= ROUNDS * ACKS_PER_ROUND and missing == [], f"answered but not in the ledger: {missing}"
    verify = dharma("audit", "verify", "--ledger", location, state_root=state_root, timeout=120)
    assert verify.rc == 0 and verify.out.startswith("OK"), verify.out + verify.err
    assert "checkpoint(s) matched" in verify.out and " 0 checkpoint(s)" not in verify.out, verify.out
