"""`Log in with SSO` on the approvals page, against a real OpenID Connect provider: the npm package
`oidc-provider` (pinned, installed into the test cache like the reference MCP servers) in front of a
real `dharma serve`. The happy path runs in chromium (Playwright); the refusals are driven with
httpx through the same provider. The ID-token checks no conforming provider fails on purpose
(wrong audience, expired, nonce, `azp`) are in test_oidc_checks.py."""

from __future__ import annotations

import html
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
import pytest

from tests.mcp.conftest import CACHE, npm_install
from tests.mcp_http.conftest import free_port, spawn
from tests.ui.conftest import Console, Served, screenshot, serve_dharma

OIDC_PROVIDER = {"oidc-provider": "9.13.3"}
PROVIDER_SCRIPT = Path(__file__).resolve().parent / "oidc_provider.mjs"
CLIENT_SECRET = "test-client-secret-6d1f0a9c"
CALLBACK = "/ui/oidc/callback"


@dataclass
class Sso:
    """A gateway whose /ui logs in through a running OpenID Connect provider."""

    served: Served
    issuer: str

    @property
    def base(self) -> str:
        return self.served.base

    def log(self) -> str:
        return (self.served.directory / "gw.log").read_text(encoding="utf-8", errors="replace")


@contextmanager
def oidc_provider(d: Path, redirect: str) -> Iterator[dict[str, Any]]:
    """The test provider, running with one client whose callback is `redirect`; the `ui.oidc` block
    of a gateway in `d` that logs in through it (its secret in `d/client-secret`)."""
    node = npm_install(OIDC_PROVIDER, "the test OpenID Connect provider")
    script = CACHE / PROVIDER_SCRIPT.name  # beside node_modules, where an ES module finds its imports
    shutil.copyfile(PROVIDER_SCRIPT, script)
    (d / "client-secret").write_text(CLIENT_SECRET + "\n")
    with spawn([str(node), str(script), str(free_port()), redirect, CLIENT_SECRET, str(d / "idp.url")], d / "idp.url",
               timeout=90) as (issuer, _):
        yield {"issuer": issuer, "client_id": "dharma-ui", "client_secret_file": str(d / "client-secret"),
               "redirect_url": redirect, "scopes": ["openid"]}


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sso]:
    d = tmp_path_factory.mktemp("ui-oidc")
    port = free_port()
    with oidc_provider(d, f"http://127.0.0.1:{port}{CALLBACK}") as oidc, \
            serve_dharma(d, server={"host": "127.0.0.1", "port": port}, ui={"oidc": oidc}) as served:
        yield Sso(served, oidc["issuer"])


def to_callback(http: httpx.Client, sso: Sso, user: str, back_to: str | None = None) -> str:
    """Begin an SSO login in `http`'s cookie jar and sign in at the provider as `user`; the callback
    URL the provider sends the browser back to (not yet visited; at `back_to`, else this gateway)."""
    url = sso.base + "/ui/oidc/login"
    for _ in range(10):
        r = http.get(url)
        if r.status_code in (302, 303):
            url = urljoin(url, r.headers["location"])
            if url.startswith(back_to or sso.base + CALLBACK):
                return url
            continue
        action = re.search(r'<form method="post" action="([^"]+)"', r.text)
        assert r.status_code == 200 and action is not None, f"unexpected answer from {url}: {r.status_code} {r.text[:300]}"
        r = http.post(urljoin(url, action.group(1)), data={"user": user})
        assert r.status_code in (302, 303), r.text[:300]
        url = urljoin(str(r.url), r.headers["location"])
    raise AssertionError("the provider never sent the browser back")


def with_params(url: str, **changes: str | None) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update({k: v for k, v in changes.items() if v is not None})
    for k in [k for k, v in changes.items() if v is None]:
        query.pop(k, None)
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query)}"


def client() -> httpx.Client:
    return httpx.Client(timeout=30, follow_redirects=False)


# ---- the happy path, in a real browser ---------------------------------------------------------


