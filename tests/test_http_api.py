"""The HTTP tool API end to end: the real Starlette app over a real Gateway (SQLite ledger, real
keys, demo and test backends), through httpx's ASGI transport; one real HTTP upstream."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from audit.canon import digest
from audit.sqlite import SqliteLedgerReader
from tests.conftest import KEYS, REPO, OpenGateway, write_policy
from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend
from gateway.crypto.receipts import ReceiptInvalid, jwk_thumbprint, verify_receipt

ENVELOPE_KEYS = {
    "status", "tool", "request_id", "idempotency_key", "message", "error_code", "retryable", "retry_after",
    "approval_id", "result", "warnings", "timestamp", "envelope_version", "receipt",
}
OPERATOR = {"authorization": f"Bearer {KEYS['operator']}"}
ADMIN = {"authorization": f"Bearer {KEYS['admin']}"}
READER = {"x-api-key": KEYS["reader"]}


# ---- helpers -------------------------------------------------------------------------------


def client_for(gw: Any, *, max_body_bytes: int = 65_536) -> httpx.AsyncClient:
    from gateway.transports.http_api.app import build_app

    app = build_app(gw, max_body_bytes=max_body_bytes)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test")


@pytest.fixture
async def http(demo_gateway: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(demo_gateway) as client:
        yield client


async def call(
    client: httpx.AsyncClient,
    tool: str,
    arguments: Any = None,
    *,
    headers: dict[str, str] | None = OPERATOR,
    content: bytes | None = None,
    **fields: Any,
) -> tuple[int, dict[str, Any]]:
    if content is None:
        body = dict(fields)
        if arguments is not None:
            body["arguments"] = arguments
        content = json.dumps(body).encode()
    response = await client.post(f"/v1/tools/{tool}:call", content=content, headers=headers or {})
    return response.status_code, response.json()


def records(gw: Any) -> list[dict[str, Any]]:
    with SqliteLedgerReader(gw.ledger.path) as reader:
        return [reader.get(seq).to_dict() for seq in range(1, reader.size() + 1)]  # type: ignore[union-attr]


def ledger_size(gw: Any) -> int:
    with SqliteLedgerReader(gw.ledger.path) as reader:
        return reader.size()


def record_for(gw: Any, request_id: str) -> dict[str, Any]:
    """The record a call's answer is bound to: its one record, or its outcome record linked to its decision record."""
    found = [r for r in records(gw) if r["request_id"] == request_id]
    final = [r for r in found if r.get("kind") != "decision"]
    decided = [r for r in found if r.get("kind") == "decision"]
    assert len(final) == 1 and len(decided) <= 1, found
    if decided:
        assert final[0]["kind"] == "outcome" and final[0]["decision_seq"] == decided[0]["seq"] < final[0]["seq"], found
    else:
        assert "kind" not in final[0], found
    return final[0]


def without(envelope: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if k not in keys}


class Probe:
    """A callable backend that counts calls and can be told to fail or hang."""

    def __init__(self, backend_id: str = "probe") -> None:
        self.calls = 0
        self.mode = "ok"
        spec = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}
        self.backend = CallableBackend(backend_id, {"probe_tool": (self.run, ToolSpec("probe_tool", "counts", spec))})

    async def run(self, n: int = 0) -> dict[str, Any]:
        self.calls += 1
        if self.mode == "fail":
            raise RuntimeError("probe exploded")
        if self.mode == "hang":
            await anyio.sleep(10)
        return {"content": [{"type": "text", "text": f"call {self.calls} n={n}"}]}


@pytest.fixture
def probe(demo_gateway: Any) -> Probe:
    p = Probe()
    demo_gateway.add_backend(p.backend)
    return p


# ---- allowed calls, envelope, receipt, ledger ----------------------------------------------


