"""Logging in to the approvals page with a bearer JWT, where `dharma serve` is configured for JWTs:
the token is checked exactly as on /mcp (issuer, audience, expiry, signature), names a principal of
the policy, and the session ends when the token would have expired."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.test_http_auth import DEFAULT_JWKS, ISSUER, RESOURCE, claims, token
from tests.ui.conftest import Served, serve_dharma


@pytest.fixture(scope="module")
def jwt_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("ui-jwt")
    (d / "jwks.json").write_text(json.dumps(DEFAULT_JWKS))
    with serve_dharma(d, auth={"resource_url": RESOURCE, "jwt": {"jwks": "jwks.json", "issuer": ISSUER}}) as gateway:
        yield gateway


def login(http: httpx.Client, base: str, credential: str) -> httpx.Response:
    form = http.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    return http.post("/ui/login", data={"csrf": csrf.group(1), "token": credential}, headers={"origin": base})


def test_a_valid_jwt_naming_an_auditor_logs_in_and_the_session_ends_with_the_token(jwt_served: Served) -> None:
    expires = int(time.time()) + 120
    with httpx.Client(base_url=jwt_served.base, timeout=30) as http:
        answer = login(http, jwt_served.base, token(claims(sub="auditor", exp=expires)))
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/overview"
        cookie = next(c for c in http.cookies.jar if c.name == "dharma_ui")
        assert cookie.expires is not None and cookie.expires <= expires + 1
        ledger = http.get("/ui/ledger")
        assert ledger.status_code == 200 and "auditor" in ledger.text and "Current checkpoint" in ledger.text


@pytest.mark.parametrize("bad", ["wrong_issuer", "expired", "no_role"])
def test_a_bad_jwt_or_one_without_a_role_is_refused(jwt_served: Served, bad: str) -> None:
    body = {"wrong_issuer": claims(sub="admin", iss="https://evil.example"),
            "expired": claims(sub="admin", exp=int(time.time()) - 600),
            "no_role": claims(sub="alice")}[bad]
    with httpx.Client(base_url=jwt_served.base, timeout=30) as http:
        answer = login(http, jwt_served.base, token(body))
        assert answer.status_code in (401, 403) and "dharma_ui" not in http.cookies
        assert ("may not use this page" if bad == "no_role" else "Not logged in") in answer.text
