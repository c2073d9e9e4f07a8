"""The ledger's per-commit debug line: written exactly when debug logging is on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import audit.sqlite
from audit.sqlite import SqliteLedger
from gateway.logging import configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.parametrize(("level", "logged"), [("warning", False), ("debug", True)])
async def test_ledger_commits_log_at_debug_exactly_when_debug_is_on(
    tmp_path: Path, restore_logging, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], level: str,
    logged: bool,
):
    configure_logging(level)
    monkeypatch.setattr(audit.sqlite, "log", structlog.get_logger())  # a proxy not yet settled by earlier tests
    ledger = await SqliteLedger.open(tmp_path / "l.db")
    try:
        for i in range(3):
            await ledger.append({"i": i})
    finally:
        await ledger.aclose()
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    commits = [e for e in events if e["event"] == "ledger.batch_committed"]
    if logged:
        assert any(e["event"] == "ledger.opened" for e in events)
        assert sum(e["count"] for e in commits) == 3 and all(e["level"] == "debug" for e in commits)
    else:
        assert commits == []
