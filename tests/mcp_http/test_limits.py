"""Bounded sessions and upstream processes at `/mcp` (issue 23): a caller cannot open sessions,
server processes or streams without limit, idle ones are reaped with their processes, and a
flood of refused `initialize`s leaves a well-behaved client's calls fast.

Every test runs `dharma serve`'s app on real sockets, with the official SDK client or a raw one,
in front of a real upstream: the toy server over Streamable HTTP, or the SDK stdio server
(tests/mcp/servers/py_server.py) that the gateway spawns once per legacy session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from tests.conftest import REPO, key_digest
from tests.helpers import wait_for
from tests.mcp_http.conftest import PROFILE, client, serve_gateway, toy_server, upstream, write_profile
from tests.mcp_http.raw import LEGACY, Raw, answer, ledger_text

STDIO_SERVER = REPO / "tests" / "mcp" / "servers" / "py_server.py"
#: Generous: a stdio server takes a second or two to start on a busy 2-core machine.
WAIT_SECONDS = 60.0


def _policy(tmp: Path) -> Path:
    """The test profile with one more principal, `reader`: the attacker of these tests."""
    principals = [*PROFILE["principals"], {"id": "reader", "api_key_sha256": key_digest("reader-key"), "tier": "user"}]
    return write_profile(tmp / "policy", principals=principals)


def _stdio() -> list[dict[str, Any]]:
    return [{"id": "py", "type": "mcp_stdio", "command": sys.executable, "args": [str(STDIO_SERVER)]}]


def server_pids() -> set[int]:
    """The stdio servers this test process runs (the gateway runs in it): children of ours, alive
    (not zombies), whose command line names the test server."""
    found: set[int] = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and str(STDIO_SERVER).encode() in cmdline:
            found.add(int(entry))
    return found


async def initialize(url: str, key: str) -> httpx.Response:
    """One raw legacy `initialize`; the answer as it came (a session id in its header when it opened)."""
    async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": key}) as http:
        return await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
            headers={"accept": "application/json, text/event-stream", "content-type": "application/json"})


async def delete(url: str, key: str, sid: str) -> int:
    async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": key}) as http:
        r = await http.delete(url, headers={"mcp-session-id": sid, "mcp-protocol-version": LEGACY})
        return r.status_code


def assert_refused(r: httpx.Response, setting: str) -> dict[str, Any]:
    """`r` is the 429 of a limit: Retry-After in whole seconds, the setting named in the message and `data.limit`."""
    assert r.status_code == 429, (r.status_code, r.text)
    assert int(r.headers["retry-after"]) >= 1
    assert "mcp-session-id" not in r.headers
    error = r.json()["error"]
    assert setting in error["message"] and error["data"]["limit"] == setting, error
    assert error["data"]["error_code"] == "rate_limited" and error["data"]["retry_after"] == int(r.headers["retry-after"])
    return error


async def metrics(base: str) -> str:
    async with httpx.AsyncClient(timeout=30, headers={"X-API-Key": "admin-key"}) as http:
        r = await http.get(base + "/metrics")
        assert r.status_code == 200, r.text
        return r.text


@contextlib.asynccontextmanager
async def sessions(url: str, key: str, n: int) -> AsyncIterator[list[Any]]:
    """`n` SDK clients (legacy sessions) of `key`, open while the block runs."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(client(url, key, mode="legacy")) for _ in range(n)]


# ---- sessions per principal and in total --------------------------------------------------------


async def sdk_refusal(url: str, key: str) -> str:
    """The error the SDK client raises when its `initialize` is refused (it fails, it does not hang)."""
    from mcp import MCPError

    try:
        with anyio.fail_after(WAIT_SECONDS):
            async with client(url, key, mode="legacy"):
                pass
    except BaseException as exc:  # the SDK raises it from its task group: look inside exception groups
        found = _first(exc, MCPError)
        if found is None:
            raise
        return str(found)
    raise AssertionError("the session opened")


