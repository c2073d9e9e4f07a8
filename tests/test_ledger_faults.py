"""The karma ledger when its database will not take a write, through a real Gateway, on real servers.

- PostgreSQL grants (`dharma audit grant`): the gateway runs as a writer role that can only read,
  append and move the head forward; an auditor role can only read; PUBLIC gets nothing.
- PostgreSQL made read-only, stopped and started again; SQLite and PostgreSQL out of space (a page
  limit on the SQLite writer's connection, a tablespace on a small tmpfs for PostgreSQL): every
  call fails closed with `internal_error`, the backend sees nothing, the log names the ledger and
  the cause; once the database takes writes again calls succeed without a restart, and the ledger
  verifies with every acknowledged call in it.
- `dharma serve` / `dharma audit verify` on a ledger that is down or is not a ledger exit 2.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from audit.query import query_records
from audit.verify import verify_ledger
from gateway.core.call import Status
from gateway.core.errors import ErrorCode
from tests.audit.conftest import BACKENDS, Location, new_location, open_reader
from tests.helpers import all_logs
from tests.conftest import DEMO_UPSTREAM, KEYS, REPO, OpenGateway
from tests.pg import PostgresServer
from tests.test_cli import dharma

OPERATOR = KEYS["operator"]


def as_role(url: str, role: str) -> str:
    """The same database, connecting as `role` (the test server trusts local connections)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{role}@{rest.split('@', 1)[1]}"


