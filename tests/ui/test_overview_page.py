"""The overview page in a real browser (Debian's chromium, Playwright) against a real `dharma serve`
in front of an MCP server: the official MCP SDK client makes calls that are allowed, refused by a
rule, refused by the tier gate and held for a human; the page must show exactly those figures, in
its totals and in the SVG the charts are drawn with. Then "Verify now" verifies the ledger."""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import pytest
from playwright.sync_api import expect

from tests.mcp_http.conftest import client
from tests.ui.conftest import (KEYS, RULES, Console, HeldCall, Served, login, refused_page, screenshot, serve_dharma,
                               wait_for)

OVERVIEW_RULES = copy.deepcopy(RULES)
OVERVIEW_RULES["rules"].append({
    "id": "no-forbidden-echo", "description": "Nobody echoes the forbidden word.", "tools": ["echo"],
    "when": 'args.message.contains("forbidden")', "effect": "deny", "message": "that word may not be echoed",
})


def off_the_browser_loop(run: Callable[[], Awaitable[None]]) -> None:
    """`anyio.run(run)` in a thread of its own: Playwright's sync API keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(anyio.run, run).result()


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, Any]]]:
    """A gateway that served the calls below, and what the page must count of them."""
    with serve_dharma(tmp_path_factory.mktemp("overview"), rules=OVERVIEW_RULES) as served:
        made: list[tuple[str, str, dict[str, Any], bool]] = [
            *[("alice", "echo", {"message": f"hello {i}"}, True) for i in range(4)],
            *[("alice", "echo", {"message": f"forbidden {i}"}, False) for i in range(3)],
            ("approver", "echo", {"message": "forbidden too"}, False),
            *[("alice", "admin_reset", {}, False) for _ in range(2)],  # no tier grants it: refused, unseen
        ]

        async def run() -> None:
            for who, tool, arguments, allowed in made:
                async with client(served.base + "/mcp", KEYS[who], mode="legacy") as c:
                    result = await c.call_tool(tool, arguments)
                    assert result.is_error is not allowed, (who, tool, result)

        off_the_browser_loop(run)
        held = HeldCall(served.base, "delete_file", {"path": "/tmp/overview"})
        approval = wait_for(lambda: next(iter(served.pending()), None), what="the delete held")
        r = httpx.post(f"{served.base}/v1/approvals/{approval['id']}:approve", headers={"X-API-Key": KEYS["approver"]}, timeout=30)
        assert r.status_code == 200, r.text
        assert not held.wait().is_error
        refused = [(who, tool) for who, tool, _, allowed in made if not allowed]
        expected = {
            "calls": len(made) + 1, "ok": sum(allowed for *_, allowed in made) + 1, "refused": len(refused), "held": 1,
            "principals": Counter(who for who, _ in refused), "tools": Counter(tool for _, tool in refused),
            "rules": Counter({"no-forbidden-echo": sum(a.get("message", "").startswith("forbidden") for *_, a, _ in made),
                              "confirm-delete": 1}),
        }
        yield served, expected


@pytest.fixture(autouse=True)
def no_console_errors(console: Console) -> Any:
    yield
    assert console.errors() == [], console.messages


def svg_sum(page: Any, selector: str) -> float:
    return float(page.evaluate(f"[...document.querySelectorAll({selector!r})].reduce((s, e) => s + Number(e.dataset.value), 0)"))


def bar_rows(page: Any, chart: str) -> dict[str, int]:
    rows = page.evaluate(f"[...document.querySelectorAll('#{chart} g.row')].map(g => [g.dataset.label, Number(g.dataset.value)])")
    return dict(rows)


def test_the_auditor_lands_on_the_overview_and_it_counts_the_calls_made(traffic: tuple[Served, dict[str, Any]],
                                                                        page_for: Any) -> None:
    served, want = traffic
    page = page_for()
    login(page, served.base, "auditor")
    expect(page).to_have_url(served.base + "/ui/overview")
    expect(page.get_by_role("link", name="Overview")).to_have_attribute("aria-current", "page")
    page.get_by_role("link", name="1h", exact=True).click()
    expect(page).to_have_url(served.base + "/ui/overview?range=1h")
    totals = page.locator("#totals")
    for name in ("calls", "ok", "refused", "held"):
        expect(totals.locator(f"dd[data-total={name}]")).to_have_text(str(want[name]))
    expect(totals.locator("dd[data-total=errors]")).to_have_text("0")
    expect(totals.locator("dd[data-total=latency]")).to_have_text(re.compile(r"^\d[\d,.]* ms / \d[\d,.]* ms$"))

    assert svg_sum(page, "#chart-calls rect.bar.allowed") == want["ok"]
    assert svg_sum(page, "#chart-calls rect.bar.refused") == want["refused"]
    assert svg_sum(page, "#chart-held rect.bar.held") == want["held"]
    assert bar_rows(page, "chart-principals") == dict(want["principals"])
    assert bar_rows(page, "chart-tools") == dict(want["tools"])
    assert bar_rows(page, "chart-rules") == dict(want["rules"])
    p50 = page.locator("#chart-latency circle.p50")
    assert p50.count() >= 1 and page.locator("#chart-latency circle.p99").count() == p50.count()
    assert svg_sum(page, "#chart-latency circle.p99") >= svg_sum(page, "#chart-latency circle.p50") > 0

    for chart in ("calls", "held", "latency", "rules", "principals", "tools"):  # a name a screen reader announces
        svg = page.locator(f"#chart-{chart}")
        expect(svg).to_have_attribute("role", "img")
        assert page.locator(f"#chart-{chart}-title").text_content(), chart
    expect(page.locator("#chart-calls text.axis-label").first).to_have_text(re.compile(r"calls per 1 min"))
    expect(page.locator("#chart-calls-desc")).to_contain_text(f"{want['calls']} calls, {want['refused']} refused")
    expect(page.locator("#ledger-size")).to_have_text(re.compile(r"^\d+$"))
    assert int(page.locator("#ledger-size").text_content() or 0) >= want["calls"] + want["held"]
    expect(page.locator("#last-verify")).to_contain_text("never")
    screenshot(page, "overview")


def test_verify_now_records_its_result_and_the_page_shows_it(traffic: tuple[Served, dict[str, Any]], page_for: Any) -> None:
    served, _ = traffic
    page = page_for()
    login(page, served.base, "admin")
    page.get_by_role("link", name="Overview").click()
    page.get_by_role("button", name="Verify now").click()
    expect(page.locator(".flash")).to_contain_text(re.compile(r"Verified: \d+ records intact"))
    expect(page.locator("#last-verify .verify.ok")).to_have_text("OK")
    expect(page.locator("#last-verify")).to_contain_text("by admin via this page")
    log = served.directory / "state" / "ledger.db.last-verify.json"
    assert log.is_file() and '"ok":true' in log.read_text().replace(" ", "")


def test_the_overview_refuses_approvers_a_bad_range_and_a_forged_verify(traffic: tuple[Served, dict[str, Any]],
                                                                        page_for: Any, console: Console) -> None:
    served, _ = traffic
    page = page_for()
    login(page, served.base, "approver")
    expect(page.get_by_role("link", name="Overview")).to_have_count(0)
    refused_page(page, console, served.base + "/ui/overview", "the overview needs a principal with role admin or auditor")

    auditor = page_for()
    login(auditor, served.base, "auditor")
    refused_page(auditor, console, served.base + "/ui/overview?range=1y", "range '1y' is not one of: 1h, 6h, 24h, 7d, 30d")
    answer = auditor.request.post(served.base + "/ui/overview/verify", form={"csrf": "forged", "range": "1h"},
                                  headers={"origin": served.base})
    assert answer.status == 403 and "CSRF" in answer.text()


def test_on_a_postgresql_ledger_the_overview_counts_and_verify_now_is_kept_in_the_state_root(
        tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> None:
    """The same page over a PostgreSQL ledger (a real server, tests/pg.py), read with a plain HTTP client."""
    with serve_dharma(tmp_path_factory.mktemp("overview-pg"), rules=OVERVIEW_RULES, ledger={"url": postgres_url}) as served:
        async def run() -> None:
            async with client(served.base + "/mcp", KEYS["alice"], mode="legacy") as c:
                for message in ("hello", "forbidden", "hello again"):
                    await c.call_tool("echo", {"message": message})

        off_the_browser_loop(run)
        with httpx.Client(base_url=served.base, timeout=60) as http:
            http.get("/ui/login")
            login_form = {"csrf": http.cookies["dharma_ui_login"], "token": KEYS["auditor"]}
            assert http.post("/ui/login", data=login_form, headers={"origin": served.base}).headers["location"] == "/ui/overview"
            html = http.get("/ui/overview", params={"range": "1h"}).text
            for name, value in (("calls", 3), ("ok", 2), ("refused", 1), ("held", 0)):
                assert f'<dd data-total="{name}">{value}</dd>' in html, name
            assert 'data-label="no-forbidden-echo" data-value="1"' in html
            csrf = re.search(r'name="csrf" value="([^"]+)"', html)
            assert csrf is not None
            done = http.post("/ui/overview/verify", data={"csrf": csrf.group(1), "range": "1h"}, headers={"origin": served.base})
            assert done.status_code == 303, done.text
            assert "OK</span>" in http.get("/ui/overview").text
        kept = list((served.directory / "state").glob("ledger-*.last-verify.json"))
        assert len(kept) == 1 and '"ok":true' in kept[0].read_text().replace(" ", "")
        assert "@" not in kept[0].name and postgres_url.rsplit("/", 1)[-1] not in kept[0].name
