"""MCP Streamable HTTP across replicas (issue 8): two `dharma serve` processes sharing one Redis
(sessions, event streams, signals) and one PostgreSQL ledger, behind a round-robin balancer with
no stickiness (tests/lb.py), in front of one SDK upstream over Streamable HTTP. The official SDK
client and a raw client go through the balancer; every part is real.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp.types as types
import pytest
import yaml

from tests.lb import RoundRobin
from tests.mcp_http.conftest import PYTHON, client, free_port, serve_asgi, upstream, write_profile
from tests.mcp_http.raw import Raw, answer, messages, sse_messages
from tests.mcp_http.toy_server import SECRET

READY_SECONDS = 60.0


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    from tests.pg import postgres_or_skip

    with postgres_or_skip() as server:
        yield server


def _config(tmp: Path, name: str, toy_url: str, redis: dict[str, Any] | None, ledger_url: str | None) -> Path:
    # the session test releases a held call by elicitation, answered on the other replica: an explicit opt-in
    policy = write_profile(tmp / "policy", approval={"allow_elicitation": True})
    doc: dict[str, Any] = {"policy": str(policy), "state_root": str(tmp / name),
                           "upstreams": [upstream(toy_url)], "mcp": {"hold_seconds": 20, "progress_interval": 0.2}}
    if redis is not None:
        doc["redis"] = redis
    if ledger_url is not None:
        doc["ledger"] = {"url": ledger_url}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


async def _ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(base + "/healthz")).status_code == 200:
                    return
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"replica {base} did not start: {log.read_text()[-3000:]}")
            await anyio.sleep(0.1)


@contextlib.asynccontextmanager
async def cluster(tmp: Path, toy_url: str, *, redis: dict[str, Any] | None, ledger_url: str | None = None,
                  replicas: int = 2) -> AsyncIterator[tuple[str, RoundRobin]]:
    """`replicas` × `dharma serve` behind a round-robin balancer; yields the balancer's /mcp URL and
    the balancer. With `ledger_url` they share one state root (keys, approvals) and that ledger,
    else each has its own state root and SQLite ledger (one writer per file). Replicas start one
    after the other (the first creates the keys), and are stopped (SIGTERM, then SIGKILL) after."""
    procs: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    try:
        for i in range(replicas):
            port = free_port()
            log = tmp / f"replica{i}.log"
            config = _config(tmp, "state" if ledger_url else f"state{i}", toy_url, redis, ledger_url)
            with open(log, "wb") as out:
                procs.append(subprocess.Popen([PYTHON, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
                                              stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            bases.append(f"http://127.0.0.1:{port}")
            await _ready(bases[-1], procs[-1], log)
        lb = RoundRobin(bases)
        try:
            async with serve_asgi(lb) as base:
                yield base + "/mcp", lb
        finally:
            await lb.aclose()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _other(lb: RoundRobin, body_has: bytes) -> int:
    """The replica that did not serve the last POST whose body has `body_has`."""
    served = lb.replicas_for("POST", body_has)
    assert served, body_has
    return 1 - served[-1]


async def test_a_session_continues_on_any_replica(toy_url: str, redis_url: str, postgres: Any, tmp_path: Path) -> None:
    ledger_url = postgres.new_database()
    async with cluster(tmp_path, toy_url, redis={"url": redis_url}, ledger_url=ledger_url) as (url, lb):
        asked: list[str] = []

        async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
            asked.append(params.message)
            lb.turn = _other(lb, b'"delete_file"')  # the answer goes to the replica not holding the call
            return types.ElicitResult(action="accept", content={"approve": True})

        async with client(url, "alice-key", mode="legacy", elicitation_callback=on_elicit) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert "echo" in names and "admin_reset" not in names  # visibility per principal, on any replica
            for i in range(6):
                r = await c.call_tool("echo", {"message": f"hi {i}"})
                assert not r.is_error and r.content[0].text == f"echo: hi {i}"
            denied = await c.call_tool("echo", {"message": "/etc/passwd"})
            assert denied.is_error and denied.meta["dharma.gateway/decision"]["error_code"] == "policy_blocked"
            hidden = await c.call_tool("admin_reset", {})
            assert hidden.is_error and "reset done" not in str(hidden.content)
            redacted = await c.call_tool("read_config", {})
            assert SECRET not in redacted.content[0].text
            # Elicitation: asked on the replica serving the call, answered through the other one.
            held = await c.call_tool("delete_file", {"path": "/tmp/x"})
            assert asked and not held.is_error and held.content[0].text == "deleted /tmp/x"
            answered_on = lb.replicas_for("POST", b'"approve":true')
            assert answered_on and answered_on[-1] != lb.replicas_for("POST", b'"delete_file"')[-1]
        # Every request of the session after initialize was spread over both replicas.
        assert set(lb.replicas_for("POST", mcp_session_id="*")) == {0, 1}

        async with Raw(url) as raw:
            await raw.initialize()
            # A stream the upstream closes early (polling): written on one replica while the answer
            # is still coming, resumed with Last-Event-ID on the other, which follows it to its end.
            r = await raw.call("read_polled", {"seconds": 2.0})
            assert r.status_code == 200 and not [m for m in messages(r) if "result" in m or "error" in m]
            primed = [line[4:].strip() for line in r.text.splitlines() if line.startswith("id:")]
            assert len(primed) == 1
            lb.turn = _other(lb, b'"read_polled"')
            started = time.monotonic()
            status, replay = await raw.fetch({"last-event-id": primed[0]})
            waited = time.monotonic() - started
            resumed_on = lb.replicas_for("GET", last_event_id=primed[0])
            assert resumed_on == [_other(lb, b'"read_polled"')]
            assert status == 200 and SECRET not in replay and "config polled" in replay and "REDACTED" in replay
            assert waited > 1.0  # it followed a stream still being written (the answer came ~2 s later)
            got = [m for m in sse_messages(replay) if m.get("id") == raw.next_id]
            assert len(got) == 1 and got[0]["result"]["_meta"]["dharma.gateway/receipt"]

            # notifications/cancelled for a call held on one replica, sent through the other.
            async def cancel_when_held() -> None:
                with anyio.fail_after(30):
                    while not lb.replicas_for("POST", b'"delete_file"'):
                        await anyio.sleep(0.05)
                    async with httpx.AsyncClient(headers={"X-API-Key": "approver-key"}) as http:
                        while not (await http.get(url.removesuffix("/mcp") + "/v1/approvals")).json()["approvals"]:
                            await anyio.sleep(0.1)
                lb.turn = _other(lb, b'"delete_file"')
                note = await raw.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                       "params": {"requestId": raw.next_id, "reason": "user"}})
                assert note.status_code == 202

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_held)
                with anyio.fail_after(15):  # well inside hold_seconds (20): the cancel ended the hold
                    held_call = await raw.call("delete_file", {"path": "/tmp/y"})
            assert answer(held_call).get("error", {}).get("code") == -32800, held_call.text
            assert "deleted /tmp/y" not in held_call.text

            # DELETE on one replica ends the session on every replica.
            lb.turn = 0
            gone = await raw.http.delete(url, headers=raw.headers())
            assert gone.status_code == 200
            for _ in range(2):
                after = await raw.call("echo", {"message": "x"})
                assert after.status_code == 404 and "echo: x" not in after.text
            assert {lb.served[-1][1], lb.served[-2][1]} == {0, 1}

        # Another principal presenting a live session id gets what an unknown id gets, on any replica.
        async with Raw(url) as owner, Raw(url, key="approver-key") as thief:
            await owner.initialize()
            thief.sid = owner.sid
            for _ in range(2):
                stolen = await thief.call("echo", {"message": "x"})
                assert stolen.status_code == 404 and "echo" not in stolen.text

    # One ledger: both replicas recorded their calls in the same PostgreSQL ledger.
    from audit.postgres import PostgresLedgerReader

    with PostgresLedgerReader(ledger_url) as reader:
        records = [json.dumps(json.loads(bytes(r[2]))) for r in reader.iter_records()]
    echoes = [r for r in records if '"tool": "echo"' in r]
    assert len(echoes) >= 7 and any('"policy_blocked"' in r for r in echoes), records[-3:]


async def test_the_stateless_era_needs_nothing_shared(toy_url: str, tmp_path: Path) -> None:
    # No Redis and no shared ledger: 2026-07-28 requests carry everything, so any replica serves any.
    async with cluster(tmp_path, toy_url, redis=None) as (url, lb):
        async with Raw(url) as raw:
            for i in range(4):
                r = await raw.modern("tools/call", {"name": "echo", "arguments": {"message": f"m{i}"}})
                assert r.status_code == 200 and answer(r)["result"]["content"][0]["text"] == f"echo: m{i}"
            listed = await raw.modern("tools/list", {})
            assert "admin_reset" not in listed.text and '"echo"' in listed.text
            denied = await raw.modern("tools/call", {"name": "echo", "arguments": {"message": "/etc/x"}})
            assert answer(denied)["result"]["isError"] is True
    assert set(lb.replicas_for("POST", b"tools/call")) == {0, 1}


async def test_redis_down_refuses_shared_sessions_then_recovers(toy_url: str, own_redis: Any, tmp_path: Path) -> None:
    redis = {"url": own_redis.url, "operation_timeout_seconds": 0.5, "connect_timeout_seconds": 0.5}
    async with cluster(tmp_path, toy_url, redis=redis) as (url, _lb):
        async with Raw(url) as raw:
            await raw.initialize()
            assert "echo: a" in (await raw.call("echo", {"message": "a"})).text
            own_redis.pause()  # hung: every lookup runs into the operation timeout
            try:
                for _ in range(2):
                    r = await raw.call("echo", {"message": "b"})
                    assert r.status_code == 503 and "echo: b" not in r.text
                    error = answer(r)["error"]
                    assert f"Redis at {own_redis.url} is unavailable" in error["message"]
                    assert error["data"]["error_code"] == "backend_unavailable"
            finally:
                own_redis.resume()
            with anyio.fail_after(30):  # the replicas reconnect by themselves
                while (r := await raw.call("echo", {"message": "c"})).status_code != 200:
                    await anyio.sleep(0.1)
            assert "echo: c" in r.text
            own_redis.stop()  # gone: refused the same way
            r = await raw.call("echo", {"message": "d"})
            assert r.status_code == 503 and "Redis at" in answer(r)["error"]["message"]
            own_redis.start()  # back, empty (no persistence): the session is unknown, a new one works
            with anyio.fail_after(30):
                while (r := await raw.call("echo", {"message": "e"})).status_code == 503:
                    await anyio.sleep(0.1)
            assert r.status_code == 404
            await raw.initialize()
            assert "echo: f" in (await raw.call("echo", {"message": "f"})).text


def test_stdio_upstreams_cannot_share_sessions(tmp_path: Path) -> None:
    from gateway.config import load_settings
    from gateway.core.errors import ConfigError
    from gateway.transports.mcp_http.app import session_store

    settings = load_settings(None, env={}, overrides={
        "policy": str(write_profile(tmp_path)), "redis": {"url": "redis://127.0.0.1:1/0"},
        "upstreams": [{"id": "files", "type": "mcp_stdio", "command": "true", "args": []}]})
    with pytest.raises(ConfigError, match="files: an mcp_stdio upstream cannot serve MCP sessions shared through Redis"):
        session_store(settings, settings.upstreams)
