"""Refusals by the HTTP auth layer on the karma ledger (gateway/core/refusals.py), against a real
`dharma serve` process: real sockets, the official MCP SDK client and httpx, a stdio MCP upstream,
the SQLite ledger file under the state root (and a PostgreSQL ledger, where the interval ends).

Each client comes from an address of its own on the loopback network (127.0.0.N), so each kind of
refusal is its own (source, reason) key and its first record is written at once. A flood from one
address stays two records whose counts sum to the flood; keys past `auth.refusals.max_keys` fold
into one overflow key; counts are written when the interval ends and when the server stops; a
ledger that cannot be written leaves the refusals answered, logged and counted. `dharma audit
verify` passes on every ledger, and `/metrics` counts every refusal by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from audit.query import query_records
from audit.sqlite import SqliteLedgerReader
from audit.verify import verify_ledger
from tests.audit.conftest import BACKENDS, Location, new_location, open_reader
from gateway.core.refusals import OVERFLOW, RefusalTable
from tests.conftest import REPO
from tests.helpers import all_logs
from tests.mcp_http.conftest import KEYS, free_port, serve_gateway, write_profile
from tests.test_cli import cli_env, dharma
from tests.test_http_auth import DEFAULT_JWKS, ISSUER, RESOURCE, claims, token

PY_SERVER = REPO / "tests" / "mcp" / "servers" / "py_server.py"
ADMIN = {"x-api-key": KEYS["admin"]}
GUESSED_KEY = "guessed-key-0123456789"
DEADLINE = 60.0
"""Seconds a test waits for a condition before it fails (the CI machine is slow and shared)."""


def tools_call(tool: str = "delete_file", request_id: int = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": {"name": tool, "arguments": {"path": "notes.txt"}}}).encode()


MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-06-18"}


class Served:
    """A running `dharma serve`: its base URL, state root and process."""

    def __init__(self, base: str, state_root: Path, process: subprocess.Popen[bytes], log: Path, ledger: Location) -> None:
        self.base, self.state_root, self.process, self.log, self.ledger = base, state_root, process, log, ledger

    def refusals(self) -> list[dict[str, Any]]:
        with open_reader(self.ledger) as reader:
            return list(query_records(reader, kind="refusal"))

    def stop(self) -> None:
        """SIGTERM, as an operator stops it: the counts it holds are written before the ledger closes."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=DEADLINE)
        err = self.log.read_text(encoding="utf-8", errors="replace")
        assert self.process.returncode in (0, -signal.SIGTERM), err[-3000:]  # uvicorn re-raises the signal once shut down
        assert '"event": "ledger.closed"' in err and "Traceback" not in err, err[-3000:]
        assert "Traceback" not in err, err[-3000:]


@contextlib.contextmanager
def dharma_serve(tmp: Path, ledger_url: str | None = None, **refusals: Any) -> Iterator[Served]:
    """`dharma serve` with a stdio MCP upstream, API keys and JWTs (the test issuer's JWKS), and
    `auth.refusals` set to `refusals`, its ledger the state root's SQLite file or `ledger_url`;
    stopped with SIGTERM when the block ends (if still running)."""
    state_root = tmp / "state"
    state_root.mkdir(parents=True)
    (tmp / "jwks.json").write_text(json.dumps(DEFAULT_JWKS), encoding="utf-8")
    port = free_port()
    config = tmp / "dharma.yaml"
    config.write_text(yaml.safe_dump({
        "policy": str(write_profile(tmp / "policy")),
        "server": {"host": "127.0.0.1", "port": port},
        "upstreams": [{"id": "py", "type": "mcp_stdio", "command": sys.executable, "args": [str(PY_SERVER)]}],
        "auth": {"resource_url": RESOURCE, "jwt": {"jwks": str(tmp / "jwks.json"), "issuer": ISSUER}, "refusals": refusals},
        **({"ledger": {"url": ledger_url}} if ledger_url else {}),
    }), encoding="utf-8")
    log = tmp / "serve.log"  # a file, not a pipe: a flood's log lines would fill a pipe nobody reads and stall the server
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config), "serve"],
                                   env=cli_env(state_root), stdout=out, stderr=subprocess.STDOUT)
    served = Served(f"http://127.0.0.1:{port}", state_root, process, log, ledger_url or state_root / "ledger.db")
    try:
        deadline = time.monotonic() + DEADLINE
        while not _healthy(served.base):
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "dharma serve did not start"
            time.sleep(0.05)
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def from_address(base: str, address: str, **kwargs: Any) -> httpx.AsyncClient:
    """An httpx client whose connections come from `address` (any 127.0.0.0/8 address reaches the loopback server)."""
    return httpx.AsyncClient(base_url=base, transport=httpx.AsyncHTTPTransport(local_address=address), timeout=30, **kwargs)


