"""`/ui` logins behind several replicas without sticky routing: with `redis.url` set, two real
`dharma serve` processes share one real Redis, so a session made on one is honoured on the other,
a logout on either ends it on both, and Redis never holds the API key or the cookie's id."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import redis

from tests.ui.conftest import KEYS, serve_dharma


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text[:500]
    return found.group(1)


def test_a_login_on_one_replica_holds_on_the_other_until_a_logout_on_either(tmp_path: Path, redis_url: str) -> None:
    shared = {"redis": {"url": redis_url}}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with serve_dharma(tmp_path / "a", **shared) as a, serve_dharma(tmp_path / "b", **shared) as b:
        with httpx.Client(base_url=a.base, timeout=30) as on_a:
            logged = on_a.post("/ui/login", data={"csrf": csrf_of(on_a.get("/ui/login")), "token": KEYS["approver"]},
                               headers={"origin": a.base})
            assert logged.status_code == 303 and logged.headers["location"] == "/ui/approvals", logged.text[:500]
            cookie = on_a.cookies["dharma_ui"]
            assert on_a.get("/ui/approvals").status_code == 200

            stored = redis.Redis.from_url(redis_url)
            keys = stored.keys("dharma:ui:*")
            assert len(keys) == 1 and cookie.encode() not in keys[0]
            value = stored.get(keys[0]) or b""
            assert KEYS["approver"].encode() not in value and cookie.encode() not in value
            assert 0 < stored.pttl(keys[0]) <= 8 * 3600 * 1000  # expires with the session

            with httpx.Client(base_url=b.base, timeout=30, cookies={"dharma_ui": cookie}) as on_b:
                page = on_b.get("/ui/approvals")
                assert page.status_code == 200 and "approver" in page.text, page.text[:500]
                out = on_b.post("/ui/logout", data={"csrf": csrf_of(page)}, headers={"origin": b.base})
                assert out.status_code == 303 and out.headers["location"] == "/ui/login"

            refused = on_a.get("/ui/approvals")
            assert refused.status_code == 303 and refused.headers["location"] == "/ui/login"
            assert stored.keys("dharma:ui:*") == []
