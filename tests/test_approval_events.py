"""Approvals are karma-ledger events, with real parts: a real Gateway (SQLite ledger and
approvals.db under a tmp state root), the HTTP API over ASGI, and `dharma` as its own process."""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from audit.sqlite import SqliteLedgerReader
from audit.verify import verify_ledger
from gateway.cli.approvals import os_user
from gateway.stages.approval import ApprovalRefused
from gateway.stores.sqlite_approvals import SqliteApprovalStore
from tests.conftest import KEYS, TEST_PROFILE, OpenGateway, key_digest, write_policy
from tests.test_cli import dharma
from tests.test_http_api import ADMIN, OPERATOR, call, client_for, records

APPROVER_KEY = "approver-key"
APPROVER = {"authorization": f"Bearer {APPROVER_KEY}"}


def profile(**approval: Any) -> dict[str, Any]:
    """The test profile plus an `approver` (role approver, reader tier) and the OS user as `os-approver`."""
    doc = copy.deepcopy(TEST_PROFILE)
    doc["principals"] += [
        {"id": "approver", "api_key_sha256": key_digest(APPROVER_KEY), "tier": "reader", "roles": ["approver"]},
        {"id": "os-approver", "local_user": os_user(), "tier": "reader", "roles": ["approver"]},
    ]
    if approval:
        doc["approval"] = approval
    return doc


def approval_records(gw: Any, approval_id: str) -> list[dict[str, Any]]:
    return [r for r in records(gw) if r.get("kind") == "approval" and r["approval_id"] == approval_id]


async def test_held_then_approved_by_another_principal_is_in_the_ledger(
    open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, state_root: Path
) -> None:
    policy = write_policy(tmp_path / "p", profile())
    gw = await open_test_gateway(policy)
    (sandbox / "a.txt").write_text("a", encoding="utf-8")
    async with client_for(gw) as http:
        status, held = await call(http, "delete_file", {"path": "a.txt"}, headers=OPERATOR)
        assert status == 202
        approval_id = held["approval_id"]
        decided = await http.post(f"/v1/approvals/{approval_id}:approve", headers=APPROVER, json={"reason": "ticket 42"})
        assert decided.status_code == 200 and decided.json()["approval"]["decided_by"] == "approver"
        status, done = await call(http, "delete_file", {"path": "a.txt"}, headers=OPERATOR, approval_id=approval_id)
        assert status == 200 and done["status"] == "ok"
    assert not (sandbox / "a.txt").exists()
    events = approval_records(gw, approval_id)
    binding = {
        "principal": "operator", "tool": "delete_file", "policy_version": gw.policy.version,
        "held_request_id": held["request_id"], "args_digest": events[0]["args_digest"],
    }
    assert [(r["event"], r["by"], r["via"], r["reason"]) for r in events] == [
        ("held", "operator", "gateway", "deleting a file"), ("approved", "approver", "http", "ticket 42"),
    ]
    for r in events:
        assert {k: r[k] for k in binding} == binding and r["time"].endswith("Z")
    call_records = [r for r in records(gw) if r.get("request_id") == done["request_id"]]
    assert {r["args_digest"] for r in call_records} == {binding["args_digest"]}
    # the approved record precedes the call it released, and the chain verifies
    assert events[1]["seq"] < min(r["seq"] for r in call_records)
    with SqliteLedgerReader(gw.ledger.path) as reader:
        assert verify_ledger(reader).ok
    # `dharma audit query --approval-id` (its own process) finds both events and the call
    query = dharma("audit", "query", "--approval-id", approval_id, "--format", "jsonl", state_root=state_root)
    assert query.rc == 0, query.err
    found = [json.loads(line) for line in query.out.splitlines()]
    assert [r.get("event") for r in found if r.get("kind") == "approval"] == ["held", "approved"]
    assert any(r.get("kind") == "outcome" and r["status"] == "ok" for r in found)


async def test_self_approval_is_refused_and_recorded_nowhere_as_approved(
    open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path
) -> None:
    gw = await open_test_gateway(write_policy(tmp_path / "p", profile()))
    (sandbox / "s.txt").write_text("s", encoding="utf-8")
    async with client_for(gw) as http:
        status, held = await call(http, "delete_file", {"path": "s.txt"}, headers=ADMIN)
        assert status == 202
        approval_id = held["approval_id"]
        refused = await http.post(f"/v1/approvals/{approval_id}:approve", headers=ADMIN)
        assert refused.status_code == 403 and "self-approval" in refused.json()["message"]
        status, again = await call(http, "delete_file", {"path": "s.txt"}, headers=ADMIN, approval_id=approval_id)
        assert status == 202 and again["error_code"] == "approval_required"
    with pytest.raises(ApprovalRefused):
        await gw.approve(approval_id, by="admin")
    assert (sandbox / "s.txt").exists()
    assert (await gw.approvals.get(approval_id)).state == "pending"
    assert [r["event"] for r in approval_records(gw, approval_id)] == ["held"]
    store = SqliteApprovalStore(gw.approvals.path)
    assert [e.event for e in store.unrecorded_sync()] == []  # nothing approved waits outside the chain either
    # denying one's own call is allowed: it only refuses
    await gw.deny(approval_id, by="admin")
    assert [(r["event"], r["by"]) for r in approval_records(gw, approval_id)] == [("held", "admin"), ("denied", "admin")]