@pytest.fixture
def pg_url(postgres: PostgresServer, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(new_location("postgres", request, tmp_path))


@pytest.fixture
def gateway_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Every structlog event, whatever level an earlier test configured."""
    with all_logs(monkeypatch) as logs:
        yield logs


async def write(gw: Any, name: str) -> Any:
    """A call with a side effect: the demo backend writes `name` into the sandbox."""
    return await gw.call("write_file", {"path": name, "content": name}, api_key=OPERATOR)


def ledger_request_ids(location: Location) -> dict[str, list[str]]:
    """request id -> the kinds of its records ("single" when it has none), read back from the ledger."""
    found: dict[str, list[str]] = {}
    with open_reader(location) as reader:
        for record in query_records(reader):
            found.setdefault(record["request_id"], []).append(record.get("kind", "single"))
    return found


def assert_intact_with(location: Location, acknowledged: list[str]) -> None:
    """The ledger verifies and every acknowledged call has its decision and outcome records."""
    with open_reader(location) as reader:
        report = verify_ledger(reader)
    assert report.ok, report.problem
    recorded = ledger_request_ids(location)
    for request_id in acknowledged:
        assert sorted(recorded.get(request_id, [])) == ["decision", "outcome"], request_id


# ---- grants ------------------------------------------------------------------------------------


async def test_grants_leave_the_gateway_role_append_only_and_the_auditor_read_only(
    pg_url: str, postgres: PostgresServer, tmp_path: Path, state_root: Path, sandbox: Path, policy_path: Path,
    open_test_gateway: OpenGateway,
) -> None:
    suffix = pg_url.rsplit("/", 1)[1]
    writer, auditor, stranger = f"gw_{suffix}", f"auditor_{suffix}", f"stranger_{suffix}"
    granted = dharma("audit", "grant", pg_url, "--writer", writer, "--reader", auditor, state_root=state_root)
    assert granted.rc == 0 and f"OK {pg_url}" in granted.out and f"created role {writer}" in granted.out, granted
    again = dharma("audit", "grant", pg_url, "--writer", writer, "--reader", auditor, state_root=state_root)
    assert again.rc == 0 and "created role" not in again.out  # idempotent
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {stranger} LOGIN")

    gw = await open_test_gateway(policy_path, ledger={"url": as_role(pg_url, writer)})
    answered = await write(gw, "granted.txt")
    refused = await gw.call("read_file", {"path": "../x"}, api_key=OPERATOR)
    held = await gw.call("delete_file", {"path": "granted.txt"}, api_key=OPERATOR)  # approvals as the writer too
    assert held.error_code is ErrorCode.APPROVAL_REQUIRED, held.message
    await gw.approve(held.approval_id, by="admin")
    deleted = await gw.call("delete_file", {"path": "granted.txt"}, api_key=OPERATOR, approval_id=held.approval_id)
    await gw.aclose()  # its final checkpoint is stored as the writer too
    assert answered.status is Status.OK and deleted.status is Status.OK, deleted.message
    assert not (sandbox / "granted.txt").exists()
    assert refused.error_code is ErrorCode.POLICY_BLOCKED

    with psycopg.connect(as_role(pg_url, writer), autocommit=True) as conn:
        for sql, refusal in [
            ("UPDATE records SET body = 'x'::bytea", "permission denied for table records"),
            ("DELETE FROM records", "permission denied for table records"),
            ("TRUNCATE records", "permission denied for table records"),
            ("DELETE FROM record_rules", "permission denied for table record_rules"),
            ("UPDATE checkpoints SET note = ''", "permission denied for table checkpoints"),
            ("UPDATE meta SET value = 'x'", "permission denied for table meta"),
            ("UPDATE head SET size = 0", "cannot move back"),  # the one UPDATE it has, and only forward
            ("ALTER TABLE records DISABLE TRIGGER USER", "must be owner of (table|relation) records"),
            ("DROP TRIGGER records_append_only ON records", "must be owner of (table|relation) records"),
            ("ALTER TABLE head DISABLE TRIGGER head_forward", "must be owner of (table|relation) head"),
            ("CREATE TABLE records2(seq bigint)", "permission denied for schema"),
            ("UPDATE dharma_approvals.approval_events SET reason = ''", "permission denied for table approval_events"),
            ("UPDATE dharma_approvals.approval_holds SET reason = ''", "insert-only"),  # its UPDATE is for row locks only
            ("DELETE FROM dharma_approvals.approval_recorded", "permission denied for table approval_recorded"),
            ("ALTER TABLE dharma_approvals.approval_events DISABLE TRIGGER USER", "must be owner of (table|relation)"),
            ("CREATE TABLE dharma_approvals.x(n int)", "permission denied for schema"),
        ]:
            with pytest.raises(psycopg.Error, match=refusal):
                conn.execute(sql)
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (8,)  # 2 calls, a refusal, a hold, 2 approval events
        assert conn.execute("SELECT count(*) FROM dharma_approvals.approval_recorded").fetchone() == (2,)
    with psycopg.connect(as_role(pg_url, auditor), autocommit=True) as conn:
        for sql in ("INSERT INTO records(seq, hash, body) VALUES (99, '\\x00', '\\x00')",
                    "UPDATE head SET size = 9", "INSERT INTO checkpoints VALUES (9, 'n', 't')",
                    "INSERT INTO dharma_approvals.approval_recorded VALUES (1, 1, 'x')"):
            with pytest.raises(psycopg.Error, match="permission denied"):
                conn.execute(sql)
    verified = dharma("audit", "verify", "--ledger", as_role(pg_url, auditor), state_root=state_root)
    assert verified.rc == 0 and "8 records" in verified.out and "1 checkpoint(s) matched" in verified.out, verified
    queried = dharma("audit", "query", "--ledger", as_role(pg_url, auditor), "--format", "jsonl", state_root=state_root)
    assert queried.rc == 0 and len(queried.out.splitlines()) == 6  # 2 calls (their outcome rows), the refusal, the hold, 2 approval events
    with pytest.raises(psycopg.Error, match="permission denied for database"):
        psycopg.connect(as_role(pg_url, stranger)).close()  # PUBLIC lost CONNECT


def test_grant_refuses_an_owner_a_superuser_and_a_file(pg_url: str, postgres: PostgresServer, state_root: Path) -> None:
    suffix = pg_url.rsplit("/", 1)[1]
    superuser, member = f"su_{suffix}", f"member_{suffix}"
    with postgres.admin() as admin:
        admin.execute(f"CREATE ROLE {superuser} SUPERUSER LOGIN")
        admin.execute(f"CREATE ROLE {member} LOGIN IN ROLE dharma")  # a member of the tables' owner
    owner = dharma("audit", "grant", pg_url, "--writer", member, state_root=state_root)
    assert owner.rc == 2 and f"role {member} owns the ledger table" in owner.err and "member of its owner dharma" in owner.err, owner
    refused = dharma("audit", "grant", pg_url, "--reader", superuser, state_root=state_root)
    assert refused.rc == 2 and f"role {superuser} is a superuser" in refused.err, refused
    same = dharma("audit", "grant", pg_url, "--writer", "w", "--reader", "w", state_root=state_root)
    assert same.rc == 2 and "named twice" in same.err
    nothing = dharma("audit", "grant", pg_url, state_root=state_root)
    assert nothing.rc == 2 and "--writer ROLE, --reader ROLE or both" in nothing.err
    not_pg = dharma("audit", "grant", "ledger.db", "--writer", "w", state_root=state_root)
    assert not_pg.rc == 2 and "postgresql:// URL" in not_pg.err


# ---- PostgreSQL read-only, down, and back --------------------------------------------------------


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    """Poll `condition()` until true; fail naming `what` after a generous deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def failed_appends(logs: list[dict[str, Any]]) -> list[str]:
    """The errors of the gateway's failed ledger appends, as logged."""
    return [e["error"] for e in logs if e["event"] in ("ledger.decision_append_failed", "ledger.append_failed")]


async def assert_fails_closed(gw: Any, sandbox: Path, name: str, content: str | None = None) -> None:
    """A call with a side effect is refused with internal_error and the backend never ran it."""
    outcome = await gw.call("write_file", {"path": name, "content": content or name}, api_key=OPERATOR)
    assert outcome.status is Status.ERROR and outcome.error_code is ErrorCode.INTERNAL_ERROR, outcome
    assert outcome.result is None and "Traceback" not in outcome.message
    assert not (sandbox / name).exists()  # nothing was forwarded


async def test_a_read_only_postgres_fails_calls_closed_until_it_is_writable_again(
    pg_url: str, postgres: PostgresServer, sandbox: Path, policy_path: Path, open_test_gateway: OpenGateway,
    gateway_logs: list[dict[str, Any]],
) -> None:
    database = pg_url.rsplit("/", 1)[1]
    gw = await open_test_gateway(policy_path, ledger={"url": pg_url})
    acknowledged = [(await write(gw, "before.txt")).request_id]
    with postgres.admin() as admin:
        admin.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
        wait_for(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                       (database,)).fetchone() == (0,), "the ledger's sessions to end")
        for i in range(3):  # the first meets the terminated session, the next ones a read-only database
            await assert_fails_closed(gw, sandbox, f"read-only-{i}.txt")
        errors = failed_appends(gateway_logs)
        assert errors and all(e.startswith(pg_url) for e in errors), errors
        assert any("read-only transaction" in e for e in errors), errors
        admin.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = off")
    after = await write(gw, "after.txt")  # the same gateway: no restart
    assert after.status is Status.OK and (sandbox / "after.txt").exists()
    acknowledged.append(after.request_id)
    assert_intact_with(pg_url, acknowledged)


