"""Live policy reload of a real `dharma serve`: a rule file edited on disk, SIGHUP, the admin
endpoint; a broken file keeps the last good policy (the error with file:line in /healthz and the
log); every attempt is a verifiable, queryable ledger record. And in process: a call held under
v1 finishes under v1 after a reload to v2, a new call sees v2.

Every wait is for a positive signal (the reload's ledger record, /healthz), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from audit.query import query_records
from audit.sqlite import SqliteLedgerReader
from gateway.core.errors import PolicyErrors
from gateway.policy.compile import load_policy
from tests.conftest import KEYS, REPO, TEST_RULES, write_policy
from tests.helpers import wait_for
from tests.test_cli import cli_env, dharma, free_port

DEADLINE_S = 60.0
DENY_READS = {
    "id": "no-reads-today",
    "tools": ["read_*"],
    "effect": "deny",
    "message": "reading is switched off",
}
BACKEND = '''
from gateway.core.backends import ToolSpec
from gateway.transports.upstreams.python import CallableBackend

def read_note(path: str):
    return {"content": [{"type": "text", "text": "note " + path}]}

def backend(backend_id: str = "notes") -> CallableBackend:
    return CallableBackend(backend_id, {"read_note": (read_note, ToolSpec("read_note", "Read a note.",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}))})
'''


def rules_with(*extra: dict[str, Any]) -> str:
    doc = copy.deepcopy(TEST_RULES)
    doc["rules"].extend(copy.deepcopy(list(extra)))
    return yaml.safe_dump(doc, sort_keys=False)


def save(folder: Path, text: str) -> str:
    """Save the rule file as an editor does (a new file renamed over the old: readers never see half
    of it); return the policy version the folder's files now compile to (None if they do not)."""
    staged = folder / ".rules.yaml.tmp"
    staged.write_text(text)
    os.replace(staged, folder / "rules.yaml")
    try:
        return load_policy(folder / "profile.yaml").version
    except PolicyErrors:
        return None


def reload_records(state_root: Path) -> list[dict[str, Any]]:
    path = state_root / "ledger.db"
    if not path.exists():
        return []
    with SqliteLedgerReader(path) as reader:
        return list(query_records(reader, kind="reload"))


@pytest.fixture
def served(tmp_path: Path, state_root: Path) -> Callable[..., Any]:
    """Start `dharma serve` over the notes backend and a test profile; yield (url, process, log path, policy dir)."""
    procs: list[subprocess.Popen[str]] = []

    def start(*, watch: bool = True, server: dict[str, Any] | None = None, upstreams: list[dict[str, Any]] = (),  # type: ignore[assignment]
              nofile: int | None = None) -> tuple[str, subprocess.Popen[str], Path, Path]:
        """`server`: settings of dharma.yaml's `server:`; `upstreams`: more upstreams beside the notes
        backend; `nofile`: the process's file-descriptor limit (soft and hard)."""
        folder = tmp_path / f"policy{len(procs)}"
        policy = write_policy(folder)
        (tmp_path / "notes_backend.py").write_text(BACKEND)
        config = tmp_path / f"dharma{len(procs)}.yaml"
        config.write_text(yaml.safe_dump({
            "policy": str(policy), "python_path": [str(tmp_path), str(REPO)],
            "upstreams": [{"id": "notes", "type": "python", "target": "notes_backend:backend"}, *upstreams],
            "reload": {"watch": watch, "debounce_ms": 50}, "log_level": "info", "server": server or {},
        }))
        port = free_port()
        log = tmp_path / f"serve{len(procs)}.log"
        limit = None if nofile is None else functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (nofile, nofile))
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config), "serve", "--port", str(port)],
                                env=cli_env(state_root), stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True,
                                preexec_fn=limit)
        procs.append(proc)
        return f"http://127.0.0.1:{port}", proc, log, folder

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def healthy(http: httpx.AsyncClient) -> dict[str, Any] | None:
    try:
        answer = await http.get("/healthz")
    except httpx.TransportError:
        return None
    return answer.json() if answer.status_code == 200 else None


async def serving(http: httpx.AsyncClient, version: str) -> bool:
    """Whether /healthz says `version` serves: a reload is in the ledger before it takes effect
    (gateway.reload), so its record alone does not say the new policy answers calls yet."""
    health = await healthy(http)
    return health is not None and health["policy_version"] == version


