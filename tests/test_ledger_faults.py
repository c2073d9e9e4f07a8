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

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import structlog
import yaml
from structlog.testing import capture_logs

from audit.query import query_records
from audit.verify import verify_ledger
from gateway.core.call import Status
from gateway.core.errors import ErrorCode
from tests.audit.conftest import BACKENDS, Location, new_location, open_reader, postgres  # noqa: F401  (fixture)
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
def gateway_logs() -> Iterator[list[dict[str, Any]]]:
    """Every structlog event, whatever level an earlier test configured."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG), cache_logger_on_first_use=False)
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**saved)


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
    await gw.aclose()  # its final checkpoint is stored as the writer too
    assert answered.status is Status.OK and (sandbox / "granted.txt").read_text() == "granted.txt"
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
        ]:
            with pytest.raises(psycopg.Error, match=refusal):
                conn.execute(sql)
        assert conn.execute("SELECT count(*) FROM records").fetchone() == (3,)  # decision, outcome, refusal
    with psycopg.connect(as_role(pg_url, auditor), autocommit=True) as conn:
        for sql in ("INSERT INTO records(seq, hash, body) VALUES (99, '\\x00', '\\x00')",
                    "UPDATE head SET size = 9", "INSERT INTO checkpoints VALUES (9, 'n', 't')"):
            with pytest.raises(psycopg.Error, match="permission denied"):
                conn.execute(sql)
    verified = dharma("audit", "verify", "--ledger", as_role(pg_url, auditor), state_root=state_root)
    assert verified.rc == 0 and "3 records" in verified.out and "1 checkpoint(s) matched" in verified.out, verified
    queried = dharma("audit", "query", "--ledger", as_role(pg_url, auditor), "--format", "jsonl", state_root=state_root)
    assert queried.rc == 0 and len(queried.out.splitlines()) == 2  # the call (its outcome row) and the refusal
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