def _first(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    if isinstance(exc, kind):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _first(inner, kind)
        if found is not None:
            return found
    return None


async def test_the_next_session_of_a_principal_at_its_limit_is_refused_with_429_naming_it(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)], policy=_policy(tmp_path), max_sessions_per_principal=3) as gw:
        async with sessions(gw.url, "reader-key", 3) as opened:
            for c in opened:
                assert (await c.call_tool("echo", {"message": "hi"})).content[0].text == "echo: hi"
            refused = await sdk_refusal(gw.url, "reader-key")  # the SDK client sees the gateway's message
            assert "session limit reached: 3 open sessions for principal 'reader' (mcp.max_sessions_per_principal)" in refused
            error = assert_refused(await initialize(gw.url, "reader-key"), "mcp.max_sessions_per_principal")
            assert error["code"] == -31003
            async with client(gw.url, "alice-key", mode="legacy") as other:  # another principal still gets in
                assert (await other.call_tool("echo", {"message": "yes"})).content[0].text == "echo: yes"
            [first] = _refusal_records(tmp_path)  # the first refusal is on the record at once
            assert (first["principal"], first["decision"], first["status"], first["error_code"], first["block_class"],
                    first["limit"]) == ("reader", "deny", "blocked", "rate_limited", "rate_limit", "mcp.max_sessions_per_principal")
            assert "count" not in first
        text = await metrics(gw.base)
        assert 'dharma_limit_refusals_total{limit="mcp.max_sessions_per_principal"} 2' in text
    # The one that followed within the window was counted, and its count recorded when the gateway stopped.
    first, counted = _refusal_records(tmp_path)
    assert (counted["count"], counted["limit"], counted["principal"]) == (1, "mcp.max_sessions_per_principal", "reader")
    assert counted["since"] >= first["time"]


def _refusal_records(tmp: Path) -> list[dict[str, Any]]:
    """The ledger's records of refused `initialize`s (a session that opens is no decision: no record)."""
    records = [json.loads(line)["entry"] for line in ledger_text(tmp / "state").splitlines()]
    return [r for r in records if r["method"] == "initialize"]


async def test_the_gateway_wide_limit_refuses_any_principal_once_reached(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)], policy=_policy(tmp_path), max_sessions=3) as gw:
        async with sessions(gw.url, "reader-key", 2) as _r, sessions(gw.url, "alice-key", 1) as _a:
            error = assert_refused(await initialize(gw.url, "approver-key"), "mcp.max_sessions")
            assert "session limit reached: 3 open sessions on this gateway (mcp.max_sessions)" in error["message"]
            assert "dharma_mcp_sessions_open 3" in await metrics(gw.base)
        # The clients ended their sessions (DELETE) on the way out: the slots are free again.
        async with sessions(gw.url, "approver-key", 3) as opened:
            assert len(opened) == 3


async def test_delete_frees_the_slot_at_once(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)], policy=_policy(tmp_path), max_sessions_per_principal=2) as gw:
        first, second = [await initialize(gw.url, "reader-key") for _ in range(2)]
        assert first.status_code == second.status_code == 200
        assert_refused(await initialize(gw.url, "reader-key"), "mcp.max_sessions_per_principal")
        assert await delete(gw.url, "reader-key", first.headers["mcp-session-id"]) == 200
        third = await initialize(gw.url, "reader-key")
        assert third.status_code == 200, third.text
        assert_refused(await initialize(gw.url, "reader-key"), "mcp.max_sessions_per_principal")


async def test_delete_ends_the_session_even_where_the_upstream_refuses_deletes(tmp_path: Path) -> None:
    """An upstream may answer DELETE 405 (it lets no client end sessions). The client has still
    ended its session with the gateway: the slot is freed, the id is dead, and the client is told so
    (200), not left believing a session it can no longer use holds on."""
    with toy_server(tmp_path, "--no-delete") as (url, _):
        async with serve_gateway(tmp_path, [upstream(url)], policy=_policy(tmp_path), max_sessions_per_principal=1) as gw:
            first = await initialize(gw.url, "reader-key")
            assert first.status_code == 200, first.text
            assert_refused(await initialize(gw.url, "reader-key"), "mcp.max_sessions_per_principal")
            assert await delete(gw.url, "reader-key", first.headers["mcp-session-id"]) == 200
            assert await delete(gw.url, "reader-key", first.headers["mcp-session-id"]) == 404  # gone
            second = await initialize(gw.url, "reader-key")
            assert second.status_code == 200, second.text


async def test_get_streams_per_session_are_bounded(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)], max_streams_per_session=1) as gw:
        async with Raw(gw.url) as raw:
            await raw.initialize()
            async with raw.standalone():
                r = await raw.http.get(gw.url, headers=raw.headers({"accept": "text/event-stream"}))
                assert_refused(r, "mcp.max_streams_per_session")
            async with raw.standalone():  # the first stream is closed: the session may open one again
                pass