async def degraded(http: httpx.AsyncClient) -> bool:
    """Whether /healthz reports the last reload failed (set once its record is in the ledger)."""
    health = await healthy(http)
    return health is not None and health["status"] == "degraded"


async def read(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/tools/read_note:call", json={"arguments": {"path": "a"}},
                           headers={"authorization": f"Bearer {KEYS['reader']}"})


async def test_serve_reloads_on_file_change_keeps_last_good_and_records_every_attempt(served, state_root: Path) -> None:
    url, server, log, folder = served(watch=True)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        first = await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
        v1 = first["policy_version"]
        assert first["policy_status"]["state"] == "ok" and first["policy_status"]["last_reload"] is None
        assert (await read(http)).json()["status"] == "ok"

        # 1. edit the rule file: the new rule applies without a restart
        v2 = save(folder, rules_with(DENY_READS))
        assert v2 is not None and v2 != v1
        records = await wait_for(lambda: [r for r in reload_records(state_root) if r["new_version"] == v2],
                                 "the reload record of the edit", server)
        assert records[-1]["trigger"] == "file" and records[-1]["ok"] is True and records[-1]["changed"] is True
        assert records[-1]["old_version"] == v1 and records[-1]["policy_version"] == v2
        await wait_for(lambda: serving(http, v2), "v2 to serve", server)
        denied = (await read(http)).json()
        assert denied["error_code"] == "policy_blocked" and "reading is switched off" in denied["message"]
        assert (await http.get("/healthz")).json()["policy_version"] == v2

        # 2. a broken file: the last good policy keeps serving; /healthz says why, with file:line, and stays 200
        assert save(folder, rules_with(DENY_READS, {"id": "broken", "when": "(((", "effect": "deny"})) is None
        records = await wait_for(lambda: [r for r in reload_records(state_root) if r["ok"] is False], "the failed reload's record", server)
        failed = records[-1]
        assert failed["policy_version"] == v2 and failed["new_version"] is None
        assert any("rules.yaml:" in p and "[broken]" in p for p in failed["problems"]), failed["problems"]
        await wait_for(lambda: degraded(http), "/healthz to say the reload failed", server)
        health = await http.get("/healthz")
        assert health.status_code == 200, "a failed reload must not fail the health check: the last good policy serves"
        body = health.json()
        assert body["status"] == "degraded" and body["policy_version"] == v2
        assert body["policy_status"]["state"] == "degraded"
        assert f"{folder / 'rules.yaml'}:" in body["policy_status"]["last_reload"]["error"]
        assert "[broken]" in body["message"]
        assert (await read(http)).json()["error_code"] == "policy_blocked"  # still v2's rule
        logged = [json.loads(line) for line in log.read_text().splitlines() if '"policy.reload_failed"' in line]
        assert logged and logged[-1]["file"].endswith("rules.yaml") and logged[-1]["line"] > 0
        assert logged[-1]["level"] == "error" and logged[-1]["keeping"] == v2

        # 3. the admin endpoint: refused without credentials and without role admin; an admin reloads
        assert (await http.post("/v1/admin/reload")).status_code == 401
        refused = await http.post("/v1/admin/reload", headers={"authorization": f"Bearer {KEYS['reader']}"})
        assert refused.status_code == 403 and "admin" in refused.json()["message"]
        assert save(folder, rules_with()) == v1  # fixed again: the watcher reloads it, then the admin asks once more
        await wait_for(lambda: reload_records(state_root)[-1]["policy_version"] == v1, "the fixed file's reload", server)
        await wait_for(lambda: serving(http, v1), "v1 to serve again", server)
        answer = await http.post("/v1/admin/reload", headers={"authorization": f"Bearer {KEYS['admin']}"})
        assert answer.status_code == 200, answer.text
        attempt = answer.json()["reload"]
        assert attempt["ok"] and attempt["trigger"] == "http" and attempt["by"] == "admin" and attempt["new_version"] == v1
        assert (await read(http)).json()["status"] == "ok"
        assert (await http.get("/healthz")).json()["status"] == "ok"

    server.terminate()
    server.wait(timeout=30)
    verified = dharma("audit", "verify", state_root=state_root)
    assert verified.rc == 0, verified.out + verified.err
    listed = dharma("audit", "query", "--kind", "reload", "--format", "jsonl", state_root=state_root)
    rows = [json.loads(line) for line in listed.out.splitlines()]
    assert [r["kind"] for r in rows] == ["reload"] * len(rows) and rows[-1]["trigger"] == "http"
    assert {"file", "http"} <= {r["trigger"] for r in rows} and any(not r["ok"] for r in rows)


