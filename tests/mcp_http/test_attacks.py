"""Attacks on /mcp, each a test that fails if the bypass works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mcp_http.conftest import serve_gateway, upstream, write_profile
from tests.mcp_http.raw import LEGACY, Raw, answer, ledger_text, messages
from tests.mcp_http.toy_server import SECRET


def _event_ids(text: str) -> list[str]:
    return [line[3:].strip() for line in text.splitlines() if line.startswith("id:")]


async def test_resumed_stream_cannot_replay_an_unredacted_result(toy_url: str, tmp_path: Path) -> None:
    # Control: against the toy server directly, resuming replays the raw tools/call result.
    async with Raw(toy_url) as direct:
        await direct.initialize()
        r = await direct.call("read_config")
        assert SECRET in r.text
        ids = _event_ids(r.text)
        assert ids, "the toy server must number its events for this test to mean anything"
        replayed = await direct.listen({"last-event-id": ids[0]}, until=SECRET)
        assert SECRET in replayed  # the hole exists upstream
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.call("read_config")
            assert r.headers["content-type"].startswith("text/event-stream")
            assert SECRET not in r.text and "REDACTED" in r.text
            # The gateway numbers the stream itself (priming event first, with retry:), never with the upstream's ids.
            own = _event_ids(r.text)
            assert own and not set(own) & set(ids) and "retry:" in r.text.split("\n\n")[0]
            assert all(len(i.partition(".")[0]) >= 20 for i in own)  # opaque, unguessable
            # Not ours: nothing is replayed. While the session's standalone stream is open, a GET the
            # gateway does not answer from its store goes upstream and ends with the upstream's 409,
            # a positive signal that comes after anything a replay would have sent.
            async with c.standalone():
                for guess in [*ids, *map(str, range(1, 40))]:
                    status, replay = await c.fetch({"last-event-id": guess})
                    assert status == 409 and "Only one SSE stream" in replay, (status, replay)
                    assert SECRET not in replay and "REDACTED" not in replay
            # Resuming from the gateway's own priming id replays what the gateway sent: the governed result.
            status, replay = await c.fetch({"last-event-id": own[0]})
            assert status == 200 and SECRET not in replay and "REDACTED" in replay


async def test_stream_closed_by_the_upstream_resumes_from_the_gateway_store(toy_url: str, tmp_path: Path) -> None:
    # The upstream closes its POST stream mid-call (SSE polling). The gateway closes the client's
    # stream the same way, resumes the upstream itself, governs the answer, and replays only that.
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.call("read_polled")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert not [m for m in messages(r) if "result" in m or "error" in m]  # closed before the answer
            primed = _event_ids(r.text)
            assert len(primed) == 1 and "retry:" in r.text
            async with Raw(gw.url) as other:  # another session cannot use this session's ids
                await other.initialize()
                async with other.standalone():  # the stolen id ends at the upstream's 409 (see above)
                    status, stolen = await other.fetch({"last-event-id": primed[0]})
                assert status == 409 and "Only one SSE stream" in stolen, (status, stolen)
                assert "config polled" not in stolen and SECRET not in stolen
            status, replay = await c.fetch({"last-event-id": primed[0]})
            assert status == 200 and SECRET not in replay and "config polled" in replay and "REDACTED" in replay
            got = [m for m in (json.loads(line[5:]) for line in replay.splitlines() if line.startswith("data:") and line[5:].strip())
                   if m.get("id") == c.next_id]
            assert len(got) == 1 and got[0]["result"]["_meta"]["dharma.gateway/receipt"]
            status, again = await c.fetch({"last-event-id": primed[0]})  # replayable while the store keeps it
            assert status == 200 and again.count(f'"id":{c.next_id},"result"') == 1 and SECRET not in again


async def test_modern_headers_must_match_the_body(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            ok = await c.modern("tools/call", {"name": "echo", "arguments": {"message": "x"}})
            assert ok.status_code == 200 and "echo: x" in ok.text
            # Mcp-Name says an allowed tool, the body names a hidden one.
            r = await c.modern("tools/call", {"name": "admin_reset", "arguments": {}}, {"mcp-name": "echo"})
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32020
            assert "reset done" not in r.text
            r = await c.modern("tools/call", {"name": "echo", "arguments": {"message": "x"}}, {"mcp-method": "tools/list"})
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32020
            r = await c.modern("tools/call", {"name": "run_query", "arguments": {"region": "eu", "query": "q"}},
                               {"mcp-param-region": "us"})
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32020
            r = await c.modern("tools/call", {"name": "run_query", "arguments": {"region": "eu", "query": "q"}},
                               {"mcp-param-region": "eu"})
            assert r.status_code == 200 and "ran 'q' in eu" in r.text
            r = await c.modern("tools/list", {}, {"mcp-method": "tools/call"})
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32020
        assert ledger_text(tmp_path / "state").count('"stage":"mcp"') >= 4  # each refusal is recorded


async def test_modern_param_headers_are_recomputed_when_arguments_are_rewritten(toy_url: str, tmp_path: Path) -> None:
    # The sanitizer strips invisible characters from arguments; the forwarded Mcp-Param-Region
    # must follow the rewritten body or the upstream answers -32020.
    region = "eu\u200b"
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            from tests.mcp_http.raw import MODERN  # noqa: F401
            import base64
            encoded = "=?base64?" + base64.b64encode(region.encode()).decode() + "?="
            r = await c.modern("tools/call", {"name": "run_query", "arguments": {"region": region, "query": "q"}},
                               {"mcp-param-region": encoded})
            assert r.status_code == 200, r.text
            assert answer(r)["result"]["isError"] is False, r.text


async def test_duplicate_keys_are_refused(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            body = ('{"jsonrpc":"2.0","id":7,"method":"tools/call",'
                    '"params":{"name":"echo","name":"admin_reset","arguments":{}}}')
            r = await c.post(body)
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32600
            assert "duplicate key 'name'" in answer(r)["error"]["message"]
            assert "reset done" not in r.text


async def test_batch_cannot_smuggle_a_call(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize(LEGACY)
            batch = [{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "admin_reset", "arguments": {}}}]
            r = await c.post(batch)
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32600
            assert "reset done" not in r.text
        async with Raw(gw.url) as c:  # 2025-03-26 has batches: every element is governed on its own
            await c.initialize("2025-03-26")
            batch = [{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "admin_reset", "arguments": {}}},
                     {"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "b"}}}]
            r = await c.post(batch)
            assert "reset done" not in r.text
            got = {m["id"]: m for m in messages(r)}
            assert set(got) == {9, 10}
            assert "echo: b" in json.dumps(got[10])
            assert "error" in got[9] or got[9]["result"].get("isError")


@pytest.mark.parametrize("name", ["Admin_reset", "ADMIN_RESET", "admin_rеset", "ａｄｍｉｎ_reset", "admin_reset\u200b", "admіn_reset"])
async def test_lookalike_names_are_unknown(toy_url: str, tmp_path: Path, name: str) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.call(name)
            assert "reset done" not in r.text
            unknown = await c.call("no_such_tool")
            assert answer(r) != {} and json.dumps(answer(r)).replace(json.dumps(name)[1:-1], "X").split('"_meta"')[0] == \
                json.dumps(answer(unknown)).replace("no_such_tool", "X").replace(f'"id": {c.next_id}', f'"id": {c.next_id - 1}').split('"_meta"')[0]


async def test_tools_call_as_notification_is_refused(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.post({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "crash", "arguments": {}}})
            assert r.status_code == 400 and answer(r)["error"]["code"] == -32600
            ok = await c.call("echo", {"message": "still alive"})  # crash was not forwarded
            assert "echo: still alive" in ok.text


async def test_session_is_bound_to_its_principal(toy_url: str, tmp_path: Path) -> None:
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url, "admin-key") as admin:
            await admin.initialize()
            async with Raw(gw.url, "alice-key") as alice:
                alice.sid = admin.sid
                r = await alice.call("admin_reset")
                assert r.status_code == 404 and "reset done" not in r.text


async def test_client_credentials_never_reach_the_upstream(tmp_path: Path) -> None:
    import anyio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    import socket
    import uvicorn

    seen: list[dict[str, str]] = []

    async def mcp(request: Request) -> JSONResponse:
        seen.append(dict(request.headers))
        body = await request.json()
        return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "result": {
            "protocolVersion": LEGACY, "capabilities": {}, "serverInfo": {"name": "spy", "version": "0"}}},
            headers={"mcp-session-id": "up-1"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/mcp", mcp, methods=["POST"])]), log_level="warning"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        async with serve_gateway(tmp_path, [upstream(url, "spy")]) as gw:
            async with Raw(gw.url) as c:
                c.http.headers["authorization"] = "Bearer alice-key"
                c.http.headers["cookie"] = "session=secret"
                await c.initialize()
        server.should_exit = True
    assert seen
    for headers in seen:
        assert "authorization" not in headers and "x-api-key" not in headers and "cookie" not in headers


async def test_task_augmented_calls_to_held_or_redacted_tools_are_refused(toy_url: str, tmp_path: Path) -> None:
    task = {"ttl": 60000}
    async with serve_gateway(tmp_path, [upstream(toy_url)]) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            for name, args in (("read_config", {}), ("delete_file", {"path": "/tmp/x"})):  # redacted; held
                r = await c.call(name, args, task=task)
                result = answer(r)["result"]
                assert result["isError"] is True and "as a task" in result["content"][0]["text"], r.text
                assert SECRET not in r.text and "deleted" not in r.text
                assert "dharma.gateway/receipt" in result["_meta"]
            hidden = await c.call("admin_reset", {}, task=task)
            assert "as a task" not in hidden.text and "reset done" not in hidden.text
    # A tool the policy neither holds nor redacts may run as a task (the upstream decides how).
    policy = write_profile(tmp_path / "plain", rule_sets=["rules.yaml"])
    async with serve_gateway(tmp_path / "b", [upstream(toy_url)], policy) as gw:
        async with Raw(gw.url) as c:
            await c.initialize()
            r = await c.call("echo", {"message": "hi"}, task=task)
            assert "as a task" not in r.text and "echo: hi" in r.text