async def test_limits_come_from_dharma_yaml_and_the_environment() -> None:
    from gateway.config import load_settings

    settings = load_settings(None, env={"DHARMA_MCP__MAX_SESSIONS_PER_PRINCIPAL": "5", "DHARMA_MCP__MAX_STDIO_PROCESSES": "7"},
                             overrides={"mcp": {"max_sessions": 40}})
    mcp = settings.mcp
    assert (mcp.max_sessions_per_principal, mcp.max_sessions, mcp.max_stdio_processes, mcp.session_idle_seconds) == (5, 40, 7, 300.0)
    assert (mcp.max_streams_per_session, mcp.session_limits().per_principal) == (4, 5)
    with pytest.raises(Exception, match="max_sessions"):
        load_settings(None, env={"DHARMA_MCP__MAX_SESSIONS": "0"})


# ---- stdio server processes ----------------------------------------------------------------------


async def test_an_idle_session_is_reaped_and_its_server_process_stopped(tmp_path: Path) -> None:
    """Nobody uses the session again (nor ends it): the reaper ends it within the idle time plus
    one sweep, and its process is gone, without any request to notice it. A session whose client
    keeps its GET stream open stays, with the same process, however long it is quiet."""
    # Well above the SDK client's 1 s wait before it opens its GET stream again, and above what a
    # loaded machine adds to it (at load 30 a 2 s idle time reaped the kept session between its
    # requests): the process of a session lives at least this long after its initialize answer.
    idle = 6.0
    async with serve_gateway(tmp_path, _stdio(), session_idle_seconds=idle) as gw:
        before = server_pids()
        abandoned = await initialize(gw.url, "alice-key")
        assert abandoned.status_code == 200, abandoned.text
        [pid] = await wait_for(lambda: server_pids() - before, "the session's server process")
        async with client(gw.url, "approver-key", mode="legacy") as kept:
            assert (await kept.call_tool("echo", {"text": "a"})).content[0].text == "echo: a"
            [kept_pid] = server_pids() - before - {pid}
            await wait_for(lambda: pid not in server_pids(), f"server process {pid} of the idle session to exit")
            await anyio.sleep(3 * idle)  # quiet for three idle times; the gateway ends its GET stream after each, it reconnects
            assert (await kept.call_tool("echo", {"text": "b"})).content[0].text == "echo: b"
            assert kept_pid in server_pids()
        async with Raw(gw.url) as raw:
            raw.sid = abandoned.headers["mcp-session-id"]
            assert (await raw.call("echo", {"text": "late"})).status_code == 404
        await wait_for(lambda: kept_pid not in server_pids(), "the ended session's process to exit")


async def test_stdio_processes_never_exceed_their_limit_under_a_flood_of_initializes(tmp_path: Path) -> None:
    limit = 3
    peak = 0
    async with serve_gateway(tmp_path, _stdio(), max_stdio_processes=limit, max_sessions_per_principal=100) as gw:
        before = server_pids()

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(server_pids() - before))
                await anyio.sleep(0.01)

        answers: list[httpx.Response] = []

        async def one() -> None:
            answers.append(await initialize(gw.url, "alice-key"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            async with anyio.create_task_group() as flood:
                for _ in range(20):
                    flood.start_soon(one)
            opened = [r for r in answers if r.status_code == 200]
            for r in answers:
                if r.status_code != 200:
                    error = assert_refused(r, "mcp.max_stdio_processes")
                    assert "process limit reached: 3 server processes of upstream 'py' are running" in error["message"]
            assert len(opened) == limit, [r.status_code for r in answers]
            running = await wait_for(lambda: server_pids() - before, "the sessions' processes")
            assert 'dharma_mcp_upstream_processes{upstream="py"} 3' in await metrics(gw.base)
            # DELETE stops a session's process and frees its slot; a new session then starts one.
            assert await delete(gw.url, "alice-key", opened[0].headers["mcp-session-id"]) == 200
            await wait_for(lambda: len(server_pids() - before) < limit and _processes(gw) < limit,
                           "the deleted session's process to exit")
            again = await initialize(gw.url, "alice-key")
            assert again.status_code == 200, again.text
            assert answer(again)["result"]["serverInfo"]["name"] == "dharma-test-server"
            tg.cancel_scope.cancel()
        assert peak <= limit, peak
        assert 'dharma_limit_refusals_total{limit="mcp.max_stdio_processes"} 17' in await metrics(gw.base)
        left = server_pids() - before
        assert left and len(left) <= limit and running
    # The gateway's shutdown stopped every process it ran.
    await wait_for(lambda: not (server_pids() - before), "the server processes to exit on shutdown")


async def test_a_client_that_hangs_up_before_its_session_opened_leaves_no_process(tmp_path: Path) -> None:
    """The primary upstream never answers `initialize`, so the session never opens (the client
    never learns its id); the client hangs up. The server process the gateway had started for
    the session on its stdio upstream is stopped, and its slot is free again."""
    async with black_hole() as url:
        ups = [upstream(url, id="silent"), {**_stdio()[0], "prefix": "py_"}]
        async with serve_gateway(tmp_path, ups, max_stdio_processes=1) as gw:
            before = server_pids()
            async with anyio.create_task_group() as tg:
                tg.start_soon(initialize, gw.url, "alice-key")
                await wait_for(lambda: server_pids() - before, "the session's process on the stdio upstream")
                tg.cancel_scope.cancel()  # the client hangs up
            await wait_for(lambda: not (server_pids() - before) and _processes(gw) == 0, "the abandoned session's process to exit")


@contextlib.asynccontextmanager
async def black_hole() -> AsyncIterator[str]:
    """An HTTP server that reads requests and never answers; yields its /mcp URL."""
    async def swallow(stream: Any) -> None:
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    await stream.receive()

    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, swallow)
        try:
            yield f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}/mcp"
        finally:
            tg.cancel_scope.cancel()