async def test_allowed_call_envelope_receipt_and_ledger(demo_gateway: Any, http: httpx.AsyncClient, sandbox: Path) -> None:
    (sandbox / "hello.txt").write_text("hello from the sandbox", encoding="utf-8")
    status, env = await call(http, "read_file", {"path": "hello.txt"})
    assert status == 200
    assert set(env) == ENVELOPE_KEYS
    assert env["status"] == "ok" and env["error_code"] is None and env["tool"] == "read_file"
    assert env["result"] == {"content": [{"type": "text", "text": "hello from the sandbox"}]}
    assert env["envelope_version"] == "1" and env["request_id"].startswith("req_")

    jwks = (await http.get("/.well-known/jwks.json")).json()
    body = without(env, "receipt")
    request = {"tool": "read_file", "body": {"arguments": {"path": "hello.txt"}}}  # the request as the gateway saw it
    payload = verify_receipt(env["receipt"], jwks, response=body, request=request)
    assert payload["request_id"] == env["request_id"]
    assert "decision" not in payload
    with pytest.raises(ReceiptInvalid, match="digest mismatch"):
        verify_receipt(env["receipt"], jwks, response={**body, "result": {"content": [{"type": "text", "text": "forged"}]}})
    with pytest.raises(ReceiptInvalid, match="digest mismatch"):
        verify_receipt(env["receipt"], jwks, response={**body, "status": "error"})
    with pytest.raises(ReceiptInvalid, match="digest mismatch for request"):
        verify_receipt(env["receipt"], jwks, response=body, request={"tool": "read_file", "body": {"arguments": {"path": "other.txt"}}})

    with SqliteLedgerReader(demo_gateway.ledger.path) as reader:
        stored = reader.get(payload["ledger"]["seq"])
    assert stored is not None and stored.hash == payload["ledger"]["hash"]
    record = stored.to_dict()
    assert record["request_id"] == env["request_id"]
    assert record["response_digest"] == payload["resp_sha256"] == digest(body)
    assert record["principal"] == "operator" and record["decision"] == "allow" and record["status"] == "ok"


async def test_x_api_key_header_and_list_tools(http: httpx.AsyncClient, sandbox: Path) -> None:
    (sandbox / "a.txt").write_text("A", encoding="utf-8")
    status, env = await call(http, "read_file", {"path": "a.txt"}, headers=READER)
    assert status == 200 and env["result"]["content"][0]["text"] == "A"
    assert (await http.get("/v1/tools")).status_code == 401
    listed = (await http.get("/v1/tools", headers=READER)).json()
    names = {t["name"] for t in listed["tools"]}
    assert "read_file" in names and "write_file" not in names and "health_records" not in names


async def test_denied_by_rule(demo_gateway: Any, http: httpx.AsyncClient) -> None:
    status, env = await call(http, "read_file", {"path": "../secret"})
    assert status == 403
    assert env["status"] == "blocked" and env["error_code"] == "policy_blocked" and env["retryable"] is False
    assert env["message"] == "path leaves the sandbox: ../secret"
    assert env["result"] is None
    record = record_for(demo_gateway, env["request_id"])
    assert record["decision"] == "deny" and record["block_class"] == "safety_content"
    assert record["matched_rules"] == ["fs-no-traversal"]


async def test_hidden_tool_answers_like_unknown_tool(demo_gateway: Any, http: httpx.AsyncClient) -> None:
    hidden_status, hidden = await call(http, "write_file", {"path": "x", "content": "y"}, headers=READER)
    unknown_status, unknown = await call(http, "write_filf", {"path": "x", "content": "y"}, headers=READER)
    assert hidden_status == unknown_status == 404
    assert hidden["error_code"] == "tool_not_found"

    def normalised(env: dict[str, Any]) -> str:
        return json.dumps(without(env, "request_id", "timestamp", "receipt")).replace(env["tool"], "<tool>")

    assert normalised(hidden) == normalised(unknown)
    # and a tool that exists for nobody under this name at all answers exactly like the hidden one
    admin_unknown_status, admin_unknown = await call(http, "write_filf", {"path": "x", "content": "y"}, headers=ADMIN)
    assert admin_unknown_status == 404 and without(admin_unknown, "request_id", "timestamp", "receipt") == without(
        unknown, "request_id", "timestamp", "receipt"
    )
    assert record_for(demo_gateway, hidden["request_id"])["decision"] == "deny"