def test_log_in_with_sso_in_chromium_reaches_the_approvals_page(sso: Sso, page_for: Any, console: Console) -> None:
    from playwright.sync_api import expect

    console.expect_refusal(sso.issuer + "/favicon.ico")  # the test provider's page has no icon
    page = page_for()
    page.goto(sso.base + "/ui/login")
    page.get_by_role("link", name="Log in with SSO").click()
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    assert page.url.startswith(sso.issuer + "/interaction/")
    page.get_by_label("User").fill("approver")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(sso.base + "/ui/approvals")
    expect(page.locator("header .who")).to_contain_text("approver")
    expect(page.get_by_role("heading", name="Pending approvals")).to_be_visible()
    cookies = {c["name"]: c for c in page.context.cookies(sso.base)}
    assert cookies["dharma_ui"]["httpOnly"] and cookies["dharma_ui"]["sameSite"] == "Strict"
    assert "dharma_ui_oidc" not in cookies, "the flow cookie outlived the login"
    screenshot(page, "sso-login")
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(sso.base + "/ui/login")
    assert console.errors() == []


# ---- refusals, through the real provider ---------------------------------------------------------


def test_a_code_is_used_once_and_a_callback_cannot_be_replayed(sso: Sso) -> None:
    with client() as http:
        callback = to_callback(http, sso, "admin")
        done = http.get(callback)
        assert done.status_code == 200 and "Logged in as <strong>admin</strong>" in done.text
        assert "dharma_ui" in http.cookies
        assert http.get(sso.base + "/ui/ledger").status_code == 200
        replay = http.get(callback)
        assert replay.status_code == 400 and "no SSO login is under way" in replay.text
        # The same code under a fresh login of this browser: the provider refuses it.
        fresh = to_callback(http, sso, "admin")
        code = parse_qs(urlsplit(callback).query)["code"][0]
        again = http.get(with_params(fresh, code=code))
        assert again.status_code == 401 and "refused the code: invalid_grant" in again.text


@pytest.mark.parametrize("state", [None, "forged-state"])
def test_a_missing_or_wrong_state_is_refused(sso: Sso, state: str | None) -> None:
    with client() as http:
        callback = to_callback(http, sso, "admin")
        answer = http.get(with_params(callback, state=state))
        assert answer.status_code == 400 and "dharma_ui" not in http.cookies
        assert ("has no `state`" if state is None else "does not match the login this browser began") in answer.text
        assert http.get(callback).status_code == 400, "a refused callback must use the login up"


def test_a_callback_in_another_browser_is_refused(sso: Sso) -> None:
    with client() as http:
        callback = to_callback(http, sso, "admin")
    with client() as other:
        answer = other.get(callback)
        assert answer.status_code == 400 and "no SSO login is under way in this browser" in answer.text
        assert "dharma_ui" not in other.cookies


@pytest.mark.parametrize(("user", "reason"), [("alice", "alice may not use this page: it needs role approver"),
                                              ("mallory", "'mallory' is not a principal of this gateway's policy")])
def test_a_principal_without_a_ui_role_is_refused(sso: Sso, user: str, reason: str) -> None:
    with client() as http:
        answer = http.get(to_callback(http, sso, user))
        assert answer.status_code == 403 and reason in html.unescape(answer.text) and "dharma_ui" not in http.cookies
        assert http.get(sso.base + "/ui/policy").status_code == 303, "no session may be left behind"


def test_an_error_from_the_provider_is_shown_and_the_log_holds_no_secret(sso: Sso) -> None:
    with client() as http:
        callback = to_callback(http, sso, "admin")
        answer = http.get(sso.base + CALLBACK + "?" + urlencode({"error": "access_denied", "error_description": "user said no",
                                                                 "state": parse_qs(urlsplit(callback).query)["state"][0]}))
        assert answer.status_code == 401 and "did not log you in: access_denied (user said no)" in answer.text
    log = sso.log()
    assert "ui.oidc_refused" in log and "access_denied" in log
    code = parse_qs(urlsplit(callback).query)["code"][0]
    for secret in (CLIENT_SECRET, code, parse_qs(urlsplit(callback).query)["state"][0]):
        assert secret not in log


def test_the_login_page_offers_sso_only_when_configured(sso: Sso, served: Served) -> None:
    assert "Log in with SSO" in httpx.get(sso.base + "/ui/login").text
    assert "Log in with SSO" not in httpx.get(served.base + "/ui/login").text
    assert httpx.get(served.base + "/ui/oidc/login").status_code == 404