def _processes(gw: Any) -> int:
    """The session processes the gateway counts for the stdio upstream `py` (what its limit bounds)."""
    mcp = gw.gateway.metrics.mcp_open
    assert mcp is not None
    return mcp()[1]["py"]


# ---- the Redis form across replicas --------------------------------------------------------------


async def test_limits_hold_across_replicas_sharing_redis_and_expiry_frees_slots(toy_url: str, tmp_path: Path, redis_url: str) -> None:
    """Two gateways on one Redis count the same sessions: a principal's sessions on either replica
    add up, DELETE on one frees a slot for the other, and sessions that expire by TTL (nobody
    used or ended them) stop counting, so the count never leaks."""
    policy = _policy(tmp_path)
    config = {"redis": {"url": redis_url}}
    async with serve_gateway(tmp_path / "a", [upstream(toy_url)], policy=policy, config=config, max_sessions_per_principal=2,
                             max_sessions=3, session_idle_seconds=2.0) as a, \
            serve_gateway(tmp_path / "b", [upstream(toy_url)], policy=policy, config=config, max_sessions_per_principal=2,
                          max_sessions=3, session_idle_seconds=2.0) as b:
        on_a = await initialize(a.url, "reader-key")
        on_b = await initialize(b.url, "reader-key")
        assert on_a.status_code == on_b.status_code == 200
        assert_refused(await initialize(a.url, "reader-key"), "mcp.max_sessions_per_principal")
        assert (await initialize(b.url, "alice-key")).status_code == 200
        assert_refused(await initialize(a.url, "approver-key"), "mcp.max_sessions")
        assert await delete(a.url, "reader-key", on_b.headers["mcp-session-id"]) == 200  # a session opened on b, ended on a
        assert (await initialize(b.url, "reader-key")).status_code == 200
        # Nobody uses or ends these sessions: once Redis has expired them all (TTL), every slot is free.
        import redis.asyncio as aioredis

        async with aioredis.from_url(redis_url) as r:
            async def gone() -> bool:
                return not [k async for k in r.scan_iter("dharma:mcp:s:*")]

            await wait_for(gone, "Redis to expire the unused sessions")
        for url in (a.url, b.url):  # the reader's two, on either replica
            assert (await initialize(url, "reader-key")).status_code == 200
        assert (await initialize(a.url, "approver-key")).status_code == 200  # and the third of the total
        assert_refused(await initialize(b.url, "approver-key"), "mcp.max_sessions")


# ---- a flood of refused initializes does not slow a well-behaved client ---------------------------

ROUNDS, PER_ROUND = 10, 20  # 200 calls idle and 200 under the flood, in alternating short phases