@pytest.mark.parametrize("name", ["READ_FILE", "read_file ", "re\u0430d_file", "read_file\u200b", "read_*", "read_file:call"])
async def test_lookalike_tool_names_are_unknown(http: httpx.AsyncClient, sandbox: Path, name: str) -> None:
    (sandbox / "a.txt").write_text("A", encoding="utf-8")
    status, env = await call(http, name, {"path": "a.txt"}, headers=ADMIN)
    assert status == 404 and env["error_code"] == "tool_not_found" and env["result"] is None


@pytest.mark.parametrize(
    ("headers", "reason", "credential"),
    [(None, "no_credential", "none"), ({"authorization": "Bearer wrong-key"}, "unknown_key", "api_key"),
     ({"x-api-key": "wrong-key"}, "unknown_key", "api_key"), ({"authorization": "Basic abc"}, "no_credential", "other")],
    ids=["none", "bad-bearer", "bad-x-api-key", "basic"],
)
async def test_unauthenticated(demo_gateway: Any, http: httpx.AsyncClient, headers: dict[str, str] | None, reason: str,
                               credential: str) -> None:
    """Refused by the auth layer (no `defer`), and on the record as a refusal aggregate (gateway.core.refusals)."""
    before = ledger_size(demo_gateway)
    body = json.dumps({"arguments": {"path": "a.txt"}}).encode()
    status, env = await call(http, "read_file", headers=headers, content=body)
    assert status == 401 and env["error_code"] == "unauthenticated"
    with anyio.fail_after(30):
        while ledger_size(demo_gateway) == before:  # the first refusal of its key is written at once, by a task
            await anyio.sleep(0.01)
    [refusal] = records(demo_gateway)[before:]
    assert refusal["kind"] == "refusal" and refusal["principal"] is None and refusal["count"] == 1
    assert (refusal["reason"], refusal["credential"], refusal["tool"], refusal["method"]) == (reason, credential, "read_file", "http/tools.call")
    assert refusal["body_sha256"] == hashlib.sha256(body).hexdigest() and refusal["request"] == "POST /v1/tools/read_file:call"
    assert "wrong-key" not in json.dumps(refusal) and hashlib.sha256(b"wrong-key").hexdigest() not in json.dumps(refusal)


async def test_purpose_required_for_restricted_tool(http: httpx.AsyncClient) -> None:
    clinician = {"authorization": f"Bearer {KEYS['clinician']}"}
    status, env = await call(http, "health_records", {"patient_id": "p-1001"}, headers=clinician)
    assert status == 403 and env["error_code"] == "purpose_required"
    status, env = await call(http, "health_records", {"patient_id": "p-1001"}, headers=clinician, purpose="   ")
    assert status == 403 and env["error_code"] == "purpose_required"
    status, env = await call(http, "health_records", {"patient_id": "p-1001"}, headers=clinician, purpose="treatment")
    assert status == 200 and "Ada Example" in env["result"]["content"][0]["text"]


async def test_rate_limited(open_test_gateway: OpenGateway, tmp_path: Path) -> None:
    limits = [{"id": "tiny", "key": ["principal", "tool"], "tools": ["list_*"], "rate": 1, "per_seconds": 60, "burst": 1}]
    gw = await open_test_gateway(write_policy(tmp_path / "limited", rate_limits=limits))
    async with client_for(gw) as http:
        status, env = await call(http, "list_directory", {})
        assert status == 200, env
        response = await http.post("/v1/tools/list_directory:call", json={"arguments": {}}, headers=OPERATOR)
        status, env = response.status_code, response.json()
        assert status == 429 and env["error_code"] == "rate_limited" and env["retryable"] is True
        assert 0 < env["retry_after"] <= 60
        assert 0 < int(response.headers["retry-after"]) <= 60
        # keyed by principal: another principal still has its token
        status, _ = await call(http, "list_directory", {}, headers=READER)
        assert status == 200
    assert record_for(gw, env["request_id"])["block_class"] == "rate_limit"