async def test_serve_reloads_on_sighup(served, state_root: Path) -> None:
    url, server, _log, folder = served(watch=False)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await wait_for(lambda: healthy(http), "the gateway to be healthy", server)
        save(folder, rules_with(DENY_READS))
        assert (await read(http)).json()["status"] == "ok", "watching is off: an edit alone changes nothing"
        server.send_signal(signal.SIGHUP)
        records = await wait_for(lambda: reload_records(state_root), "the SIGHUP reload's record", server)
        assert records[-1]["trigger"] == "signal" and records[-1]["ok"] and records[-1]["changed"]
        await wait_for(lambda: serving(http, records[-1]["new_version"]), "the reloaded policy to serve", server)
        assert (await read(http)).json()["error_code"] == "policy_blocked"


async def test_a_held_call_finishes_under_the_policy_it_started_with(tmp_path: Path) -> None:
    """Held for approval under v1, approved after a reload to v2: decided and recorded under v1; a new call sees v2."""
    from gateway.runtime import open_gateway
    from tests.helpers import Recorder

    folder = tmp_path / "policy"
    policy = write_policy(folder, approval={"hold_seconds": DEADLINE_S})
    recorder = Recorder()
    gateway = await open_gateway(policy=policy, state_root=tmp_path / "state",
                                 backends=[recorder.backend({"delete_file": lambda path: {"deleted": path}, "read_file": lambda path: {"read": path}})])
    try:
        v1 = gateway.policy.version
        held = asyncio.create_task(gateway.call("delete_file", {"path": "x"}, api_key=KEYS["operator"]))
        pending = await wait_for(gateway.pending_approvals, "the call to be held")
        v2 = save(folder, rules_with(DENY_READS))
        attempt = await gateway.reload()
        assert attempt.ok and gateway.policy.version == v2 != v1
        await gateway.approve(pending[0].id, by="admin")
        outcome = await held
        assert outcome.status.value == "ok" and recorder.calls == [("delete_file", {"path": "x"})]
        fresh = await gateway.call("read_file", {"path": "a"}, api_key=KEYS["reader"])
        assert fresh.error_code is not None and fresh.error_code.value == "policy_blocked"  # v2's rule
    finally:
        await gateway.aclose()
    with SqliteLedgerReader(tmp_path / "state" / "ledger.db") as reader:
        records = list(query_records(reader))
    held_call = [r for r in records if r.get("request_id") == outcome.request_id]
    assert held_call and {r["policy_version"] for r in held_call} == {v1}
    assert [r["policy_version"] for r in records if r.get("request_id") == fresh.request_id] == [v2]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_reload_records_verify_and_query_on_both_ledgers(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A good and a broken reload on a SQLite file and on PostgreSQL: both records chain, verify and are found by kind."""
    from audit.verify import verify_ledger
    from gateway.config import Settings
    from gateway.runtime import open_gateway
    from tests.audit.conftest import new_location, open_reader

    location = new_location(backend, request, tmp_path)
    folder = tmp_path / "policy"
    ledger = {"url": location} if backend == "postgres" else {"path": str(location)}
    gateway = await open_gateway(Settings(policy=write_policy(folder), state_root=tmp_path / "state", ledger=ledger))
    try:
        v1 = gateway.policy.version
        v2 = save(folder, rules_with(DENY_READS))
        assert (await gateway.reload(trigger="api")).ok
        assert save(folder, "rules: [") is None
        failed = await gateway.reload(trigger="api")
        assert not failed.ok and "rules.yaml:" in failed.error and gateway.policy.version == v2
    finally:
        await gateway.aclose()
    with open_reader(location) as reader:
        assert verify_ledger(reader).ok
        found = list(query_records(reader, kind="reload"))
    assert [(r["ok"], r["old_version"], r["policy_version"]) for r in found] == [(True, v1, v2), (False, v2, v2)]
    assert found[1]["problems"] and found[1]["new_version"] is None