async def test_self_approval_where_the_policy_allows_it(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    gw = await open_test_gateway(write_policy(tmp_path / "p", profile(allow_self_approval=True)))
    (sandbox / "s.txt").write_text("s", encoding="utf-8")
    async with client_for(gw) as http:
        _, held = await call(http, "delete_file", {"path": "s.txt"}, headers=ADMIN)
        assert (await http.post(f"/v1/approvals/{held['approval_id']}:approve", headers=ADMIN)).status_code == 200
        status, _ = await call(http, "delete_file", {"path": "s.txt"}, headers=ADMIN, approval_id=held["approval_id"])
    assert status == 200 and not (sandbox / "s.txt").exists()
    assert [(r["event"], r["by"]) for r in approval_records(gw, held["approval_id"])] == [("held", "admin"), ("approved", "admin")]


async def test_elicitation_is_the_callers_own_answer_and_policy_gated(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    for allowed in (True, False):
        gw = await open_test_gateway(write_policy(tmp_path / f"p{allowed}", profile(allow_elicitation=allowed)))
        held = await gw.call("delete_file", {"path": "e.txt"}, api_key=KEYS["operator"])
        with pytest.raises(ApprovalRefused):  # an elicitation answers only for the caller itself
            await gw.approve(held.approval_id, by="approver", via="elicitation")
        if allowed:
            await gw.approve(held.approval_id, by="operator", via="elicitation")
            assert [(r["event"], r["by"], r["via"]) for r in approval_records(gw, held.approval_id)][-1] == ("approved", "operator", "elicitation")
        else:
            with pytest.raises(ApprovalRefused, match="allow_elicitation"):
                await gw.approve(held.approval_id, by="operator", via="elicitation")
            assert (await gw.approvals.get(held.approval_id)).state == "pending"
        await gw.aclose()


async def test_elicitation_is_off_by_default_and_a_tier_list_names_who_may_answer(
        open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    default = await open_test_gateway(write_policy(tmp_path / "default", profile()))  # no `approval` key at all
    held = await default.call("delete_file", {"path": "e.txt"}, api_key=KEYS["operator"])
    with pytest.raises(ApprovalRefused, match="allow_elicitation"):
        await default.decide(held.approval_id, approve=True, by="operator", via="elicitation", reason="", tier="operator")
    assert (await default.approvals.get(held.approval_id)).state == "pending"
    await default.aclose()
    listed = await open_test_gateway(write_policy(tmp_path / "listed", profile(allow_elicitation=["operator"])))
    held = await listed.call("delete_file", {"path": "e.txt"}, api_key=KEYS["operator"])
    for tier in ("reader", None):  # the caller's own tier must be listed
        with pytest.raises(ApprovalRefused, match="allow_elicitation"):
            await listed.decide(held.approval_id, approve=True, by="operator", via="elicitation", reason="", tier=tier)
    await listed.decide(held.approval_id, approve=True, by="operator", via="elicitation", reason="answered", tier="operator")
    events = [(r["event"], r["by"], r["via"]) for r in approval_records(listed, held.approval_id)]
    assert events == [("held", "operator", "gateway"), ("approved", "operator", "elicitation")]
    await listed.aclose()


async def test_expired_is_recorded(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    gw = await open_test_gateway(write_policy(tmp_path / "p", profile(hold_seconds=0.2, expires_seconds=60)))
    timed_out = await gw.call("delete_file", {"path": "h.txt"}, api_key=KEYS["operator"])
    assert timed_out.error_code is not None and timed_out.error_code.value == "approval_timeout"
    events = approval_records(gw, timed_out.approval_id)
    assert [(r["event"], r["by"], r["via"]) for r in events] == [("held", "operator", "gateway"), ("expired", None, "timeout")]
    assert events[1]["principal"] == "operator" and events[1]["tool"] == "delete_file"


async def test_cli_decides_as_a_mapped_principal_only(
    open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, state_root: Path
) -> None:
    policy = write_policy(tmp_path / "p", profile())
    unmapped = write_policy(tmp_path / "unmapped")  # the plain test profile: no local_user at all
    gw = await open_test_gateway(policy)
    (sandbox / "c.txt").write_text("c", encoding="utf-8")
    held = await gw.call("delete_file", {"path": "c.txt"}, api_key=KEYS["operator"])
    base = ["approvals", "approve", held.approval_id, "--policy", str(policy)]

    def run(*args: str | Path) -> Any:
        return dharma(*args, state_root=state_root)

    nobody = await anyio.to_thread.run_sync(lambda: run("approvals", "approve", held.approval_id, "--policy", unmapped))
    assert nobody.rc == 2 and f"OS user {os_user()!r} is not a principal" in nobody.err
    no_role = await anyio.to_thread.run_sync(lambda: run(*base, "--api-key", KEYS["reader"]))
    assert no_role.rc == 2 and "principal reader" in no_role.err and "approver or admin" in no_role.err
    self_ = await anyio.to_thread.run_sync(lambda: run(*base, "--api-key", KEYS["operator"]))
    assert self_.rc == 2 and "role" in self_.err  # operator has no approver role either
    old_flag = await anyio.to_thread.run_sync(lambda: run(*base, "--by", "alice"))
    assert old_flag.rc == 2 and "--by" in old_flag.err
    assert (await gw.approvals.get(held.approval_id)).state == "pending"

    ok = await anyio.to_thread.run_sync(lambda: run(*base, "--reason", "looked at it"))
    assert ok.rc == 0 and f"{held.approval_id} approved by os-approver" in ok.out and "running gateway" in ok.out
    done = await gw.call("delete_file", {"path": "c.txt"}, api_key=KEYS["operator"], approval_id=held.approval_id)
    assert done.status.value == "ok"
    assert [(r["event"], r["by"], r["via"], r["reason"]) for r in approval_records(gw, held.approval_id)] == [
        ("held", "operator", "gateway", "deleting a file"), ("approved", "os-approver", "cli", "looked at it"),
    ]


async def test_cli_refuses_self_approval(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, state_root: Path) -> None:
    policy = write_policy(tmp_path / "p", profile())
    gw = await open_test_gateway(policy)
    held = await gw.call("delete_file", {"path": "z.txt"}, api_key=KEYS["admin"])
    refused = await anyio.to_thread.run_sync(lambda: dharma(
        "approvals", "approve", held.approval_id, "--policy", policy, "--api-key", KEYS["admin"], state_root=state_root))
    assert refused.rc == 1 and "admin made this call and may not approve it" in refused.err
    assert (await gw.approvals.get(held.approval_id)).state == "pending"
    assert [r["event"] for r in approval_records(gw, held.approval_id)] == ["held"]


async def test_cli_records_in_the_ledger_when_no_gateway_runs(
    open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path, state_root: Path
) -> None:
    policy = write_policy(tmp_path / "p", profile())
    gw = await open_test_gateway(policy)
    held = await gw.call("delete_file", {"path": "d.txt"}, api_key=KEYS["operator"])
    await gw.aclose()
    denied = await anyio.to_thread.run_sync(lambda: dharma(
        "approvals", "deny", held.approval_id, "--policy", policy, "--api-key", APPROVER_KEY, state_root=state_root))
    assert denied.rc == 0 and "recorded in the karma ledger" in denied.out, denied.err
    with SqliteLedgerReader(state_root / "ledger.db") as reader:
        found = [reader.get(s).to_dict() for s in range(1, reader.size() + 1)]
        assert verify_ledger(reader).ok
    assert [(r["event"], r["by"], r["via"]) for r in found if r.get("kind") == "approval"] == [
        ("held", "operator", "gateway"), ("denied", "approver", "cli"),
    ]


async def test_approvals_db_is_insert_only(open_test_gateway: OpenGateway, tmp_path: Path, sandbox: Path) -> None:
    gw = await open_test_gateway(write_policy(tmp_path / "p", profile()))
    held = await gw.call("delete_file", {"path": "x.txt"}, api_key=KEYS["operator"])
    path = gw.approvals.path
    with sqlite3.connect(path) as conn:
        for statement in (
            "UPDATE approval_events SET event = 'approved', actor = 'operator'",
            "UPDATE approval_holds SET principal = 'admin'",
            "DELETE FROM approval_events",
            "DELETE FROM approval_holds",
            "UPDATE approval_recorded SET seq = 0",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="insert-only"):
                conn.execute(statement)
    assert (await gw.approvals.get(held.approval_id)).state == "pending"


def test_an_older_approvals_file_is_carried_over(tmp_path: Path) -> None:
    path = tmp_path / "approvals.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE approvals(id TEXT PRIMARY KEY, principal TEXT NOT NULL, tool TEXT NOT NULL, argument_digest TEXT NOT NULL,"
            " policy_version TEXT NOT NULL, request_id TEXT NOT NULL, reason TEXT NOT NULL, created_at REAL NOT NULL,"
            " expires_at REAL NOT NULL, state TEXT NOT NULL, decided_by TEXT NOT NULL DEFAULT '', arguments_preview TEXT NOT NULL DEFAULT '')"
        )
        conn.executemany(
            "INSERT INTO approvals VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [("apr_p", "op", "t", "d", "v", "req_1", "r", 1.0, 9e9, "pending", "", ""),
             ("apr_a", "op", "t", "d", "v", "req_2", "r", 1.0, 9e9, "approved", "admin", "")],
        )
    conn.close()
    store = SqliteApprovalStore(path)
    assert store.get_sync("apr_p").state == "pending"
    assert (store.get_sync("apr_a").state, store.get_sync("apr_a").decided_by) == ("approved", "admin")
    with sqlite3.connect(path) as conn, pytest.raises(sqlite3.IntegrityError, match="insert-only"):
        conn.execute("UPDATE approval_events SET actor = 'x'")
    conn.close()