async def test_dry_run_does_not_call_the_backend(demo_gateway: Any, http: httpx.AsyncClient, sandbox: Path) -> None:
    status, env = await call(http, "write_file", {"path": "dry.txt", "content": "x"}, dry_run=True)
    assert status == 200 and env["status"] == "dry_run" and env["result"] is None
    assert not (sandbox / "dry.txt").exists()
    assert record_for(demo_gateway, env["request_id"])["dry_run"] is True
    status, env = await call(http, "write_file", {"path": "../dry.txt", "content": "x"}, dry_run=True)
    assert status == 403 and env["error_code"] == "policy_blocked"
    status, env = await call(http, "write_file", {"path": "dry.txt", "content": "x"})
    assert status == 200 and (sandbox / "dry.txt").read_text() == "x"


async def test_idempotency_key_replays_without_calling_backend(http: httpx.AsyncClient, probe: Probe) -> None:
    status, first = await call(http, "probe_tool", {"n": 1}, idempotency_key="k-1")
    assert status == 200 and probe.calls == 1 and first["idempotency_key"] == "k-1"
    status, second = await call(http, "probe_tool", {"n": 1}, idempotency_key="k-1")
    assert status == 200 and probe.calls == 1
    assert second["result"] == first["result"]
    assert any("replayed" in w for w in second["warnings"])
    status, other = await call(http, "probe_tool", {"n": 2}, idempotency_key="k-1")
    assert status == 400 and other["error_code"] == "invalid_params" and probe.calls == 1
    status, fresh = await call(http, "probe_tool", {"n": 1}, idempotency_key="k-2")
    assert status == 200 and probe.calls == 2


# ---- approvals -----------------------------------------------------------------------------


async def test_approval_flow_single_use(demo_gateway: Any, http: httpx.AsyncClient, sandbox: Path) -> None:
    (sandbox / "doomed.txt").write_text("bye", encoding="utf-8")
    args = {"path": "doomed.txt"}
    status, held = await call(http, "delete_file", args)
    assert status == 202 and held["status"] == "pending_approval" and held["error_code"] == "approval_required"
    approval_id = held["approval_id"]
    assert approval_id and approval_id in held["message"]
    assert (sandbox / "doomed.txt").exists()
    assert record_for(demo_gateway, held["request_id"])["approval_id"] == approval_id

    assert (await http.get("/v1/approvals", headers=OPERATOR)).status_code == 403
    assert (await http.get("/v1/approvals")).status_code == 401  # no key: the auth layer refuses
    listed = (await http.get("/v1/approvals", headers=ADMIN)).json()["approvals"]
    assert [a["id"] for a in listed] == [approval_id]
    assert listed[0]["principal"] == "operator" and listed[0]["tool"] == "delete_file"

    # not yet approved: still pending
    status, env = await call(http, "delete_file", args, approval_id=approval_id)
    assert status == 202 and env["error_code"] == "approval_required"
    assert (await http.post(f"/v1/approvals/{approval_id}:approve", headers=OPERATOR)).status_code == 403
    decided = await http.post(f"/v1/approvals/{approval_id}:approve", headers=ADMIN)
    assert decided.status_code == 200 and decided.json()["approval"]["state"] == "approved"
    assert decided.json()["approval"]["decided_by"] == "admin"

    status, env = await call(http, "delete_file", args, approval_id=approval_id)
    assert status == 200 and env["status"] == "ok", env
    assert not (sandbox / "doomed.txt").exists()
    assert record_for(demo_gateway, env["request_id"])["approval_id"] == approval_id

    status, env = await call(http, "delete_file", args, approval_id=approval_id)
    assert status == 403 and env["error_code"] == "approval_denied" and "single use" in env["message"]
    assert (await http.get("/v1/approvals", headers=ADMIN)).json()["approvals"] == []


