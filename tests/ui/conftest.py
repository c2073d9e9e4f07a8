"""Fixtures for the approvals page: a real `dharma serve` process in front of the toy MCP server
(official SDK), Debian's chromium driven by Playwright (never a downloaded browser), the official
MCP SDK client making the calls a human holds, and a directory for screenshots."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from tests.conftest import REPO, key_digest
from tests.mcp_http.conftest import client, free_port, spawn

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
TOY = REPO / "tests" / "mcp_http" / "toy_server.py"
KEYS = {"alice": "alice-key-0123456789", "approver": "approver-key-0123456789", "auditor": "auditor-key-0123456789",
        "admin": "admin-key-0123456789"}
DOCS_SCREENSHOTS = ("approvals",)
"""Screenshots `UI_DOCS_SCREENSHOT=1` copies to docs/img (the overview's comes from examples/overview_screenshot.py)."""
WAIT_MS = 30_000
"""How long the browser waits for a condition (the CI machine is slow and shared)."""

PROFILE: dict[str, Any] = {
    "apiVersion": "dharma/v1",
    "kind": "Policy",
    "metadata": {"name": "ui-test"},
    "principals": [
        {"id": "alice", "api_key_sha256": key_digest(KEYS["alice"]), "tier": "user"},
        {"id": "approver", "api_key_sha256": key_digest(KEYS["approver"]), "tier": "user", "roles": ["approver"]},
        {"id": "auditor", "api_key_sha256": key_digest(KEYS["auditor"]), "tier": "user", "roles": ["auditor"]},
        {"id": "admin", "api_key_sha256": key_digest(KEYS["admin"]), "tier": "admin", "roles": ["admin"]},
    ],
    "tiers": [{"name": "user", "grants": [{"tools": ["echo", "delete_*"]}]}, {"name": "admin", "grants": [{"tools": ["*"]}]}],
    "rule_sets": ["rules.yaml"],
}
RULES: dict[str, Any] = {
    "apiVersion": "dharma/v1",
    "kind": "RuleSet",
    "metadata": {"name": "ui-test-rules"},
    "rules": [{"id": "confirm-delete", "description": "Deleting needs a human.", "tools": ["delete_*"],
               "effect": "require_approval", "message": "deleting a file needs a human"}],
}


def artifacts_dir() -> Path:
    """Where screenshots go: $DHARMA_TEST_ARTIFACTS, else tests/artifacts (git-ignored)."""
    d = Path(os.environ.get("DHARMA_TEST_ARTIFACTS") or REPO / "tests" / "artifacts") / "ui"
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass
class Served:
    """A running `dharma serve`: its base URL and the tool API's view of the ledger."""

    base: str
    directory: Path

    def audit(self, **params: str) -> list[dict[str, Any]]:
        r = httpx.get(self.base + "/v1/audit/records", params=params, headers={"X-API-Key": KEYS["admin"]}, timeout=30)
        r.raise_for_status()
        return list(r.json()["records"])

    def pending(self) -> list[dict[str, Any]]:
        r = httpx.get(self.base + "/v1/approvals", headers={"X-API-Key": KEYS["admin"]}, timeout=30)
        r.raise_for_status()
        return list(r.json()["approvals"])


@contextlib.contextmanager
def serve_dharma(d: Path, rules: dict[str, Any] | None = None, **config: Any) -> Iterator[Served]:
    """A real `dharma serve` process (the test profile, `rules` for its rule set, `config` added to its
    dharma.yaml) in front of the toy MCP server (official SDK), until the block ends."""
    (d / "rules.yaml").write_text(yaml.safe_dump(rules or RULES, sort_keys=False), encoding="utf-8")
    (d / "profile.yaml").write_text(yaml.safe_dump(PROFILE, sort_keys=False), encoding="utf-8")
    with spawn([sys.executable, str(TOY), "--url-file", str(d / "toy.url")], d / "toy.url") as (toy, _):
        port = free_port()
        config = {"policy": "profile.yaml", "state_root": str(d / "state"), "server": {"host": "127.0.0.1", "port": port},
                  "upstreams": [{"id": "toy", "type": "mcp_http", "url": toy}], "mcp": {"hold_seconds": 300}, **config}
        (d / "dharma.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        base = f"http://127.0.0.1:{config['server']['port']}"
        # `spawn` waits for a URL file: a shell writes it once /healthz answers.
        script = (f'"{sys.executable}" -m gateway serve --config "{d / "dharma.yaml"}" & pid=$!\n'
                  f'"{sys.executable}" -c "import httpx, time, sys\n'
                  f'for _ in range(1200):\n'
                  f'    try:\n'
                  f'        httpx.get(\'{base}/healthz\').raise_for_status(); break\n'
                  f'    except Exception: time.sleep(0.05)\n'
                  f'else: sys.exit(1)" && echo {base} > "{d / "gw.url"}"\nwait $pid\n')
        (d / "serve.sh").write_text(script)
        with spawn(["bash", str(d / "serve.sh")], d / "gw.url", timeout=90) as (url, _):
            yield Served(url, d)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_dharma(tmp_path_factory.mktemp("ui")) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium; .ci/run does it)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Console:
    """Every console message and page error of a page, to assert that none is an error."""

    messages: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def expect_refusal(self, url: str) -> None:
        """A test is about to be refused at `url` on purpose: chromium logs the 4xx as a console error."""
        self.refusals.append(url)

    def errors(self) -> list[str]:
        def expected(m: str) -> bool:
            return "Failed to load resource: the server responded with a status of 4" in m and any(
                m.endswith(f"({url})") for url in self.refusals)

        return [m for m in self.messages if m.startswith(("error:", "pageerror:")) and not expected(m)]


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page_for(browser: Any, console: Console) -> Iterator[Any]:
    """`page_for()` opens a fresh browser context (its own cookies) and page, with console capture."""
    contexts: list[Any] = []

    def open_page() -> Any:
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("console", lambda m: console.messages.append(f"{m.type}: {m.text} ({m.location.get('url', '')})"))
        page.on("pageerror", lambda e: console.messages.append(f"pageerror: {e}"))
        return page

    yield open_page
    for context in contexts:
        context.close()


def login(page: Any, base: str, who: str) -> None:
    """Log in through the form, as a person would."""
    page.goto(base + "/ui/login")
    page.get_by_label("API key or bearer token").fill(KEYS[who])
    page.get_by_role("button", name="Log in").click()


def refused_page(page: Any, console: Console, url: str, says: str) -> None:
    """Open `url`, which the page must refuse (the 4xx is expected in the console) with an error saying `says`."""
    from playwright.sync_api import expect

    console.expect_refusal(url)
    page.goto(url)
    expect(page.locator("p.error")).to_contain_text(says)


def screenshot(page: Any, name: str) -> Path:
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    if name in DOCS_SCREENSHOTS and os.environ.get("UI_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(path, REPO / "docs" / "img" / f"{name}.png")
    return path


class HeldCall:
    """An MCP `tools/call` made by alice with the official SDK client in a thread of its own; it is
    held for approval until a human decides."""

    def __init__(self, base: str, tool: str, arguments: dict[str, Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(base + "/mcp", tool, arguments), daemon=True)
        self._thread.start()

    def _run(self, url: str, tool: str, arguments: dict[str, Any]) -> None:
        async def call() -> Any:
            async with client(url, KEYS["alice"], mode="legacy") as c:
                return await c.call_tool(tool, arguments)

        try:
            self.result = anyio.run(call)
        except BaseException as exc:  # reported by `wait`
            self.error = exc

    def wait(self, seconds: float = 60.0) -> Any:
        self._thread.join(seconds)
        assert not self._thread.is_alive(), f"the held call did not finish within {seconds}s"
        if self.error is not None:
            raise self.error
        return self.result


def wait_for(condition: Any, seconds: float = 30.0, what: str = "condition") -> Any:
    """Poll `condition()` until it returns something truthy (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + seconds
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)

