"""The auditor's HTTP API (`/v1/audit/`) end to end: the real `dharma serve` app over a real Gateway
(real keys; every test on a SQLite ledger and on a real PostgreSQL one) through httpx's ASGI
transport; the CLI run as a real process to compare."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from audit import merkle
from audit.checkpoint import verify_checkpoint_jwks
from gateway.ledger_access import ledger_location
from tests.audit.conftest import BACKENDS, Location, attacker, new_location
from tests.conftest import KEYS, REPO, TEST_PROFILE, OpenGateway, key_digest, write_policy

AUDITOR_KEY = "auditor-key"
AUDITOR = {"authorization": f"Bearer {AUDITOR_KEY}"}
ADMIN = {"authorization": f"Bearer {KEYS['admin']}"}
OPERATOR = {"authorization": f"Bearer {KEYS['operator']}"}
READER = {"authorization": f"Bearer {KEYS['reader']}"}


@pytest.fixture
def auditor_policy(tmp_path: Path) -> Path:
    """The test profile plus a principal with role `auditor` (and no tools)."""
    profile = copy.deepcopy(TEST_PROFILE)
    profile["principals"].append({"id": "auditor", "api_key_sha256": key_digest(AUDITOR_KEY), "tier": "reader", "roles": ["auditor"]})
    return write_policy(tmp_path / "policy", profile)


@pytest.fixture(params=BACKENDS)
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """A SQLite file or a new PostgreSQL database (set up before the gateway, so dropped after it closed)."""
    return new_location(request.param, request, tmp_path)


@pytest.fixture
async def gw(ledger_at: Location, open_test_gateway: OpenGateway, auditor_policy: Path, sandbox: Path) -> Any:
    """A real Gateway whose ledger is a SQLite file or a PostgreSQL database (the API reads either)."""
    (sandbox / "a.txt").write_text("A", encoding="utf-8")
    ledger = {"url": ledger_at} if isinstance(ledger_at, str) else {"path": str(ledger_at)}
    return await open_test_gateway(auditor_policy, ledger=ledger)


def where(gw: Any) -> Location:
    """The gateway's ledger: its file or its postgresql:// URL."""
    return ledger_location(gw.settings)


@pytest.fixture
async def http(gw: Any) -> AsyncIterator[httpx.AsyncClient]:
    from gateway.transports.http_api.app import build_app

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(gw)), base_url="http://gateway.test") as client:
        yield client


async def make_calls(http: httpx.AsyncClient) -> None:
    """Allowed, denied (by rule fs-no-traversal) and refused calls by three principals, over HTTP."""
    calls = [
        ("read_file", {"path": "a.txt"}, READER),
        ("read_file", {"path": "../etc/passwd"}, READER),
        ("list_directory", {}, READER),
        ("write_file", {"path": "b.txt", "content": "B"}, OPERATOR),
        ("read_file", {"path": "../x"}, OPERATOR),
        ("search", {"query": "ledger"}, ADMIN),
        ("write_file", {"path": "c.txt", "content": "C"}, READER),
    ]
    for tool, arguments, headers in calls:
        response = await http.post(f"/v1/tools/{tool}:call", json={"arguments": arguments}, headers=headers)
        assert response.status_code in (200, 403, 404), response.text


async def bulk_append(gw: Any, count: int, *, same_times: int = 0) -> None:
    """Records written straight through the gateway's ledger writer (many, fast). Their times
    increase with seq, or with `same_times`, cycle through that many instants (query order is time, then seq)."""
    for i in range(count):
        tick = i % same_times if same_times else i
        await gw.ledger.append({"time": f"2026-11-23T10:{tick // 60:02d}:{tick % 60:02d}.000000Z", "request_id": f"bulk-{i}",
                                "principal": "bulk", "tool": "read_file", "decision": "allow", "status": "ok", "matched_rules": []})


