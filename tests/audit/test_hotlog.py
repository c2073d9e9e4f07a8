"""`audit.hotlog.settle`: the settled logger of a lazy structlog proxy, and the per-call debug
lines (ledger commits, `call.decided`) that it lets the hot path skip only while debug is off."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import audit.sqlite
from audit.hotlog import settle
from audit.sqlite import SqliteLedger
from gateway.logging import configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


def test_a_cached_proxy_settles_on_its_logger_and_says_whether_debug_is_dropped(restore_logging):
    configure_logging("warning")
    proxy = structlog.get_logger()
    logger, quiet = settle(proxy)
    assert quiet is True and logger is proxy.bind()  # the very logger every later call through the proxy gets
    configure_logging("debug")
    proxy = structlog.get_logger()
    logger, quiet = settle(proxy)
    assert quiet is False and logger is proxy.bind()


def test_without_caching_the_proxy_is_kept_and_nothing_is_assumed(restore_logging):
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING), cache_logger_on_first_use=False)
    proxy = structlog.get_logger()
    assert settle(proxy) == (proxy, False)
    bound = structlog.make_filtering_bound_logger(logging.WARNING)(None, [], {})  # no proxy: bind() copies it
    assert settle(bound) == (bound, False)


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
