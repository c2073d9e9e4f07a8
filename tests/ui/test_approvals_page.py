"""The approvals page in a real browser (Debian's chromium, Playwright) against a real `dharma serve`
in front of an MCP server, with the official MCP SDK client making the calls a human holds.

Each test ends by checking that the page logged no console error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright.sync_api import expect

from tests.ui.conftest import KEYS, RULES, Console, HeldCall, Served, login, refused_page, screenshot, serve_dharma, wait_for

@pytest.fixture(autouse=True)
def no_console_errors(console: Console) -> Any:
    yield
    assert console.errors() == [], console.messages


def held(served: Served, path: str) -> tuple[HeldCall, dict[str, Any]]:
    """Start alice's `delete_file(path)` and wait until the gateway holds it."""
    call = HeldCall(served.base, "delete_file", {"path": path})
    approval = wait_for(lambda: next((a for a in served.pending() if path in a["arguments_preview"]), None), what=f"{path} held")
    return call, approval


def test_a_held_call_appears_without_reload_and_approving_it_completes_the_mcp_call(served: Served, page_for: Any) -> None:
    page = page_for()
    login(page, served.base, "approver")
    expect(page).to_have_url(served.base + "/ui/approvals")
    expect(page.get_by_role("heading", name="Pending approvals")).to_be_visible()
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    call, approval = held(served, "/tmp/approve-me")
    item = page.locator(f"li.approval[data-id='{approval['id']}']")
    expect(item).to_be_visible()
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded to show the held call"
    expect(item.locator("h2")).to_contain_text("delete_file")
    expect(item.locator("h2")).to_contain_text("alice")
    expect(item.locator("pre.args")).to_contain_text('"path": "/tmp/approve-me"')
    expect(item.locator(".reasons")).to_contain_text("deleting a file needs a human")
    expect(item.locator(".reasons")).to_contain_text(re.compile(r"rule confirm-delete \(\S*rules\.yaml:\d+\)"))
    expect(item).to_contain_text(approval["policy_version"])
    expect(item.locator(".left")).to_have_text(re.compile(r"^\d+ s$"))
    screenshot(page, "approvals")

    item.get_by_label("Reason (recorded in the ledger)").fill("checked with alice")
    item.get_by_role("button", name="Approve").click()
    expect(page.locator(".flash")).to_contain_text(f"{approval['id']} (delete_file for alice): approved")
    result = call.wait()
    assert not result.is_error and result.content[0].text == "deleted /tmp/approve-me"
    events = served.audit(approval_id=approval["id"], show="records")
    decided = [r for r in events if r.get("kind") == "approval" and r.get("event") == "approved"]
    assert len(decided) == 1 and decided[0]["by"] == "approver" and decided[0]["via"] == "ui"
    assert decided[0]["reason"] == "checked with alice"
    expect(item).to_have_count(0)


def test_denying_a_held_call_answers_the_client_approval_denied(served: Served, page_for: Any) -> None:
    page = page_for()
    login(page, served.base, "admin")
    call, approval = held(served, "/tmp/deny-me")
    item = page.locator(f"li.approval[data-id='{approval['id']}']")
    item.get_by_label("Reason (recorded in the ledger)").fill("not today")
    item.get_by_role("button", name="Deny").click()
    expect(page.locator(".flash")).to_contain_text("denied")
    result = call.wait()
    assert result.is_error and result.meta["dharma.gateway/decision"]["error_code"] == "approval_denied"
    denied = [r for r in served.audit(approval_id=approval["id"], show="records") if r.get("event") == "denied"]
    assert len(denied) == 1 and denied[0]["by"] == "admin" and denied[0]["reason"] == "not today"