async def get_page(http: httpx.AsyncClient, headers: dict[str, str] = AUDITOR, **params: Any) -> dict[str, Any]:
    response = await http.get("/v1/audit/records", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def cli_query(ledger: Location, state_root: Path, *flags: str) -> list[dict[str, Any]]:
    """`dharma audit query --format jsonl FLAGS` as a real process, its lines decoded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHARMA_")}
    env.update(DHARMA_STATE_ROOT=str(state_root), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "gateway", "audit", "query", "--ledger", str(ledger), "--format", "jsonl", *flags],
                          capture_output=True, text=True, timeout=60, env=env, cwd=state_root.parent)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_filters_match_the_cli_for_the_same_filter(http: httpx.AsyncClient, gw: Any, state_root: Path) -> None:
    await make_calls(http)
    cases: list[dict[str, str]] = [
        {},
        {"principal": "reader"},
        {"decision": "deny"},
        {"rule": "fs-no-traversal"},
        {"tool": "read_*"},
        {"status": "blocked"},
        {"error_code": "tool_not_found"},
        {"show": "records"},
        {"show": "records", "principal": "operator", "tool": "write_file"},
    ]
    for params in cases:
        flags = [f for name, value in params.items() if name != "show" for f in (f"--{name.replace('_', '-')}", value)]
        if params.get("show") == "records":
            flags.append("--all-records")
        expected = cli_query(where(gw), state_root, *flags)
        page = await get_page(http, **params, limit=1000)
        assert page["records"] == expected, params
        assert page["next_cursor"] is None
    denied = (await get_page(http, decision="deny"))["records"]
    assert [r["request_id"] for r in denied] and {r["decision"] for r in denied} == {"deny"}
    assert {tuple(r["matched_rules"]) for r in (await get_page(http, rule="fs-no-traversal"))["records"]} == {("fs-no-traversal",)}


async def test_pagination_walks_every_record_exactly_once(http: httpx.AsyncClient, gw: Any, state_root: Path) -> None:
    await make_calls(http)
    await bulk_append(gw, 25, same_times=3)  # many records share a time, out of seq order: the cursor must cope
    everything = (await get_page(http, show="records", limit=1000))["records"]
    assert everything == cli_query(where(gw), state_root, "--all-records")
    assert sorted(r["seq"] for r in everything) == list(range(1, gw.ledger.size + 1))
    for limit in (1, 4, 7):
        walked: list[dict[str, Any]] = []
        cursor = None
        pages = 0
        while True:
            page = await get_page(http, show="records", limit=limit, **({"cursor": cursor} if cursor is not None else {}))
            pages += 1
            assert 0 < len(page["records"]) <= limit
            walked += page["records"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert cursor == page["records"][-1]["seq"]
        assert walked == everything and pages == -(-len(everything) // limit)
    filtered: list[str] = []
    cursor = None
    while True:
        page = await get_page(http, principal="bulk", limit=10, **({"cursor": cursor} if cursor else {}))
        filtered += [r["request_id"] for r in page["records"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert sorted(filtered) == sorted(f"bulk-{i}" for i in range(25)) and len(filtered) == 25
    unknown = await http.get("/v1/audit/records", params={"cursor": gw.ledger.size + 1}, headers=AUDITOR)
    assert unknown.status_code == 400 and "`cursor`" in unknown.json()["message"]


async def test_a_ledger_larger_than_a_page_streams_in_chunks(gw: Any) -> None:
    """Over a real socket (uvicorn on the test's event loop): the page arrives in many chunks."""
    from gateway.transports.http_api.app import build_app
    from gateway.transports.http_api.audit import CHUNK, MAX_PAGE_SIZE

    await bulk_append(gw, MAX_PAGE_SIZE + 10)
    server = uvicorn.Server(uvicorn.Config(build_app(gw), host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        with anyio.fail_after(20):
            while not server.started:  # uvicorn offers a flag only
                await anyio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        chunks: list[bytes] = []
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            params = {"show": "records", "limit": MAX_PAGE_SIZE}
            async with client.stream("GET", "/v1/audit/records", params=params, headers=AUDITOR) as response:
                assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
                assert response.headers.get("transfer-encoding") == "chunked" and "content-length" not in response.headers
                async for chunk in response.aiter_raw():
                    chunks.append(chunk)
            page = json.loads(b"".join(chunks))
            assert len(chunks) > MAX_PAGE_SIZE // CHUNK  # written a chunk of records at a time, not built whole
            assert [r["seq"] for r in page["records"]] == list(range(1, MAX_PAGE_SIZE + 1))
            assert page["next_cursor"] == MAX_PAGE_SIZE
            rest = (await client.get("/v1/audit/records", params={**params, "cursor": MAX_PAGE_SIZE}, headers=AUDITOR)).json()
        assert [r["seq"] for r in rest["records"]] == list(range(MAX_PAGE_SIZE + 1, gw.ledger.size + 1))
        assert rest["next_cursor"] is None
    finally:
        server.should_exit = True
        await serving


async def test_a_page_of_a_large_ledger_holds_a_bounded_number_of_records_in_memory(http: httpx.AsyncClient, gw: Any) -> None:
    """40 MB of records (2,000 of 20 kB): a page of 5, with and without a filter, allocates a small
    fraction of that. Reading every match before paging (a `fetchall`) would allocate all of it."""
    padding = "x" * 20_000
    await asyncio.gather(*(gw.ledger.append({
        "time": f"2026-11-23T10:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}Z", "request_id": f"big-{i}", "principal": "bulk",
        "tool": "write_file", "decision": "allow", "status": "ok", "matched_rules": [], "args": {"content": padding},
    }) for i in range(2000)))
    tracemalloc.start()
    try:
        page = await get_page(http, show="records", limit=5)
        filtered = await get_page(http, principal="bulk", tool="write_*", limit=5, cursor=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r["request_id"] for r in page["records"]] == [f"big-{i}" for i in range(5)] and page["next_cursor"] == 5
    assert [r["request_id"] for r in filtered["records"]] == [f"big-{i}" for i in range(5, 10)]
    assert peak < 12 * 2**20, f"a page of 5 records allocated {peak / 2**20:.1f} MB"


async def test_a_record_inclusion_proof_verifies_against_the_published_checkpoint_key(http: httpx.AsyncClient, gw: Any) -> None:
    await make_calls(http)
    jwks = (await http.get("/.well-known/jwks.json")).json()
    size = gw.ledger.size
    for seq in (1, 3, size):
        response = await http.get(f"/v1/audit/records/{seq}", headers=AUDITOR)
        assert response.status_code == 200, response.text
        doc = response.json()
        body = base64.b64decode(doc["record"])
        leaf = merkle.leaf_hash(body)
        assert doc["seq"] == seq and doc["hash"] == leaf.hex() and doc["entry"]["seq"] == seq
        proof = doc["inclusion"]
        checkpoint = verify_checkpoint_jwks(proof["checkpoint"], jwks)
        assert checkpoint.size == proof["tree_size"] >= seq
        assert merkle.verify_inclusion(seq - 1, checkpoint.size, leaf, [bytes.fromhex(p) for p in proof["proof"]], checkpoint.root)
        assert not merkle.verify_inclusion(seq - 1, checkpoint.size, merkle.leaf_hash(body + b" "),
                                           [bytes.fromhex(p) for p in proof["proof"]], checkpoint.root)
    missing = await http.get(f"/v1/audit/records/{size + 5}", headers=AUDITOR)
    assert missing.status_code == 404 and missing.json()["error_code"] == "invalid_params" and str(size + 5) in missing.json()["message"]


async def test_the_checkpoint_is_signed_afresh_when_the_tree_grew(http: httpx.AsyncClient, gw: Any) -> None:
    await make_calls(http)
    jwks = (await http.get("/.well-known/jwks.json")).json()
    first = await http.get("/v1/audit/checkpoint", headers=AUDITOR)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/plain")
    assert verify_checkpoint_jwks(first.text, jwks).size == gw.ledger.size
    await bulk_append(gw, 3)
    grown = verify_checkpoint_jwks((await http.get("/v1/audit/checkpoint", headers=AUDITOR)).text, jwks)
    assert grown.size == gw.ledger.size and grown.root == gw.ledger.root()


async def test_a_consistency_proof_verifies_with_both_checkpoints(http: httpx.AsyncClient, gw: Any) -> None:
    await make_calls(http)
    old = gw.ledger.size
    jwks = (await http.get("/.well-known/jwks.json")).json()
    old_note = (await http.get("/v1/audit/checkpoint", headers=AUDITOR)).text
    await bulk_append(gw, 9)
    new = gw.ledger.size
    response = await http.get("/v1/audit/consistency", params={"from": old, "to": new}, headers=AUDITOR)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["old_checkpoint"] == old_note  # the checkpoint the auditor already holds, as stored
    old_cp, new_cp = verify_checkpoint_jwks(doc["old_checkpoint"], jwks), verify_checkpoint_jwks(doc["checkpoint"], jwks)
    assert (old_cp.size, new_cp.size) == (old, new)
    proof = [bytes.fromhex(p) for p in doc["proof"]]
    assert merkle.verify_consistency(old, new, old_cp.root, new_cp.root, proof)
    assert not merkle.verify_consistency(old, new, merkle.leaf_hash(b"other"), new_cp.root, proof)
    backwards = await http.get("/v1/audit/consistency", params={"from": new, "to": old}, headers=AUDITOR)
    assert backwards.status_code == 400 and "`from`" in backwards.json()["message"]


@pytest.mark.parametrize("path", ["/v1/audit/records", "/v1/audit/records/1", "/v1/audit/checkpoint",
                                  "/v1/audit/consistency?from=0&to=1"])
async def test_only_auditors_and_admins_may_read_the_ledger(http: httpx.AsyncClient, path: str) -> None:
    await make_calls(http)
    for headers in (OPERATOR, READER):
        refused = await http.get(path, headers=headers)
        assert refused.status_code == 403, refused.text
        body = refused.json()
        assert body["error_code"] == "forbidden" and body["status"] == "error" and "auditor" in body["message"]
    assert (await http.get(path)).status_code == 401
    assert (await http.get(path, headers={"authorization": "Bearer nobody"})).status_code == 401
    for headers in (AUDITOR, ADMIN):
        assert (await http.get(path, headers=headers)).status_code == 200


@pytest.mark.parametrize(("params", "named"), [
    ({"decision": "maybe"}, "decision"),
    ({"status": "fine"}, "status"),
    ({"error_code": "oops"}, "error_code"),
    ({"since": "last tuesday"}, "since"),
    ({"until": "2026-13-45"}, "until"),
    ({"limit": "0"}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"limit": "100000"}, "limit"),
    ({"cursor": "-1"}, "cursor"),
    ({"show": "everything"}, "show"),
    ({"principle": "reader"}, "principle"),
])
async def test_a_bad_filter_is_a_400_naming_the_parameter(http: httpx.AsyncClient, params: dict[str, str], named: str) -> None:
    response = await http.get("/v1/audit/records", params=params, headers=AUDITOR)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error_code"] == "invalid_params" and f"`{named}`" in body["message"], body["message"]


async def test_a_repeated_parameter_is_a_400(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/audit/records?principal=a&principal=b", headers=AUDITOR)
    assert response.status_code == 400 and "`principal`" in response.json()["message"]
    bad = await http.get("/v1/audit/consistency", params={"from": "x", "to": "1"}, headers=AUDITOR)
    assert bad.status_code == 400 and "`from`" in bad.json()["message"]


async def test_a_tampered_record_gets_a_500_naming_it_not_a_proof(http: httpx.AsyncClient, gw: Any) -> None:
    await make_calls(http)
    conn = attacker(where(gw))
    try:
        (body,) = conn.execute("SELECT body FROM records WHERE seq = 2").fetchone()
        conn.execute("UPDATE records SET body = ? WHERE seq = 2", (bytes(body).replace(b'"principal":"reader"', b'"principal":"admin"', 1),))
    finally:
        conn.close()
    response = await http.get("/v1/audit/records/2", headers=AUDITOR)
    assert response.status_code == 500, response.text
    body_ = response.json()
    assert body_["error_code"] == "internal_error" and "record 2" in body_["message"] and "inclusion" not in body_
    assert (await http.get("/v1/audit/records/3", headers=AUDITOR)).status_code == 200  # the others still prove