def sdk_client(url: str, key: str | None, address: str) -> Any:
    """The official MCP SDK client over Streamable HTTP, its connections from `address`."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"X-API-Key": key} if key else {}, timeout=httpx2.Timeout(30.0, read=60.0),
                              transport=httpx2.AsyncHTTPTransport(local_address=address))
    return Client(streamable_http_client(url, http_client=http), mode="legacy")


async def wait_for(condition: Callable[[], Any], what: str, served: Served | None = None) -> Any:
    """Poll `condition` until it returns something true; fail naming `what` after `DEADLINE`."""
    deadline = time.monotonic() + DEADLINE
    while not (found := condition()):
        if served is not None:
            assert served.process.poll() is None, served.log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return found


def first_record(served: Served, source: str) -> Callable[[], dict[str, Any] | None]:
    return lambda: next((r for r in served.refusals() if r["source"] == source), None)


async def metrics(base: str) -> dict[str, float]:
    """`/metrics` as {sample name with labels: value}."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        scraped = await http.get("/metrics", headers=ADMIN)
    assert scraped.status_code == 200, scraped.text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in scraped.text.splitlines() if line and line[0] != "#"}


def refused_by_reason(samples: dict[str, float]) -> dict[str, int]:
    found = (re.fullmatch(r'dharma_auth_refusals_total\{reason="([a-z_]+)"\}', name) for name in samples)
    return {m.group(1): int(samples[m.group(0)]) for m in found if m}