def test_keyboard_only_approval(served: Served, page_for: Any) -> None:
    page = page_for()
    page.goto(served.base + "/ui/login")
    page.keyboard.press("Tab")  # the skip link, then the token field (it has autofocus, so Tab may pass it)
    wait_for(lambda: page.evaluate("document.activeElement && document.activeElement.id") == "token"
             or page.keyboard.press("Tab"), what="focus on the token field")
    page.keyboard.type(KEYS["approver"])
    page.keyboard.press("Enter")
    expect(page).to_have_url(served.base + "/ui/approvals")
    call, approval = held(served, "/tmp/keyboard")
    expect(page.locator(f"li.approval[data-id='{approval['id']}']")).to_be_visible()
    reason_id = f"{approval['id']}-reason"
    for _ in range(60):
        if page.evaluate("document.activeElement.id") == reason_id:
            break
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == reason_id, "Tab never reached the reason field"
    page.keyboard.type("approved from the keyboard")
    page.keyboard.press("Tab")
    focused = page.evaluate("[document.activeElement.textContent, getComputedStyle(document.activeElement).outlineStyle,"
                            " getComputedStyle(document.activeElement).outlineWidth]")
    assert focused[0] == "Approve" and focused[1] != "none" and focused[2] != "0px", f"the focus is not visible: {focused}"
    screenshot(page, "keyboard-focus")
    page.keyboard.press("Enter")
    expect(page.locator(".flash")).to_contain_text("approved")
    assert not call.wait().is_error
    approved = [r for r in served.audit(approval_id=approval["id"], show="records") if r.get("event") == "approved"]
    assert approved and approved[0]["reason"] == "approved from the keyboard"


def test_the_ledger_filters_and_a_record_s_proof_verifies(served: Served, page_for: Any, console: Console) -> None:
    call, approval = held(served, "/tmp/for-the-ledger")
    r = httpx.post(f"{served.base}/v1/approvals/{approval['id']}:deny", headers={"X-API-Key": KEYS["approver"]}, timeout=30)
    assert r.status_code == 200
    call.wait()
    page = page_for()
    login(page, served.base, "auditor")
    expect(page).to_have_url(served.base + "/ui/overview")
    page.get_by_role("link", name="Ledger").click()
    expect(page).to_have_url(served.base + "/ui/ledger")
    expect(page.locator("#checkpoint")).to_contain_text("\n")
    page.get_by_label("Tool (glob)").fill("delete_*")
    page.get_by_label("Error code").select_option("approval_denied")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"tool=delete_(\*|%2A).*error_code=approval_denied"))
    rows = page.locator("table.records tbody tr")
    expect(rows.first).to_be_visible()
    for i in range(rows.count()):
        expect(rows.nth(i).locator("td").nth(4)).to_have_text("delete_file")
        expect(rows.nth(i).locator("td").nth(7)).to_have_text("approval_denied")
    screenshot(page, "ledger")
    rows.first.get_by_role("link").click()
    expect(page.locator("#verified")).to_contain_text("Inclusion proof verified")
    expect(page.locator("#verified")).to_have_class(re.compile(r"\bok\b"))
    expect(page.locator("pre.entry")).to_contain_text('"error_code": "approval_denied"')
    screenshot(page, "record")

    console.expect_refusal(served.base + "/ui/ledger?since=not-a-time")
    page.goto(served.base + "/ui/ledger?since=not-a-time")
    expect(page.locator("p.error")).to_contain_text("since")


def test_a_wrong_csrf_token_and_a_missing_role_are_refused(served: Served, page_for: Any, console: Console) -> None:
    page = page_for()
    login(page, served.base, "approver")
    call, approval = held(served, "/tmp/csrf")
    item = page.locator(f"li.approval[data-id='{approval['id']}']")
    expect(item).to_be_visible()
    item.locator("input[name=csrf]").evaluate("el => el.value = 'forged'")
    console.expect_refusal(f"{served.base}/ui/approvals/{approval['id']}/decide")
    item.get_by_role("button", name="Approve").click()
    expect(page.locator("p.error")).to_contain_text("CSRF token is missing or wrong")
    assert any(a["id"] == approval["id"] and a["state"] == "pending" for a in served.pending())

    # an approver may not browse the ledger
    refused_page(page, console, served.base + "/ui/ledger", "needs a principal with role admin or auditor")

    auditor = page_for()
    login(auditor, served.base, "auditor")
    refused_page(auditor, console, served.base + "/ui/approvals", "needs a principal with role admin or approver")
    csrf = auditor.locator("form.who input[name=csrf]").input_value()
    answer = auditor.request.post(f"{served.base}/ui/approvals/{approval['id']}/decide",
                                  form={"csrf": csrf, "action": "approve", "reason": "auditors cannot"},
                                  headers={"origin": served.base})
    assert answer.status == 403 and "approver" in answer.text()
    assert any(a["id"] == approval["id"] and a["state"] == "pending" for a in served.pending())

    nobody = page_for()
    console.expect_refusal(served.base + "/ui/login")
    login(nobody, served.base, "alice")
    expect(nobody.locator("#login-error")).to_contain_text("alice may not use this page")
    nobody.goto(served.base + "/ui/approvals")
    expect(nobody).to_have_url(served.base + "/ui/login")

    r = httpx.post(f"{served.base}/v1/approvals/{approval['id']}:deny", headers={"X-API-Key": KEYS["approver"]}, timeout=30)
    assert r.status_code == 200
    assert call.wait().is_error