async def test_approval_is_bound_to_the_call(http: httpx.AsyncClient, sandbox: Path) -> None:
    for name in ("one.txt", "two.txt"):
        (sandbox / name).write_text(name, encoding="utf-8")
    status, held = await call(http, "delete_file", {"path": "one.txt"})
    assert status == 202
    approval_id = held["approval_id"]
    assert (await http.post(f"/v1/approvals/{approval_id}:approve", headers=ADMIN)).status_code == 200
    status, env = await call(http, "delete_file", {"path": "two.txt"}, approval_id=approval_id)
    assert status == 403 and env["error_code"] == "approval_denied", env
    assert (sandbox / "two.txt").exists()
    # another principal cannot redeem it either
    status, env = await call(http, "delete_file", {"path": "one.txt"}, approval_id=approval_id, headers=ADMIN)
    assert status == 403 and env["error_code"] == "approval_denied"
    # the approved call itself still goes through once
    status, env = await call(http, "delete_file", {"path": "one.txt"}, approval_id=approval_id)
    assert status == 200 and not (sandbox / "one.txt").exists()


async def test_approval_denied(http: httpx.AsyncClient, sandbox: Path) -> None:
    (sandbox / "keep.txt").write_text("keep", encoding="utf-8")
    status, held = await call(http, "delete_file", {"path": "keep.txt"})
    approval_id = held["approval_id"]
    denied = await http.post(f"/v1/approvals/{approval_id}:deny", headers=ADMIN)
    assert denied.status_code == 200 and denied.json()["approval"]["state"] == "denied"
    status, env = await call(http, "delete_file", {"path": "keep.txt"}, approval_id=approval_id)
    assert status == 403 and env["error_code"] == "approval_denied"
    assert (sandbox / "keep.txt").exists()
    again = await http.post(f"/v1/approvals/{approval_id}:approve", headers=ADMIN)
    assert again.status_code == 409 and again.json()["error_code"] == "invalid_params"
    missing = await http.post("/v1/approvals/apr_nope:approve", headers=ADMIN)
    assert missing.status_code == 404
    bad_verb = await http.post(f"/v1/approvals/{approval_id}:maybe", headers=ADMIN)
    assert bad_verb.status_code == 404