async def test_a_well_behaved_clients_p99_stays_within_3x_while_a_flood_of_initializes_is_refused(tmp_path: Path) -> None:
    """alice calls a tool of the stdio upstream on her session while another process floods
    `initialize` with the reader key, which is at its limit: every one is refused before a server
    process could start. The flood is paused and resumed (SIGSTOP, SIGCONT) for short alternating
    phases, so the machine's own load weighs on idle and flooded calls alike; the flooded p99
    stays within 3x of the idle one."""
    async with serve_gateway(tmp_path, _stdio(), policy=_policy(tmp_path), max_sessions_per_principal=1) as gw:
        async with client(gw.url, "reader-key", mode="legacy"), client(gw.url, "alice-key", mode="legacy") as good:
            async def calls(n: int) -> list[float]:
                took = []
                for i in range(n):
                    started = time.perf_counter()
                    r = await good.call_tool("echo", {"text": str(i)})
                    took.append(time.perf_counter() - started)
                    assert r.content[0].text == f"echo: {i}"
                return took

            await calls(20)  # warm up
            idle: list[float] = []
            flooded: list[float] = []
            async with _flood(gw.url, tmp_path / "stop") as (flood, counts):
                for _ in range(ROUNDS):
                    flooded += await calls(PER_ROUND)
                    flood.send_signal(signal.SIGSTOP)
                    idle += await calls(PER_ROUND)
                    flood.send_signal(signal.SIGCONT)
        p99_idle, p99_flooded = _p99(idle), _p99(flooded)
        assert set(counts) == {"429"}, counts
        assert counts["429"] >= len(flooded), counts  # it was a flood: more refusals than the client made calls
        assert p99_flooded <= 3 * p99_idle, (f"p99 {p99_flooded * 1000:.2f} ms under the flood, {p99_idle * 1000:.2f} ms idle; "
                                             f"{counts['429']} initializes refused")


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


@contextlib.asynccontextmanager
async def _flood(url: str, stop: Path) -> AsyncIterator[tuple[subprocess.Popen[str], dict[str, int]]]:
    """`tests.mcp_http.flood` in its own process while the block runs (once its first answer came);
    yields the process and the count of each status it saw, filled in when the block ends."""
    counts: dict[str, int] = {}
    proc = subprocess.Popen([sys.executable, "-m", "tests.mcp_http.flood", url, "reader-key", "--connections", "2",
                             "--stop-file", str(stop)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert line.strip() == "flooding", (line, proc.stderr.read() if proc.stderr else "")
        yield proc, counts
    finally:
        stop.touch()
        proc.send_signal(signal.SIGCONT)
        try:
            out, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=WAIT_SECONDS))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    counts.update(json.loads(out.strip().splitlines()[-1]))


async def test_a_flood_of_refusals_is_one_record_per_window_and_every_refusal_is_counted(demo_gateway: Any, state_root: Path) -> None:
    """The first refusal of a principal by a limit is recorded at once; the rest of its window is
    one record carrying their count, written when the window is over; then it starts again."""
    from gateway.core.call import Credentials
    from gateway.mcp.calls import CallSite
    from gateway.mcp.refusals import LimitRefusals

    now = [0.0]
    tally = LimitRefusals(demo_gateway, window=10.0, clock=lambda: now[0])
    site = CallSite(credentials=Credentials(api_key="k"), principal="reader", protocol_version=None, modern=False, session_id=None)
    for _ in range(100):
        await tally.refused(site, "initialize", "mcp.max_sessions_per_principal")
    await tally.refused(dataclasses.replace(site, principal="alice"), "GET", "mcp.max_streams_per_session")
    now[0] = 9.0
    await tally.flush()  # the window is not over: nothing more yet
    assert [(r["principal"], r.get("count", 1)) for r in _limit_records(state_root)] == [("reader", 1), ("alice", 1)]
    now[0] = 10.0
    await tally.flush()
    now[0] = 10.5
    await tally.refused(site, "initialize", "mcp.max_sessions_per_principal")  # a new window: at once
    records = _limit_records(state_root)
    assert [(r["principal"], r["limit"], r.get("count", 1)) for r in records] == [
        ("reader", "mcp.max_sessions_per_principal", 1), ("alice", "mcp.max_streams_per_session", 1),
        ("reader", "mcp.max_sessions_per_principal", 99), ("reader", "mcp.max_sessions_per_principal", 1)]
    assert records[2]["since"] >= records[0]["time"] and records[2]["method"] == "initialize"


def _limit_records(state: Path) -> list[dict[str, Any]]:
    records = [json.loads(line)["entry"] for line in ledger_text(state).splitlines()]
    return [r for r in records if r.get("limit")]