async def test_a_stopped_postgres_fails_calls_closed_and_they_resume_when_it_is_back(
    pg_url: str, postgres: PostgresServer, sandbox: Path, policy_path: Path, open_test_gateway: OpenGateway,
    gateway_logs: list[dict[str, Any]],
) -> None:
    gw = await open_test_gateway(policy_path, ledger={"url": pg_url})
    acknowledged = [(await write(gw, "before.txt")).request_id]
    postgres.stop()
    try:
        for i in range(3):
            await assert_fails_closed(gw, sandbox, f"down-{i}.txt")
    finally:
        postgres.start()
    errors = failed_appends(gateway_logs)
    assert errors and all(e.startswith(pg_url) for e in errors), errors
    assert any("cannot connect to PostgreSQL" in e and "Connection refused" in e for e in errors), errors
    after = await write(gw, "after.txt")
    assert after.status is Status.OK and (sandbox / "after.txt").exists()
    acknowledged.append(after.request_id)
    assert_intact_with(pg_url, acknowledged)


def serve_config(tmp_path: Path, policy_path: Path, ledger: dict[str, str]) -> Path:
    config = tmp_path / "dharma.yaml"
    config.write_text(yaml.safe_dump({"policy": str(policy_path), "python_path": [str(REPO)], "upstreams": [DEMO_UPSTREAM],
                                      "ledger": ledger}), encoding="utf-8")
    return config


def test_serve_and_verify_refuse_a_postgres_that_is_down(postgres: PostgresServer, tmp_path: Path, state_root: Path,
                                                         policy_path: Path) -> None:
    down = postgres.url.rsplit(":", 1)[0] + ":1/ledger"
    config = serve_config(tmp_path, policy_path, {"url": down})
    served = dharma("--config", config, "serve", "--port", "0", state_root=state_root, timeout=60)
    assert served.rc == 2 and "127.0.0.1:1/ledger: cannot connect to PostgreSQL" in served.err, served
    assert "Connection refused" in served.err
    verified = dharma("audit", "verify", "--ledger", down, state_root=state_root)
    assert verified.rc == 2 and "cannot connect to PostgreSQL" in verified.err and "Connection refused" in verified.err