def test_logging_out_ends_the_session(served: Served, page_for: Any) -> None:
    page = page_for()
    login(page, served.base, "admin")
    cookie = next(c for c in page.context.cookies() if c["name"] == "dharma_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(served.base + "/ui/login")
    replay = httpx.get(served.base + "/ui/policy", cookies={"dharma_ui": cookie["value"]}, follow_redirects=False, timeout=30)
    assert replay.status_code == 303 and replay.headers["location"] == "/ui/login"


def test_the_policy_page_names_each_rule_s_file_and_line(served: Served, page_for: Any) -> None:
    page = page_for()
    login(page, served.base, "auditor")
    page.get_by_role("link", name="Policy").click()
    row = page.locator("table.rules tr", has_text="confirm-delete")
    expect(row).to_contain_text("require_approval")
    expect(row.locator("td").last).to_have_text(re.compile(r"rules\.yaml:\d+$"))
    expect(page.locator("#policy-version")).not_to_be_empty()
    expect(page.locator("dl")).to_contain_text("the caller's own elicitation answer releases nothing (an approver or admin decides)")
    screenshot(page, "policy")


def test_posts_from_another_origin_or_without_the_login_token_are_refused(served: Served) -> None:
    with httpx.Client(base_url=served.base, timeout=30) as http:
        form = http.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert token is not None and form.headers["content-security-policy"].startswith("default-src 'none'")
        key = {"csrf": token.group(1), "token": KEYS["admin"]}
        assert http.post("/ui/login", data=key, headers={"origin": "http://evil.example"}).status_code == 403
        assert http.post("/ui/login", data=key).status_code == 403  # no Origin, no Sec-Fetch-Site
        assert http.post("/ui/login", data={**key, "csrf": "forged"}, headers={"origin": served.base}).status_code == 403
        logged = http.post("/ui/login", data=key, headers={"origin": served.base})
        assert logged.status_code == 303 and "dharma_ui" in http.cookies
        assert "admin-key" not in http.get("/ui/approvals").text
        with http.stream("GET", "/ui/approvals/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.iter_lines()
            assert next(lines) == "retry: 2000"
            assert next(line for line in lines if line.startswith("event:")) == "event: pending"


def test_a_broken_reload_shows_on_the_policy_page_while_the_last_good_policy_serves(tmp_path: Path, page_for: Any) -> None:
    """Live reload's third place to say why (after the log and /healthz): the page names the
    failed reload and the rule's file:line, and still shows the last good version."""
    with serve_dharma(tmp_path) as gateway:
        admin = {"X-API-Key": KEYS["admin"]}
        good = httpx.get(gateway.base + "/healthz", timeout=30).json()["policy_version"]
        broken = {**RULES, "rules": [*RULES["rules"], {"id": "broken", "tools": ["*"], "when": "(((", "effect": "deny"}]}
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(broken, sort_keys=False), encoding="utf-8")
        answer = httpx.post(gateway.base + "/v1/admin/reload", headers=admin, timeout=60)
        assert answer.status_code == 422 and answer.json()["reload"]["ok"] is False, answer.text
        page = page_for()
        login(page, gateway.base, "auditor")
        page.goto(gateway.base + "/ui/policy")
        alert = page.locator("#reload-error")
        expect(alert).to_contain_text("failed")
        expect(alert).to_contain_text(re.compile(r"rules\.yaml:\d+"))
        expect(page.locator("#policy-version")).to_have_text(good)
        screenshot(page, "policy-degraded")
