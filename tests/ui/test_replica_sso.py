"""`Log in with SSO` behind several replicas without sticky routing: with `redis.url` set, two real
`dharma serve` processes share one real Redis and the real test provider (`oidc-provider`). A login
begun on one replica completes on the other (its `state`, `nonce` and PKCE verifier are in Redis,
under a digest of the flow id), once: the same callback replayed on the first replica is refused."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx
import redis

from tests.mcp_http.conftest import free_port
from tests.ui.conftest import serve_dharma
from tests.ui.test_oidc_login import CALLBACK, Sso, oidc_provider, to_callback


def test_an_sso_login_begun_on_one_replica_completes_on_the_other_once(tmp_path: Path, redis_url: str) -> None:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    port_a, port_b = free_port(), free_port()
    # One public callback, as behind a balancer: the provider sends every browser back to B.
    with oidc_provider(tmp_path, f"http://127.0.0.1:{port_b}{CALLBACK}") as oidc:
        shared = {"redis": {"url": redis_url}, "ui": {"oidc": oidc}}
        with serve_dharma(a_dir, server={"host": "127.0.0.1", "port": port_a}, **shared) as a, \
                serve_dharma(b_dir, server={"host": "127.0.0.1", "port": port_b}, **shared) as b:
            stored = redis.Redis.from_url(redis_url)
            with httpx.Client(timeout=30, follow_redirects=False) as browser:
                callback = to_callback(browser, Sso(a, oidc["issuer"]), "admin", back_to=b.base + CALLBACK)
                flow_id = browser.cookies["dharma_ui_oidc"]  # set by A
                keys = stored.keys("dharma:ui-oidc:*")
                assert len(keys) == 1 and flow_id.encode() not in keys[0]
                assert flow_id.encode() not in (stored.get(keys[0]) or b"")
                assert 0 < stored.pttl(keys[0]) <= 600_000  # lapses with the flow

                done = browser.get(callback)  # on B, which did not begin it
                assert done.status_code == 200 and "Logged in as <strong>admin</strong>" in done.text, done.text[:500]
                assert stored.keys("dharma:ui-oidc:*") == [], "a used flow must leave Redis"
                assert browser.get(b.base + "/ui/ledger").status_code == 200
                assert browser.get(a.base + "/ui/ledger").status_code == 200  # the session is shared as well

            # Someone holding the same callback URL and flow cookie replays it on A: refused, no session.
            with httpx.Client(timeout=30, follow_redirects=False, cookies={"dharma_ui_oidc": flow_id}) as replayer:
                replay = replayer.get(a.base + CALLBACK + "?" + urlsplit(callback).query)
                assert replay.status_code == 400 and "no SSO login is under way" in replay.text, replay.text[:500]
                assert "dharma_ui" not in replayer.cookies
                assert replayer.get(a.base + "/ui/ledger").status_code == 303