async def test_approval_expires(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    gw = await open_test_gateway(write_policy(tmp_path / "expiring", approval={"expires_seconds": 0.2}))
    (sandbox / "f.txt").write_text("f", encoding="utf-8")
    async with client_for(gw) as http:
        status, held = await call(http, "delete_file", {"path": "f.txt"})
        assert status == 202
        await anyio.sleep(0.3)
        status, env = await call(http, "delete_file", {"path": "f.txt"}, approval_id=held["approval_id"])
        assert status == 403 and env["error_code"] == "approval_timeout" and env["retryable"] is True
        late = await http.post(f"/v1/approvals/{held['approval_id']}:approve", headers=ADMIN)
        assert late.status_code == 409
    assert (sandbox / "f.txt").exists()


async def test_approval_hold_times_out(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    gw = await open_test_gateway(write_policy(tmp_path / "holding", approval={"hold_seconds": 0.3, "expires_seconds": 60}))
    (sandbox / "h.txt").write_text("h", encoding="utf-8")
    async with client_for(gw) as http:
        started = time.monotonic()
        status, env = await call(http, "delete_file", {"path": "h.txt"})
        assert time.monotonic() - started >= 0.3
        assert status == 403 and env["error_code"] == "approval_timeout"
    assert record_for(gw, env["request_id"])["block_class"] == "approval"
    assert (sandbox / "h.txt").exists()


async def test_approval_hold_released_by_approver(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    # A hold long enough that a loaded machine cannot end it before the approver acts (a 200 proves the approval released it).
    gw = await open_test_gateway(write_policy(tmp_path / "holding", approval={"hold_seconds": 60, "expires_seconds": 120}))
    (sandbox / "h.txt").write_text("h", encoding="utf-8")
    async with client_for(gw) as http:

        async def approve_when_listed() -> None:
            while True:
                pending = (await http.get("/v1/approvals", headers=ADMIN)).json()["approvals"]
                if pending:
                    await http.post(f"/v1/approvals/{pending[0]['id']}:approve", headers=ADMIN)
                    return
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(approve_when_listed)
            with anyio.fail_after(30):
                status, env = await call(http, "delete_file", {"path": "h.txt"})
    assert status == 200, env
    assert not (sandbox / "h.txt").exists()


# ---- malformed input -----------------------------------------------------------------------


def _nested(levels: int) -> bytes:
    return ('{"arguments": {"x": ' + "[" * levels + "]" * levels + "}}").encode()


BAD_BODIES = {
    "malformed-json": b'{"arguments": {"path": "a.txt"',
    "invalid-utf8": b'{"arguments": {"path": "\xff\xfe"}}',
    "duplicate-arguments": b'{"arguments": {"path": "a.txt"}, "arguments": {"path": "../x"}}',
    "duplicate-key-in-arguments": b'{"arguments": {"path": "a.txt", "path": "../x"}}',
    "arguments-list": b'{"arguments": ["a.txt"]}',
    "arguments-string": b'{"arguments": "a.txt"}',
    "arguments-number": b'{"arguments": 7}',
    "body-list": b'[{"arguments": {"path": "a.txt"}}]',
    "body-string": b'"a.txt"',
    "oversized": b'{"arguments": {"path": "' + b"a" * 70_000 + b'"}}',
    "deeply-nested": _nested(100),
    "very-deeply-nested": _nested(100_000),
    "unknown-field": b'{"arguments": {"path": "a.txt"}, "tool": "write_file"}',
    "nan": b'{"arguments": {"path": NaN}}',
    "infinity": b'{"arguments": {"path": -Infinity}}',
    "huge-integer": b'{"arguments": {"path": ' + b"9" * 5000 + b"}}",
    "float-overflow": b'{"arguments": {"path": 1e999}}',
    "lone-surrogate": b'{"arguments": {"path": "\\ud800"}}',
    "trailing-data": b'{"arguments": {"path": "a.txt"}} {}',
    "purpose-not-string": b'{"arguments": {"path": "a.txt"}, "purpose": ["x"]}',
    "dry-run-not-bool": b'{"arguments": {"path": "a.txt"}, "dry_run": "yes"}',
    "schema-violation": b'{"arguments": {"path": "a.txt", "extra": 1}}',
}


@pytest.mark.parametrize("content", BAD_BODIES.values(), ids=BAD_BODIES.keys())
async def test_bad_input_is_a_recorded_invalid_params(demo_gateway: Any, http: httpx.AsyncClient, content: bytes) -> None:
    before = ledger_size(demo_gateway)
    response = await http.post("/v1/tools/read_file:call", content=content, headers=OPERATOR)
    assert response.status_code == 400, response.text
    env = response.json()
    assert set(env) == ENVELOPE_KEYS
    assert env["status"] == "blocked" and env["error_code"] == "invalid_params" and env["retryable"] is False
    assert "Traceback" not in response.text and env["message"]
    assert ledger_size(demo_gateway) == before + 1
    record = record_for(demo_gateway, env["request_id"])
    assert record["error_code"] == "invalid_params" and record["principal"] == "operator"
    jwks = (await http.get("/.well-known/jwks.json")).json()
    verify_receipt(env["receipt"], jwks, response=without(env, "receipt"))


async def test_streamed_oversized_body_is_refused(demo_gateway: Any, http: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to check up front
        yield b'{"arguments": {"path": "'
        for _ in range(100):
            yield b"a" * 1024
        yield b'"}}'

    before = ledger_size(demo_gateway)
    response = await http.post("/v1/tools/read_file:call", content=chunks(), headers=OPERATOR)
    assert response.status_code == 400 and response.json()["error_code"] == "invalid_params"
    assert "over the limit" in response.json()["message"]
    assert ledger_size(demo_gateway) == before + 1


async def test_duplicate_arguments_key_never_reaches_the_backend(http: httpx.AsyncClient, sandbox: Path) -> None:
    content = b'{"arguments": {"path": "ok.txt", "content": "x"}, "arguments": {"path": "../escape.txt", "content": "x"}}'
    response = await http.post("/v1/tools/write_file:call", content=content, headers=OPERATOR)
    assert response.status_code == 400
    assert not (sandbox / "ok.txt").exists() and not (sandbox.parent / "escape.txt").exists()


async def test_request_id_header_is_used_only_when_sane(demo_gateway: Any, http: httpx.AsyncClient, sandbox: Path) -> None:
    (sandbox / "a.txt").write_text("A", encoding="utf-8")
    response = await http.post("/v1/tools/read_file:call", json={"arguments": {"path": "a.txt"}}, headers={**OPERATOR, "x-request-id": "trace-42.a_b:c"})
    assert response.json()["request_id"] == "trace-42.a_b:c"
    response = await http.post("/v1/tools/read_file:call", json={"arguments": {"path": "a.txt"}}, headers={**OPERATOR, "x-request-id": "x" * 500})
    env = response.json()
    assert response.status_code == 200 and env["request_id"].startswith("req_")
    assert record_for(demo_gateway, env["request_id"])["status"] == "ok"


# ---- health, JWKS --------------------------------------------------------------------------


async def test_healthz_and_jwks(demo_gateway: Any, http: httpx.AsyncClient) -> None:
    health = (await http.get("/healthz")).json()
    assert health["status"] == "ok" and health["policy"] == "test-profile"
    assert health["policy_version"] == demo_gateway.policy.version and health["policy_version"].startswith("sha256:")
    jwks = (await http.get("/.well-known/jwks.json")).json()
    [key, checkpoint] = jwks["keys"]
    assert key["kty"] == "OKP" and key["crv"] == "Ed25519" and "d" not in key
    assert key["kid"] == jwk_thumbprint(key["x"]) == demo_gateway.keys.kid
    # the ledger-checkpoint key is published beside the receipt key, marked as what it is
    assert checkpoint["use"] == "dharma-checkpoint" and checkpoint["alg"] == "Ed25519" and "d" not in checkpoint
    assert checkpoint["kid"].startswith(demo_gateway.keys.checkpoint_key_name + "+") and checkpoint["kid"] != key["kid"]


# ---- backends: failures, timeouts, circuit breaker, plain HTTP -----------------------------


async def test_ledger_failure_fails_closed(demo_gateway: Any, http: httpx.AsyncClient, sandbox: Path) -> None:
    (sandbox / "a.txt").write_text("secret contents", encoding="utf-8")
    await demo_gateway.ledger.aclose()  # the ledger can no longer be written
    status, env = await call(http, "read_file", {"path": "a.txt"})
    assert status == 500 and env["error_code"] == "internal_error"
    assert env["result"] is None and "secret contents" not in json.dumps(env)


async def test_backend_error_is_recorded(demo_gateway: Any, http: httpx.AsyncClient, probe: Probe) -> None:
    probe.mode = "fail"
    status, env = await call(http, "probe_tool", {"n": 1})
    assert status == 502 and env["status"] == "error" and env["error_code"] == "backend_error"
    assert "Traceback" not in json.dumps(env)
    record = record_for(demo_gateway, env["request_id"])
    assert record["status"] == "error" and record["error_code"] == "backend_error" and record["backend"] == "probe"


async def test_backend_timeout(http: httpx.AsyncClient, probe: Probe) -> None:
    probe.mode = "hang"
    started = time.monotonic()
    status, env = await call(http, "probe_tool", {})
    assert time.monotonic() - started < 3
    assert status == 504 and env["error_code"] == "timeout" and env["retryable"] is True


async def test_circuit_breaker_opens_and_half_opens(http: httpx.AsyncClient, probe: Probe) -> None:
    probe.mode = "fail"
    for _ in range(2):  # failure_threshold: 2
        status, _ = await call(http, "probe_tool", {})
        assert status == 502
    assert probe.calls == 2
    status, env = await call(http, "probe_tool", {})
    assert status == 503 and env["error_code"] == "backend_unavailable" and env["retry_after"] > 0
    assert probe.calls == 2  # failed fast, not forwarded
    await anyio.sleep(0.35)  # reset_seconds: 0.3 → half-open
    probe.mode = "ok"
    status, env = await call(http, "probe_tool", {})
    assert status == 200 and probe.calls == 3
    status, env = await call(http, "probe_tool", {})
    assert status == 200 and probe.calls == 4  # closed again


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_tool_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A tiny plain HTTP tool API (Starlette under uvicorn in a thread on 127.0.0.1)."""
    seen: list[dict[str, Any]] = []

    async def search_api(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        query = body["arguments"]["query"]
        return JSONResponse({"result": {"content": [{"type": "text", "text": f"remote hits for {query}"}]}})

    app = Starlette(routes=[Route("/tools/search_api", search_api, methods=["POST"])])
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not server.started:
        assert time.monotonic() < deadline, "tool API did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}/tools", seen
    server.should_exit = True
    thread.join(5)


async def test_http_upstream(open_test_gateway: OpenGateway, policy_path: Path, http_tool_api: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = http_tool_api
    schema = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    upstream = {"id": "api", "type": "http", "url": url, "tools": [{"name": "search_api", "input_schema": schema, "annotations": {"readOnlyHint": True}}]}
    gw = await open_test_gateway(policy_path, upstreams=[upstream])
    async with client_for(gw) as http:
        status, env = await call(http, "search_api", {"query": "ledger"}, headers=READER)
        assert status == 200, env
        assert env["result"] == {"content": [{"type": "text", "text": "remote hits for ledger"}]}
        assert seen == [{"arguments": {"query": "ledger"}}]
        status, env = await call(http, "search_api", {"query": 3}, headers=READER)
        assert status == 400 and len(seen) == 1
    assert record_for(gw, env["request_id"])["backend"] == "api"


# ---- the shipped standard profile (once rules/ exists), with the demo's API keys -------------

DEMO_PROFILE = REPO / "examples" / "policies" / "demo.yaml"  # extends policies/standard.yaml
_shipped_rules = [REPO / "rules" / f for f in ("filesystem.yaml", "secrets.yaml", "shell.yaml", "sensitive_data.yaml")]
needs_rules = pytest.mark.skipif(not all(p.exists() for p in _shipped_rules), reason="rules/ not written yet")


@needs_rules
async def test_standard_profile_over_http(open_test_gateway: OpenGateway, sandbox: Path) -> None:
    gw = await open_test_gateway(DEMO_PROFILE)
    (sandbox / "notes.txt").write_text("notes", encoding="utf-8")
    reader = {"authorization": "Bearer demo-reader-key"}
    async with client_for(gw) as http:
        assert (await http.get("/healthz")).json()["policy"] == "demo"
        assert str(REPO / "policies" / "standard.yaml") in gw.policy.files  # the shipped tiers and rules
        status, env = await call(http, "read_file", {"path": "notes.txt"}, headers=reader)
        assert status == 200 and env["result"]["content"][0]["text"] == "notes"
        status, env = await call(http, "read_file", {"path": "../etc/passwd"}, headers=reader)
        assert status == 403 and env["error_code"] == "policy_blocked"
        status, env = await call(http, "write_file", {"path": "x", "content": "y"}, headers=reader)
        assert status == 404 and env["error_code"] == "tool_not_found"
        clinician = {"authorization": "Bearer demo-clinician-key"}
        status, env = await call(http, "health_records", {"patient_id": "p-1001"}, headers=clinician)
        assert status == 403 and env["error_code"] == "purpose_required"