@pytest.mark.parametrize("backend", BACKENDS)
def test_serve_and_verify_refuse_a_ledger_that_is_not_one(backend: str, request: pytest.FixtureRequest, tmp_path: Path,
                                                          state_root: Path, policy_path: Path) -> None:
    location = new_location(backend, request, tmp_path)
    if isinstance(location, str):
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("CREATE TABLE customers(id int)")
        ledger = {"url": location}
    else:
        location.write_text("customer list\n", encoding="utf-8")
        ledger = {"path": str(location)}
    served = dharma("--config", serve_config(tmp_path, policy_path, ledger), "serve", "--port", "0", state_root=state_root,
                    timeout=60)
    assert served.rc == 2 and f"{location} is not a Dharma karma ledger" in served.err, served
    verified = dharma("audit", "verify", "--ledger", location, state_root=state_root)
    assert verified.rc == 2 and "is not a Dharma karma ledger" in verified.err, verified
    if isinstance(location, Path):
        assert location.read_text(encoding="utf-8") == "customer list\n"  # untouched


# ---- full disk -----------------------------------------------------------------------------------


def incompressible(size: int) -> str:
    """Text of about `size` characters that neither a page nor TOAST compression shrinks much."""
    return " ".join(str(n) for n in struct.unpack(f"<{size // 11}I", os.urandom(size // 11 * 4)))


async def test_a_full_sqlite_ledger_fails_calls_closed_and_they_resume_with_space(
    sandbox: Path, policy_path: Path, open_test_gateway: OpenGateway, gateway_logs: list[dict[str, Any]],
) -> None:
    gw = await open_test_gateway(policy_path)
    acknowledged = [(await write(gw, "before.txt")).request_id]
    gw.ledger.limit_pages(1)  # the file may not grow past its size now: the disk is "full"
    for i in range(3):
        await assert_fails_closed(gw, sandbox, f"full-{i}.txt", incompressible(40_000))
    errors = failed_appends(gateway_logs)
    assert errors and all(e.startswith(str(gw.ledger.path)) for e in errors), errors
    assert all("database or disk is full" in e for e in errors), errors
    with open_reader(gw.ledger.path) as reader:
        assert verify_ledger(reader).ok  # nothing half written
    gw.ledger.limit_pages(None)  # space is back
    after = await gw.call("write_file", {"path": "after.txt", "content": incompressible(40_000)}, api_key=OPERATOR)
    assert after.status is Status.OK and (sandbox / "after.txt").exists()
    acknowledged.append(after.request_id)
    assert_intact_with(gw.ledger.path, acknowledged)


@pytest.fixture
def small_disk_url(postgres: PostgresServer, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A new database whose tables go to a tablespace on an 8 MB tmpfs (needs root to mount, as CI has)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for a PostgreSQL tablespace needs root (CI runs as root)")
    owner = pwd.getpwnam("postgres")
    disk = Path(tempfile.mkdtemp(prefix="dharma-small-disk-"))  # not under pytest's 0700 tmp: the server's user must reach it
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=8m,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}",
                              "tmpfs", str(disk)], capture_output=True, text=True, check=False)
    if mounted.returncode:
        disk.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    name = f"small_{os.getpid()}_{tmp_path.name}".replace("-", "_")[:60]
    try:
        with postgres.admin() as admin:
            admin.execute(f"CREATE TABLESPACE {name} LOCATION '{disk}'")
            admin.execute(f"CREATE DATABASE {name}")
            admin.execute(f"ALTER DATABASE {name} SET default_tablespace = {name}")
        yield f"{postgres.url}/{name}", disk
    finally:
        with postgres.admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"DROP TABLESPACE IF EXISTS {name}")
        subprocess.run(["umount", str(disk)], check=True)
        disk.rmdir()


async def test_a_full_postgres_disk_fails_calls_closed_and_they_resume_with_space(
    small_disk_url: tuple[str, Path], sandbox: Path, policy_path: Path, open_test_gateway: OpenGateway,
    gateway_logs: list[dict[str, Any]],
) -> None:
    url, disk = small_disk_url
    gw = await open_test_gateway(policy_path, ledger={"url": url})
    acknowledged = [(await write(gw, "before.txt")).request_id]
    filler = disk / "filler"
    with filler.open("wb") as fh:  # another program fills the disk the ledger's tables are on
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
    for i in range(3):
        await assert_fails_closed(gw, sandbox, f"full-{i}.txt", incompressible(100_000))
    errors = failed_appends(gateway_logs)
    assert errors and all(e.startswith(url) for e in errors), errors
    assert any("No space left on device" in e for e in errors), errors
    filler.unlink()  # space is back
    after = await gw.call("write_file", {"path": "after.txt", "content": incompressible(100_000)}, api_key=OPERATOR)
    assert after.status is Status.OK and (sandbox / "after.txt").exists()
    acknowledged.append(after.request_id)
    assert_intact_with(url, acknowledged)