def counted_by_reason(records: list[dict[str, Any]]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for record in records:
        for reason, n in (record.get("reasons") or {record["reason"]: record["count"]}).items():
            counts[reason] += n
    return dict(counts)


def assert_verifies(served: Served) -> None:
    verified = dharma("audit", "verify", "--ledger", served.ledger, state_root=served.state_root, timeout=120)
    assert verified.rc == 0 and verified.out.startswith("OK"), verified.out + verified.err


# ---- every kind of refusal ---------------------------------------------------------------------


def cases() -> list[tuple[str, dict[str, str], str, int, str]]:
    """(address, headers, reason, HTTP status, credential kind): a tools/call of delete_file on /mcp.
    Built when the test runs: its tokens expire five minutes after they are made, and a full suite
    collects this module long before it runs the test."""
    return [
        ("127.0.0.11", {}, "no_credential", 401, "none"),
        ("127.0.0.12", {"x-api-key": GUESSED_KEY}, "unknown_key", 401, "api_key"),
        ("127.0.0.13", {"x-api-key": KEYS["alice"], "origin": "https://evil.example"}, "foreign_origin", 403, "api_key"),
        ("127.0.0.14", {"authorization": f"Bearer {KEYS['alice']}", "x-api-key": KEYS["admin"]}, "credential_conflict", 400, "several"),
        ("127.0.0.15", {"authorization": f"Bearer {token(claims(iss='https://evil.example', sub='admin'))}"}, "invalid_token", 401, "jwt"),
        ("127.0.0.16", {"authorization": f"Bearer {token(claims(sub='mallory'))}"}, "unknown_principal", 403, "jwt"),
    ]


async def test_each_refusal_is_on_the_record_at_once_and_counts_match_metrics(tmp_path: Path) -> None:
    with dharma_serve(tmp_path, interval_seconds=3600) as served:
        async with sdk_client(served.base + "/mcp", KEYS["alice"], "127.0.0.10") as c:  # a caller with a key is served
            assert not (await c.call_tool("echo", {"text": "hi"})).is_error
        body = tools_call()
        for address, headers, reason, status, credential in cases():
            async with from_address(served.base, address) as http:
                answer = await http.post("/mcp", content=body, headers={**MCP_HEADERS, **headers})
            assert answer.status_code == status, (reason, answer.text)
            record = await wait_for(first_record(served, address), f"the record of {reason}", served)  # at once, not at the interval's end
            assert (record["reason"], record["count"], record["http_status"], record["credential"]) == (reason, 1, status, credential)
            assert (record["request"], record["method"], record["tool"]) == ("POST /mcp", "tools/call", "delete_file")
            assert record["body_sha256"] == hashlib.sha256(body).hexdigest() and record["body_bytes"] == len(body)
            assert record["principal"] is None and record["decision"] == "deny" and record["status"] == "blocked"
            assert record["error_code"] == {401: "unauthenticated", 403: "forbidden", 400: "invalid_params"}[status]
            text = json.dumps(record)
            for secret in (GUESSED_KEY, KEYS["alice"], KEYS["admin"], *(v[7:] for v in [headers.get("authorization")] if v)):
                assert secret not in text and hashlib.sha256(secret.encode()).hexdigest() not in text
        jwts = {r["reason"]: r["token"] for r in served.refusals() if r["credential"] == "jwt"}
        assert jwts == {"invalid_token": {"iss": "https://evil.example", "sub": "admin", "verified": False},
                        "unknown_principal": {"iss": ISSUER, "sub": "mallory", "verified": True}}

        tool_api = tools_call()  # any body: the tool API's tool is in its path
        async with from_address(served.base, "127.0.0.17") as http:
            assert (await http.post("/v1/tools/read_file:call", content=tool_api)).status_code == 401
        record = await wait_for(first_record(served, "127.0.0.17"), "the tool API's refusal", served)
        assert (record["reason"], record["method"], record["tool"], record["request"]) == (
            "no_credential", "http/tools.call", "read_file", "POST /v1/tools/read_file:call")
        assert record["body_sha256"] == hashlib.sha256(tool_api).hexdigest()

        for address, key, reason in (("127.0.0.18", None, "no_credential"), ("127.0.0.19", GUESSED_KEY, "unknown_key")):
            with pytest.raises(Exception):  # the SDK client is refused at its first request, `initialize`
                async with sdk_client(served.base + "/mcp", key, address) as c:
                    await c.call_tool("echo", {"text": "hi"})
            record = await wait_for(first_record(served, address), f"the SDK client's {reason}", served)
            assert (record["reason"], record["method"], record["tool"], record["credential"]) == (
                reason, "initialize", None, "api_key" if key else "none")

        async with from_address(served.base, "127.0.0.20", follow_redirects=False) as http:  # a wrong key typed into /ui
            form = await http.get("/ui/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf is not None
            login = await http.post("/ui/login", data={"csrf": csrf.group(1), "token": GUESSED_KEY}, headers={"origin": served.base})
            assert login.status_code == 401
        record = await wait_for(first_record(served, "127.0.0.20"), "the /ui login's refusal", served)
        assert (record["reason"], record["request"], record["body_sha256"], record["credential"]) == (
            "unknown_key", "POST /ui/login", None, "api_key")  # the form holds the key: its body is never digested

        async with from_address(served.base, "127.0.0.11") as http:  # the same key again: counted, written at the end
            for _ in range(3):
                assert (await http.post("/mcp", content=body, headers=MCP_HEADERS)).status_code == 401

        async with httpx.AsyncClient(base_url=served.base, timeout=30) as http:  # the auditor's views take them
            listed = await http.get("/v1/audit/records", params={"kind": "refusal"}, headers=ADMIN)
            assert listed.status_code == 200 and {r["source"] for r in listed.json()["records"]} >= {a for a, *_ in cases()}
            form = await http.get("/ui/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf is not None
            await http.post("/ui/login", data={"csrf": csrf.group(1), "token": KEYS["admin"]}, headers={"origin": served.base})
            page = await http.get("/ui/ledger", params={"error_code": "unauthenticated"})
            assert page.status_code == 200 and "refusal no_credential ×1 from 127.0.0.11" in page.text, page.text[-3000:]
            seq = first_record(served, "127.0.0.15")()["seq"]  # type: ignore[index]
            shown = await http.get(f"/ui/ledger/{seq}")
            assert shown.status_code == 200 and "Inclusion proof verified" in shown.text and "invalid_token" in shown.text

        counted = refused_by_reason(await metrics(served.base))
        served.stop()

    records = served.refusals()
    assert counted_by_reason(records) == counted  # every refusal: in /metrics, and in the ledger's counts once flushed
    assert counted["no_credential"] >= 6 and counted["unknown_key"] >= 3  # (the SDK clients' requests, however many)
    again = [r for r in records if r["source"] == "127.0.0.11"]
    assert [r["count"] for r in again] == [1, 3] and again[1]["time"] <= again[1]["until"]
    assert_verifies(served)
    found = dharma("audit", "query", "--ledger", served.ledger, "--kind", "refusal", "--tool", "delete_file", "--format", "jsonl",
                   state_root=served.state_root)
    assert found.rc == 0 and {json.loads(line)["source"] for line in found.out.splitlines()} == {a for a, *_ in cases()}


# ---- a flood, and many sources -------------------------------------------------------------------


async def refuse(base: str, address: str, times: int, *, concurrency: int = 1) -> None:
    """`times` tools/call requests without a credential from `address`, each answered 401."""
    async with from_address(base, address, limits=httpx.Limits(max_connections=concurrency)) as http:
        async def one(i: int) -> None:
            answer = await http.post("/mcp", content=tools_call(request_id=i), headers=MCP_HEADERS)
            assert answer.status_code == 401

        for start in range(0, times, concurrency):
            await asyncio.gather(*(one(i) for i in range(start, min(times, start + concurrency))))


async def test_a_flood_is_two_records_and_keys_past_the_bound_fold_into_one(tmp_path: Path) -> None:
    with dharma_serve(tmp_path, interval_seconds=3600, max_keys=3) as served:
        await refuse(served.base, "127.0.0.30", 1000, concurrency=20)
        first = await wait_for(first_record(served, "127.0.0.30"), "the flood's first record", served)
        assert first["count"] == 1
        for n in range(41, 46):  # 127.0.0.41 and .42 take the last two keys; .43, .44, .45 fold into the overflow key
            await refuse(served.base, f"127.0.0.{n}", 2)
        samples = await metrics(served.base)
        assert samples['dharma_auth_refusals_total{reason="no_credential"}'] == 1010
        assert samples["dharma_auth_refusals_folded_total"] == 6
        served.stop()

    records = served.refusals()
    by_source: dict[str, list[int]] = {}
    for record in records:
        by_source.setdefault(record["source"], []).append(record["count"])
    assert by_source == {"127.0.0.30": [1, 999], "127.0.0.41": [1, 1], "127.0.0.42": [1, 1], OVERFLOW[0]: [1, 5]}
    overflow = [r for r in records if r["source"] == OVERFLOW[0]]
    assert [r["reason"] for r in overflow] == [OVERFLOW[1]] * 2
    assert [r["reasons"] for r in overflow] == [{"no_credential": 1}, {"no_credential": 5}]
    assert sum(r["count"] for r in records) == 1010
    assert_verifies(served)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_counts_are_written_when_the_interval_ends(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = str(new_location(backend, request, tmp_path)) if backend == "postgres" else None  # the store replicas share
    with dharma_serve(tmp_path, url, interval_seconds=1) as served:
        await refuse(served.base, "127.0.0.50", 5)

        def written() -> int:
            return sum(r["count"] for r in served.refusals() if r["source"] == "127.0.0.50")

        await wait_for(lambda: written() == 5, "the interval's counts, with the server still running", served)
        await refuse(served.base, "127.0.0.50", 1)  # a later interval: the key starts over, on the record at once
        await wait_for(lambda: written() == 6, "the next interval's first record", served)
        served.stop()
    assert_verifies(served)


# ---- a ledger that cannot be written ------------------------------------------------------------


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    import gateway.core.refusals

    with all_logs(monkeypatch, gateway.core.refusals) as captured:
        yield captured


async def test_a_ledger_that_cannot_be_written_leaves_refusals_answered_logged_and_counted(
    tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    async with serve_gateway(tmp_path, []) as gw:  # `dharma serve`'s app under uvicorn: the ledger is at hand
        gw.gateway.ledger.limit_pages(1)  # the file may not grow: the disk is "full"
        for n in range(1, 41):  # forty sources: forty records due at once, more than the last page holds
            async with from_address(gw.base, f"127.0.1.{n}") as http:
                assert (await http.post("/v1/tools/read_file:call", json={"arguments": {}})).status_code == 401
        await wait_for(lambda: gw.gateway.metrics.auth_refusals_unrecorded > 0 and gw.gateway.refusals.settled(),
                       "a refusal record that could not be written, and the writer done with the rest")
        lost = [e for e in logs if e["event"] == "auth.refusal_not_recorded"]
        assert lost and all(e["log_level"] == "error" and "database or disk is full" in e["error"] for e in lost), lost
        assert gw.gateway.metrics.auth_refusals_unrecorded == sum(e["count"] for e in lost)
        async with httpx.AsyncClient(base_url=gw.base, timeout=30) as http:
            scraped = (await http.get("/metrics", headers=ADMIN)).text
        assert f"dharma_auth_refusals_unrecorded_total {gw.gateway.metrics.auth_refusals_unrecorded}" in scraped

        gw.gateway.ledger.limit_pages(None)  # space again: the next refusal is on the record
        async with from_address(gw.base, "127.0.2.1") as http:
            assert (await http.post("/v1/tools/read_file:call", json={"arguments": {}})).status_code == 401
        path = gw.gateway.ledger.path

        def recorded() -> bool:
            with SqliteLedgerReader(path) as reader:
                return any(r["source"] == "127.0.2.1" for r in query_records(reader, kind="refusal"))

        await wait_for(recorded, "the refusal after space came back")
    with SqliteLedgerReader(path) as reader:
        assert verify_ledger(reader).ok


async def test_a_deferred_path_is_counted_and_left_to_its_endpoint_to_record(tmp_path: Path) -> None:
    """`auth.defer` (opt-in): the tool API records each unauthenticated call itself, one record per
    request as before; the guard records no aggregate beside it, and /metrics still counts it."""
    async with serve_gateway(tmp_path, [], config={"auth": {"defer": ["/v1/"]}}) as gw:
        async with httpx.AsyncClient(base_url=gw.base, timeout=30) as http:
            for _ in range(2):
                answer = await http.post("/v1/tools/read_file:call", json={"arguments": {}})
                assert answer.status_code == 401 and answer.json()["receipt"]  # the endpoint's envelope, signed
        assert gw.gateway.metrics.auth_refusals == {"no_credential": 2}
        with SqliteLedgerReader(gw.gateway.ledger.path) as reader:
            records = list(query_records(reader))
        assert [(r.get("kind"), r["error_code"], r["tool"]) for r in records] == [(None, "unauthenticated", "read_file")] * 2


# ---- the table itself ----------------------------------------------------------------------------


def test_the_table_takes_a_first_then_counts_the_rest_and_folds_past_its_bound() -> None:
    table = RefusalTable(max_keys=2)
    first, folded = table.note("a", "no_credential", 1.0)
    assert first is not None and first.prompt and not folded
    rest, _ = table.note("a", "no_credential", 2.0)
    assert rest is not None and not rest.prompt
    assert table.note("a", "no_credential", 3.0) == (None, False) and rest.count == 2 and rest.last == 3.0
    assert table.note("b", "unknown_key", 4.0)[0] is not None
    spilled, folded = table.note("c", "no_credential", 5.0)
    assert folded and spilled is not None and spilled.key == OVERFLOW and spilled.reasons == {"no_credential": 1}
    assert table.note("d", "unknown_key", 6.0)[1] and table.note("e", "unknown_key", 7.0) == (None, True)
    assert len(table.slots) == 3  # the bound, and the overflow key
    rests = table.roll()
    assert [(s.key, s.count, s.reasons) for s in rests] == [(("a", "no_credential"), 2, None), (OVERFLOW, 2, {"unknown_key": 2})]
    assert not table.slots and table.note("a", "no_credential", 8.0)[0].prompt  # type: ignore[union-attr]

